//! The operator's PKI, without I/O: its own CA, one short-lived key pair per identity, and the
//! decisions of when to issue, stage, promote and drop. The controller
//! ([`crate::controller::pki`]) only reads the two Secrets by name, calls in here with the
//! time, and applies what comes back.
//!
//! ```text
//! Secret kvroute-ca (operator namespace)         Secret kvroute-mtls (each workload namespace)
//!   ca.crt/ca.key      signing CA                  <identity>.crt/.key  one pair per identity
//!   next.crt/next.key  staged CA (overlap)         ca.crt               trust bundle
//!   previous.crt       retired CA, until expiry    admin-token          router admin token
//!
//! ca_step(now, CaSet)          -> Keep | Create | StageNext | PromoteNext | DropPrevious
//! plan_mtls(now, data, wanted) -> which identities to (re)issue and why; when to look again
//! render_mtls(..)              -> the Secret's new data: due pairs replaced, the rest kept
//! ```
//!
//! Rotation of the CA keeps every peer able to verify every other: a new CA is first only
//! *trusted* (added to every bundle) for `ca_overlap`, then it starts signing while the old
//! one stays in the bundle until it expires. Leaves are renewed at two thirds of their life
//! and never outlive the CA that signed them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::RngCore as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

/// Secret holding the CA, in the operator's namespace.
pub const CA_SECRET: &str = "kvroute-ca";
/// Secret holding every identity's key pair, one per workload namespace.
pub const MTLS_SECRET: &str = "kvroute-mtls";
/// Trust bundle key of [`MTLS_SECRET`] (and the name pods see it under).
pub const CA_BUNDLE_KEY: &str = "ca.crt";
/// The router's admin bearer token in [`MTLS_SECRET`].
pub const ADMIN_TOKEN_KEY: &str = "admin-token";
/// Signing CA certificate in [`CA_SECRET`].
pub const CA_CERT_KEY: &str = "ca.crt";
/// Signing CA key in [`CA_SECRET`].
pub const CA_KEY_KEY: &str = "ca.key";
/// Staged CA certificate in [`CA_SECRET`] (trusted, not yet signing).
pub const NEXT_CERT_KEY: &str = "next.crt";
/// Staged CA key in [`CA_SECRET`].
pub const NEXT_KEY_KEY: &str = "next.key";
/// Retired CA certificate in [`CA_SECRET`] (still trusted until it expires).
pub const PREVIOUS_CERT_KEY: &str = "previous.crt";
/// SPIFFE trust domain of every identity.
pub const TRUST_DOMAIN: &str = "kvroute.dev";
/// Key stem of the router's pair.
pub const ROUTER_IDENTITY: &str = "router";

/// URI SAN of a WorkerSet's sidecars.
pub fn sidecar_uri(namespace: &str, workerset: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{namespace}/workerset/{workerset}")
}

/// URI SAN of the routers serving a pool.
pub fn router_uri(namespace: &str, pool: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{namespace}/pool/{pool}/router")
}

/// URI SAN of a pool's external Pick API caller.
pub fn picker_uri(namespace: &str, pool: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{namespace}/pool/{pool}/picker")
}

/// Key stem of a WorkerSet's sidecar pair (`<stem>.crt`, `<stem>.key`).
pub fn sidecar_identity(workerset: &str) -> String {
    format!("workerset-{workerset}")
}

/// Key stem of a pool's picker pair.
pub fn picker_identity(pool: &str) -> String {
    format!("picker-{pool}")
}

/// `<stem>.crt`.
pub fn cert_key(stem: &str) -> String {
    format!("{stem}.crt")
}

/// `<stem>.key`.
pub fn private_key_key(stem: &str) -> String {
    format!("{stem}.key")
}

/// The four DNS names of a Service: `name`, `name.ns`, `name.ns.svc`,
/// `name.ns.svc.cluster.local`.
pub fn service_dns_names(name: &str, namespace: &str) -> Vec<String> {
    vec![
        name.to_string(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ]
}

/// One identity the operator issues a key pair for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Key stem in the Secret (`router`, `workerset-<name>`, `picker-<pool>`).
    pub stem: String,
    /// Namespace of the Secret it lives in (also the certificate's common name suffix).
    pub namespace: String,
    /// URI SANs (SPIFFE ids).
    pub uris: BTreeSet<String>,
    /// DNS SANs (router Services only).
    pub dns: BTreeSet<String>,
    /// Serves TLS (server auth) as well as calling (client auth).
    pub server: bool,
}

impl Identity {
    /// A WorkerSet's sidecars: client only.
    pub fn sidecar(namespace: &str, workerset: &str) -> Self {
        Self {
            stem: sidecar_identity(workerset),
            namespace: namespace.to_string(),
            uris: BTreeSet::from([sidecar_uri(namespace, workerset)]),
            dns: BTreeSet::new(),
            server: false,
        }
    }

    /// A pool's external Pick API caller: client only.
    pub fn picker(namespace: &str, pool: &str) -> Self {
        Self {
            stem: picker_identity(pool),
            namespace: namespace.to_string(),
            uris: BTreeSet::from([picker_uri(namespace, pool)]),
            dns: BTreeSet::new(),
            server: false,
        }
    }

    /// The router: one pair for every pool it serves (`pools` as (namespace, name)), with the
    /// DNS names of its Services (`services` in `namespace`).
    pub fn router(namespace: &str, pools: &[(String, String)], services: &[&str]) -> Self {
        Self {
            stem: ROUTER_IDENTITY.to_string(),
            namespace: namespace.to_string(),
            uris: pools.iter().map(|(ns, p)| router_uri(ns, p)).collect(),
            dns: services
                .iter()
                .flat_map(|s| service_dns_names(s, namespace))
                .collect(),
            server: true,
        }
    }
}

/// How long certificates live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// Leaf certificates (renewed at two thirds).
    pub leaf: Duration,
    /// The CA (a successor is staged at two thirds).
    pub ca: Duration,
    /// How long a staged CA is only trusted before it starts signing: time for every mounted
    /// bundle to be refreshed and re-read.
    pub ca_overlap: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Self {
            leaf: Duration::from_secs(7 * 24 * 3600),
            ca: Duration::from_secs(365 * 24 * 3600),
            ca_overlap: Duration::from_secs(24 * 3600),
        }
    }
}

/// Why the PKI could not read or make a certificate.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A stored certificate is not a PEM X.509 certificate.
    #[error("unreadable certificate: {0}")]
    Unreadable(String),
    /// rcgen failed to build or sign a certificate.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// The stored CA is incomplete (a certificate without its key or the reverse).
    #[error("CA Secret is incomplete: {0}")]
    IncompleteCa(&'static str),
}

/// What rotation needs to know about one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// Serial number, big-endian.
    pub serial: Vec<u8>,
    /// URI SANs.
    pub uris: BTreeSet<String>,
    /// DNS SANs.
    pub dns: BTreeSet<String>,
}

impl CertFacts {
    /// When the certificate is due for renewal: at two thirds of its life.
    pub fn renew_at(&self) -> i64 {
        let life = self.not_after.saturating_sub(self.not_before).max(0);
        self.not_before.saturating_add(life.saturating_mul(2) / 3)
    }
}

fn first_pem(pem: &[u8]) -> Result<Pem, PkiError> {
    Pem::iter_from_buffer(pem)
        .next()
        .ok_or_else(|| PkiError::Unreadable("no PEM block".into()))?
        .map_err(|e| PkiError::Unreadable(e.to_string()))
}

fn with_cert<T>(
    pem: &[u8],
    f: impl FnOnce(&X509Certificate<'_>) -> Result<T, PkiError>,
) -> Result<T, PkiError> {
    let block = first_pem(pem)?;
    let cert = block
        .parse_x509()
        .map_err(|e| PkiError::Unreadable(e.to_string()))?;
    f(&cert)
}

/// Reads the facts of the first certificate in `pem`.
pub fn cert_facts(pem: &[u8]) -> Result<CertFacts, PkiError> {
    with_cert(pem, |c| {
        let mut uris = BTreeSet::new();
        let mut dns = BTreeSet::new();
        if let Ok(Some(san)) = c.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::URI(u) => {
                        uris.insert(u.to_string());
                    }
                    GeneralName::DNSName(d) => {
                        dns.insert(d.to_string());
                    }
                    _ => {}
                }
            }
        }
        Ok(CertFacts {
            not_before: c.validity().not_before.timestamp(),
            not_after: c.validity().not_after.timestamp(),
            serial: c.raw_serial().to_vec(),
            uris,
            dns,
        })
    })
}

/// True when the first certificate of `leaf` carries a valid signature of the first
/// certificate of `ca`.
pub fn signed_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (Ok(leaf), Ok(ca)) = (first_pem(leaf), first_pem(ca)) else {
        return false;
    };
    let (Ok(leaf), Ok(ca)) = (leaf.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// A CA: certificate and key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ca {
    /// Certificate, PEM.
    pub cert: String,
    /// PKCS#8 key, PEM.
    pub key: String,
}

/// The CA Secret's content: the signing CA, a staged successor, a retired predecessor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaSet {
    /// Signs every leaf.
    pub signing: Ca,
    /// Trusted, not yet signing.
    pub next: Option<Ca>,
    /// Retired, trusted until it expires.
    pub previous: Option<String>,
}

fn text(data: &BTreeMap<String, Vec<u8>>, key: &str) -> Option<String> {
    data.get(key)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

impl CaSet {
    /// Reads the CA Secret's data; `None` when it holds no CA yet.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Option<Self>, PkiError> {
        let signing = match (text(data, CA_CERT_KEY), text(data, CA_KEY_KEY)) {
            (Some(cert), Some(key)) => Ca { cert, key },
            (None, None) => return Ok(None),
            (Some(_), None) => return Err(PkiError::IncompleteCa("ca.crt without ca.key")),
            (None, Some(_)) => return Err(PkiError::IncompleteCa("ca.key without ca.crt")),
        };
        cert_facts(signing.cert.as_bytes())?;
        let next = match (text(data, NEXT_CERT_KEY), text(data, NEXT_KEY_KEY)) {
            (Some(cert), Some(key)) if cert_facts(cert.as_bytes()).is_ok() => {
                Some(Ca { cert, key })
            }
            // A half-written or unreadable staged CA is discarded and staged again.
            _ => None,
        };
        let previous = text(data, PREVIOUS_CERT_KEY).filter(|p| cert_facts(p.as_bytes()).is_ok());
        Ok(Some(Self {
            signing,
            next,
            previous,
        }))
    }

    /// The Secret's data.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let mut d = BTreeMap::from([
            (
                CA_CERT_KEY.to_string(),
                self.signing.cert.clone().into_bytes(),
            ),
            (
                CA_KEY_KEY.to_string(),
                self.signing.key.clone().into_bytes(),
            ),
        ]);
        if let Some(next) = &self.next {
            d.insert(NEXT_CERT_KEY.to_string(), next.cert.clone().into_bytes());
            d.insert(NEXT_KEY_KEY.to_string(), next.key.clone().into_bytes());
        }
        if let Some(p) = &self.previous {
            d.insert(PREVIOUS_CERT_KEY.to_string(), p.clone().into_bytes());
        }
        d
    }

    /// Every CA a peer must trust now: signing, staged, and the retired one until it expires.
    pub fn trusted(&self, now: i64) -> Vec<String> {
        let mut out = vec![self.signing.cert.clone()];
        out.extend(self.next.iter().map(|n| n.cert.clone()));
        out.extend(
            self.previous
                .iter()
                .filter(|p| cert_facts(p.as_bytes()).is_ok_and(|f| f.not_after > now))
                .cloned(),
        );
        out
    }

    /// The trust bundle (`ca.crt`): [`CaSet::trusted`] concatenated.
    pub fn bundle(&self, now: i64) -> String {
        self.trusted(now)
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if !c.ends_with('\n') {
                    c.push('\n');
                }
                c
            })
            .collect()
    }
}

/// What to do with the CA Secret now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaStep {
    /// Nothing is due.
    Keep,
    /// No usable CA: make one (first start, or the signing CA has expired).
    Create,
    /// The signing CA is at two thirds of its life: make a successor, trusted only.
    StageNext,
    /// The staged CA has been trusted for the overlap period: it signs from now on.
    PromoteNext,
    /// The retired CA has expired: drop it from the bundle.
    DropPrevious,
}

/// The next CA step and, when nothing is due, the time (unix seconds) to look again.
pub fn ca_step(now: i64, set: Option<&CaSet>, lifetimes: &Lifetimes) -> (CaStep, Option<i64>) {
    let Some(set) = set else {
        return (CaStep::Create, None);
    };
    let Ok(signing) = cert_facts(set.signing.cert.as_bytes()) else {
        return (CaStep::Create, None);
    };
    if signing.not_after <= now {
        return (CaStep::Create, None);
    }
    let overlap = i64::try_from(lifetimes.ca_overlap.as_secs()).unwrap_or(i64::MAX);
    let mut wake = vec![signing.not_after];
    if let Some(prev) = set
        .previous
        .as_ref()
        .and_then(|p| cert_facts(p.as_bytes()).ok())
    {
        if prev.not_after <= now {
            return (CaStep::DropPrevious, None);
        }
        wake.push(prev.not_after);
    }
    match set
        .next
        .as_ref()
        .and_then(|n| cert_facts(n.cert.as_bytes()).ok())
    {
        Some(next) => {
            let promote_at = next.not_before.saturating_add(overlap);
            if promote_at <= now {
                return (CaStep::PromoteNext, None);
            }
            wake.push(promote_at);
        }
        None => {
            if signing.renew_at() <= now {
                return (CaStep::StageNext, None);
            }
            wake.push(signing.renew_at());
        }
    }
    (CaStep::Keep, wake.into_iter().min())
}

/// Applies `step` to `set`, generating a CA where the step needs one.
pub fn apply_ca_step(
    now: i64,
    set: Option<CaSet>,
    step: CaStep,
    lifetimes: &Lifetimes,
) -> Result<Option<CaSet>, PkiError> {
    Ok(match (step, set) {
        (CaStep::Keep, set) => set,
        (CaStep::Create, _) => Some(CaSet {
            signing: new_ca(now, lifetimes.ca)?,
            next: None,
            previous: None,
        }),
        (CaStep::StageNext, Some(mut set)) => {
            set.next = Some(new_ca(now, lifetimes.ca)?);
            Some(set)
        }
        (CaStep::PromoteNext, Some(set)) => match set.next {
            Some(next) => Some(CaSet {
                previous: Some(set.signing.cert),
                signing: next,
                next: None,
            }),
            None => Some(set),
        },
        (CaStep::DropPrevious, Some(mut set)) => {
            set.previous = None;
            Some(set)
        }
        (_, None) => None,
    })
}

fn datetime(unix: i64) -> Result<OffsetDateTime, PkiError> {
    OffsetDateTime::from_unix_timestamp(unix)
        .map_err(|e| PkiError::Unreadable(format!("time {unix}: {e}")))
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    // Positive, and never a leading zero byte that DER would have to strip.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

/// How far `not_before` is set back for clock skew: a tenth of the life, at most 5 minutes.
fn backdate(life: Duration) -> i64 {
    i64::try_from((life / 10).min(Duration::from_secs(300)).as_secs()).unwrap_or(0)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Makes a self-signed ECDSA P-256 CA valid for `life` from `now`.
pub fn new_ca(now: i64, life: Duration) -> Result<Ca, PkiError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "kvroute");
    dn.push(DnType::CommonName, format!("kvroute CA {now}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial());
    params.not_before = datetime(now.saturating_sub(backdate(life)))?;
    params.not_after = datetime(now.saturating_add(secs(life)))?;
    let cert = params.self_signed(&key)?;
    Ok(Ca {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Issues a fresh key pair for `id`, signed by `ca`, valid for `life` from `now` but never
/// past the CA's own expiry. Returns (certificate PEM, key PEM).
pub fn issue(
    now: i64,
    ca: &Ca,
    id: &Identity,
    life: Duration,
) -> Result<(String, String), PkiError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key)?;
    let ca_end = cert_facts(ca.cert.as_bytes())?.not_after;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "kvroute");
    dn.push(DnType::CommonName, format!("{}.{}", id.stem, id.namespace));
    params.distinguished_name = dn;
    params.serial_number = Some(random_serial());
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if id.server {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    let mut sans = Vec::new();
    for u in &id.uris {
        sans.push(SanType::URI(u.as_str().try_into()?));
    }
    for d in &id.dns {
        sans.push(SanType::DnsName(d.as_str().try_into()?));
    }
    params.subject_alt_names = sans;
    params.not_before = datetime(now.saturating_sub(backdate(life)))?;
    params.not_after = datetime(now.saturating_add(secs(life)).min(ca_end))?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Why an identity's pair is (re)issued. Names are metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// No certificate or no key.
    Missing,
    /// The stored certificate cannot be parsed.
    Unreadable,
    /// At or past two thirds of its life.
    Expiring,
    /// Its SANs differ from the identity's (a pool or Service was added or removed).
    NamesChanged,
    /// No CA in the bundle signed it (the CA was replaced).
    UnknownIssuer,
}

impl Reason {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Missing => "Missing",
            Reason::Unreadable => "Unreadable",
            Reason::Expiring => "Expiring",
            Reason::NamesChanged => "NamesChanged",
            Reason::UnknownIssuer => "UnknownIssuer",
        }
    }
}

/// Whether `id`'s stored pair can stay: `Ok(renew_at)` or `Err(why it must be reissued)`.
pub fn leaf_decision(
    now: i64,
    data: &BTreeMap<String, Vec<u8>>,
    id: &Identity,
    trusted: &[String],
) -> Result<i64, Reason> {
    let (Some(crt), Some(_)) = (
        data.get(&cert_key(&id.stem)),
        data.get(&private_key_key(&id.stem)),
    ) else {
        return Err(Reason::Missing);
    };
    let facts = cert_facts(crt).map_err(|_| Reason::Unreadable)?;
    if facts.uris != id.uris || facts.dns != id.dns {
        return Err(Reason::NamesChanged);
    }
    if !trusted.iter().any(|ca| signed_by(crt, ca.as_bytes())) {
        return Err(Reason::UnknownIssuer);
    }
    let renew_at = facts.renew_at();
    if renew_at <= now {
        return Err(Reason::Expiring);
    }
    Ok(renew_at)
}

/// What one pass does to a namespace's [`MTLS_SECRET`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MtlsPlan {
    /// Identities to (re)issue, by key stem.
    pub reissue: BTreeMap<String, Reason>,
    /// When the earliest kept pair is due (unix seconds).
    pub next_check: Option<i64>,
}

/// Decides which of `wanted` need a new pair now. Pairs of identities no longer wanted are
/// dropped by [`render_mtls`], which writes only what is wanted.
pub fn plan_mtls(
    now: i64,
    data: &BTreeMap<String, Vec<u8>>,
    wanted: &[Identity],
    trusted: &[String],
) -> MtlsPlan {
    let mut plan = MtlsPlan::default();
    for id in wanted {
        match leaf_decision(now, data, id, trusted) {
            Ok(at) => plan.next_check = Some(plan.next_check.map_or(at, |c| c.min(at))),
            Err(reason) => {
                plan.reissue.insert(id.stem.clone(), reason);
            }
        }
    }
    plan
}

/// A fresh random admin token: 32 bytes, hex.
pub fn new_admin_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The namespace Secret's new data: every wanted identity's pair (kept or freshly issued per
/// `plan`), the trust bundle, and the admin token (kept, or made when absent). Keys of
/// identities not wanted any more are left out.
pub fn render_mtls(
    now: i64,
    data: &BTreeMap<String, Vec<u8>>,
    wanted: &[Identity],
    plan: &MtlsPlan,
    cas: &CaSet,
    lifetimes: &Lifetimes,
) -> Result<BTreeMap<String, Vec<u8>>, PkiError> {
    let mut out = BTreeMap::new();
    for id in wanted {
        let (crt, key) = (cert_key(&id.stem), private_key_key(&id.stem));
        match (
            plan.reissue.contains_key(&id.stem),
            data.get(&crt),
            data.get(&key),
        ) {
            (false, Some(c), Some(k)) => {
                out.insert(crt, c.clone());
                out.insert(key, k.clone());
            }
            _ => {
                let (c, k) = issue(now, &cas.signing, id, lifetimes.leaf)?;
                out.insert(crt, c.into_bytes());
                out.insert(key, k.into_bytes());
            }
        }
    }
    out.insert(CA_BUNDLE_KEY.to_string(), cas.bundle(now).into_bytes());
    let token = data
        .get(ADMIN_TOKEN_KEY)
        .filter(|t| t.len() >= 32)
        .cloned()
        .unwrap_or_else(|| new_admin_token().into_bytes());
    out.insert(ADMIN_TOKEN_KEY.to_string(), token);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;
    const DAY: i64 = 24 * 3600;

    fn lifetimes() -> Lifetimes {
        Lifetimes {
            leaf: Duration::from_secs(7 * DAY as u64),
            ca: Duration::from_secs(90 * DAY as u64),
            ca_overlap: Duration::from_secs(DAY as u64),
        }
    }

    fn cas(now: i64) -> CaSet {
        CaSet {
            signing: new_ca(now, lifetimes().ca).expect("ca"),
            next: None,
            previous: None,
        }
    }

    fn wanted() -> Vec<Identity> {
        vec![
            Identity::router(
                "kvroute-system",
                &[("team-a".into(), "chat".into())],
                &["kvroute-router", "kvroute-router-ingest"],
            ),
            Identity::sidecar("team-a", "qwen"),
            Identity::picker("team-a", "chat"),
        ]
    }

    fn fresh(now: i64, cas: &CaSet) -> BTreeMap<String, Vec<u8>> {
        let w = wanted();
        let plan = plan_mtls(now, &BTreeMap::new(), &w, &cas.trusted(now));
        render_mtls(now, &BTreeMap::new(), &w, &plan, cas, &lifetimes()).expect("render")
    }

    #[test]
    fn an_empty_secret_gets_every_pair_the_bundle_and_a_token() {
        let cas = cas(T0);
        let plan = plan_mtls(T0, &BTreeMap::new(), &wanted(), &cas.trusted(T0));
        assert_eq!(plan.reissue.len(), 3);
        assert!(plan.reissue.values().all(|r| *r == Reason::Missing));
        let data = fresh(T0, &cas);
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "admin-token",
                "ca.crt",
                "picker-chat.crt",
                "picker-chat.key",
                "router.crt",
                "router.key",
                "workerset-qwen.crt",
                "workerset-qwen.key",
            ]
        );
        assert_eq!(data["admin-token"].len(), 64);
        let router = cert_facts(&data["router.crt"]).expect("router cert");
        assert_eq!(
            router.uris,
            BTreeSet::from(["spiffe://kvroute.dev/ns/team-a/pool/chat/router".to_string()])
        );
        assert!(
            router
                .dns
                .contains("kvroute-router-ingest.kvroute-system.svc")
        );
        assert!(
            router
                .dns
                .contains("kvroute-router.kvroute-system.svc.cluster.local")
        );
        assert_eq!(router.dns.len(), 8);
        let sidecar = cert_facts(&data["workerset-qwen.crt"]).expect("sidecar cert");
        assert_eq!(
            sidecar.uris,
            BTreeSet::from(["spiffe://kvroute.dev/ns/team-a/workerset/qwen".to_string()])
        );
        assert!(sidecar.dns.is_empty());
        assert!(signed_by(
            &data["workerset-qwen.crt"],
            cas.signing.cert.as_bytes()
        ));
        // The leaf lives a week (less the skew allowance), the key matches the certificate.
        assert_eq!(sidecar.not_after, T0 + 7 * DAY);
        assert!(sidecar.not_before < T0);
        let key =
            KeyPair::from_pem(&String::from_utf8_lossy(&data["workerset-qwen.key"])).expect("key");
        let spki = with_cert(&data["workerset-qwen.crt"], |c| {
            Ok(c.public_key().subject_public_key.data.to_vec())
        })
        .expect("spki");
        assert_eq!(key.public_key_raw(), spki.as_slice());
    }

    #[test]
    fn nothing_is_due_before_two_thirds_and_the_next_check_is_that_point() {
        let cas = cas(T0);
        let data = fresh(T0, &cas);
        let plan = plan_mtls(T0 + DAY, &data, &wanted(), &cas.trusted(T0 + DAY));
        assert!(plan.reissue.is_empty(), "{plan:?}");
        let facts = cert_facts(&data["router.crt"]).expect("facts");
        assert_eq!(plan.next_check, Some(facts.renew_at()));
        assert!(facts.renew_at() > T0 + 4 * DAY && facts.renew_at() < T0 + 5 * DAY);
    }

    #[test]
    fn only_the_due_pair_is_reissued_and_the_others_stay_byte_for_byte() {
        let cas = cas(T0);
        let mut data = fresh(T0, &cas);
        // The picker was issued later than the others: only the others are due.
        let later = T0 + 3 * DAY;
        let (c, k) = issue(
            later,
            &cas.signing,
            &Identity::picker("team-a", "chat"),
            lifetimes().leaf,
        )
        .expect("issue");
        data.insert("picker-chat.crt".into(), c.into_bytes());
        data.insert("picker-chat.key".into(), k.into_bytes());
        let now = T0 + 5 * DAY;
        let plan = plan_mtls(now, &data, &wanted(), &cas.trusted(now));
        assert_eq!(
            plan.reissue,
            BTreeMap::from([
                ("router".to_string(), Reason::Expiring),
                ("workerset-qwen".to_string(), Reason::Expiring),
            ])
        );
        let next = render_mtls(now, &data, &wanted(), &plan, &cas, &lifetimes()).expect("render");
        assert_eq!(next["picker-chat.crt"], data["picker-chat.crt"]);
        assert_eq!(next["picker-chat.key"], data["picker-chat.key"]);
        assert_eq!(next["admin-token"], data["admin-token"]);
        assert_ne!(next["router.key"], data["router.key"]);
        let (old, new) = (
            cert_facts(&data["router.crt"]).expect("old"),
            cert_facts(&next["router.crt"]).expect("new"),
        );
        assert_ne!(old.serial, new.serial);
        assert_eq!(new.not_after, now + 7 * DAY);
    }

    #[test]
    fn changed_names_a_foreign_issuer_and_garbage_force_a_reissue() {
        let cas = cas(T0);
        let mut data = fresh(T0, &cas);
        // A second pool: the router's URI SANs change.
        let mut w = wanted();
        w[0] = Identity::router(
            "kvroute-system",
            &[
                ("team-a".into(), "chat".into()),
                ("team-b".into(), "code".into()),
            ],
            &["kvroute-router", "kvroute-router-ingest"],
        );
        let trusted = cas.trusted(T0);
        assert_eq!(
            leaf_decision(T0, &data, &w[0], &trusted),
            Err(Reason::NamesChanged)
        );
        // Signed by a CA that is not in the bundle.
        let foreign = new_ca(T0, lifetimes().ca).expect("ca");
        let (c, _) = issue(T0, &foreign, &w[1], lifetimes().leaf).expect("issue");
        data.insert("workerset-qwen.crt".into(), c.into_bytes());
        assert_eq!(
            leaf_decision(T0, &data, &w[1], &trusted),
            Err(Reason::UnknownIssuer)
        );
        data.insert("picker-chat.crt".into(), b"not a certificate".to_vec());
        assert_eq!(
            leaf_decision(T0, &data, &w[2], &trusted),
            Err(Reason::Unreadable)
        );
        data.remove("picker-chat.key");
        assert_eq!(
            leaf_decision(T0, &data, &w[2], &trusted),
            Err(Reason::Missing)
        );
    }

    #[test]
    fn identities_no_longer_wanted_are_dropped() {
        let cas = cas(T0);
        let data = fresh(T0, &cas);
        let w = vec![Identity::sidecar("team-a", "qwen")];
        let plan = plan_mtls(T0, &data, &w, &cas.trusted(T0));
        let next = render_mtls(T0, &data, &w, &plan, &cas, &lifetimes()).expect("render");
        assert!(!next.contains_key("router.crt") && !next.contains_key("picker-chat.key"));
        assert_eq!(next["workerset-qwen.crt"], data["workerset-qwen.crt"]);
    }

    #[test]
    fn leaves_never_outlive_their_ca() {
        let ca = new_ca(T0, Duration::from_secs(2 * DAY as u64)).expect("ca");
        let (c, _) = issue(T0, &ca, &Identity::sidecar("a", "b"), lifetimes().leaf).expect("issue");
        let ca_end = cert_facts(ca.cert.as_bytes()).expect("ca").not_after;
        assert_eq!(cert_facts(c.as_bytes()).expect("leaf").not_after, ca_end);
    }

    #[test]
    fn the_ca_is_staged_then_promoted_then_the_old_one_dropped() {
        let l = lifetimes();
        assert_eq!(ca_step(T0, None, &l).0, CaStep::Create);
        let set = apply_ca_step(T0, None, CaStep::Create, &l).expect("create");
        let set = set.expect("a CA");
        let ca_facts = cert_facts(set.signing.cert.as_bytes()).expect("facts");
        let (step, wake) = ca_step(T0 + DAY, Some(&set), &l);
        assert_eq!((step, wake), (CaStep::Keep, Some(ca_facts.renew_at())));
        // Two thirds in: a successor is staged, trusted but not signing.
        let t1 = ca_facts.renew_at();
        assert_eq!(ca_step(t1, Some(&set), &l).0, CaStep::StageNext);
        let staged = apply_ca_step(t1, Some(set.clone()), CaStep::StageNext, &l)
            .expect("stage")
            .expect("set");
        assert_eq!(staged.signing, set.signing);
        assert_eq!(staged.trusted(t1).len(), 2);
        assert!(
            staged
                .bundle(t1)
                .contains(&staged.next.as_ref().expect("next").cert)
        );
        let (step, wake) = ca_step(t1 + 60, Some(&staged), &l);
        assert_eq!(step, CaStep::Keep);
        let promote_at = wake.expect("wake");
        assert!(promote_at > t1 && promote_at <= t1 + DAY);
        // After the overlap the staged CA signs; the old one stays trusted.
        assert_eq!(
            ca_step(promote_at, Some(&staged), &l).0,
            CaStep::PromoteNext
        );
        let promoted = apply_ca_step(promote_at, Some(staged.clone()), CaStep::PromoteNext, &l)
            .expect("promote")
            .expect("set");
        assert_eq!(Some(promoted.signing.clone()), staged.next);
        assert_eq!(
            promoted.previous.as_deref(),
            Some(set.signing.cert.as_str())
        );
        assert_eq!(promoted.trusted(promote_at).len(), 2);
        // A leaf of the old CA is still accepted during the overlap.
        let mut data = BTreeMap::new();
        let id = Identity::sidecar("a", "b");
        let (c, k) = issue(t1, &set.signing, &id, l.leaf).expect("issue");
        data.insert(cert_key(&id.stem), c.into_bytes());
        data.insert(private_key_key(&id.stem), k.into_bytes());
        assert!(leaf_decision(promote_at, &data, &id, &promoted.trusted(promote_at)).is_ok());
        // Once the old CA expires it leaves the bundle.
        let (step, _) = ca_step(ca_facts.not_after, Some(&promoted), &l);
        assert_eq!(step, CaStep::DropPrevious);
        let dropped = apply_ca_step(ca_facts.not_after, Some(promoted), step, &l)
            .expect("drop")
            .expect("set");
        assert!(dropped.previous.is_none());
        // The Secret round-trips.
        let back = CaSet::from_data(&staged.to_data())
            .expect("read")
            .expect("set");
        assert_eq!(back, staged);
    }

    #[test]
    fn an_expired_or_broken_ca_is_replaced_and_a_half_ca_is_an_error() {
        let l = lifetimes();
        let set = cas(T0);
        let end = cert_facts(set.signing.cert.as_bytes())
            .expect("f")
            .not_after;
        assert_eq!(ca_step(end, Some(&set), &l).0, CaStep::Create);
        let mut data = set.to_data();
        data.remove(CA_KEY_KEY);
        assert!(matches!(
            CaSet::from_data(&data),
            Err(PkiError::IncompleteCa(_))
        ));
        assert!(CaSet::from_data(&BTreeMap::new()).expect("empty").is_none());
        data.insert(CA_KEY_KEY.into(), b"k".to_vec());
        data.insert(CA_CERT_KEY.into(), b"garbage".to_vec());
        assert!(CaSet::from_data(&data).is_err());
    }

    #[test]
    fn seconds_scale_lifetimes_do_not_renew_in_a_loop() {
        let ca = new_ca(T0, lifetimes().ca).expect("ca");
        let (c, _) = issue(
            T0,
            &ca,
            &Identity::sidecar("a", "b"),
            Duration::from_secs(30),
        )
        .expect("issue");
        let f = cert_facts(c.as_bytes()).expect("facts");
        assert!(f.renew_at() > T0 + 10, "{f:?}");
    }
}
