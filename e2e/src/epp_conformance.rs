//! A black-box conformance suite for Gateway API Inference Extension endpoint pickers: a Rust
//! ext_proc client that plays Envoy's messages over real gRPC against any EPP address and
//! checks the endpoint picker protocol (GIE `docs/proposals/004-endpoint-picker-protocol`).
//! It knows nothing of kvroute: the message shapes are written out here from the protocol,
//! not borrowed from the router, so a mistake on one side cannot hide one on the other.
//!
//! ```text
//! suite --grpc.health.v1 Check(liveness | readiness | ext_proc)--> EPP
//!       --ext_proc stream: request_headers (full duplex, subset hint), request_body chunks-->
//!       <-- headers answer (x-gateway-destination-endpoint + dynamic_metadata["envoy.lb"])
//!           and the body, or an ImmediateResponse
//!       --response_headers (served endpoint), SSE body chunks, end of stream-->
//!       --optional: a Prometheus gauge of in-flight requests, read until it is back to 0
//! ```
//!
//! Run it from a shell with `cargo run -p kvroute-e2e --example epp-conformance -- --target
//! http://HOST:PORT --model M --endpoint IP:PORT ...` (docs/gateway-api.md), or call [`run`].

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
    body_mutation, processing_request, processing_response,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// `x-gateway-destination-endpoint`.
const DESTINATION: &str = "x-gateway-destination-endpoint";
/// `x-gateway-destination-endpoint-served`.
const SERVED: &str = "x-gateway-destination-endpoint-served";
/// `x-gateway-destination-endpoint-subset`.
const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The filter-metadata namespace of the subset hint.
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The metadata namespace of the destination and the served endpoint.
const LB: &str = "envoy.lb";
/// The health service name of the ext_proc service.
const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// `BodySendMode` values.
const FULL_DUPLEX_STREAMED: i32 = 4;
const BUFFERED: i32 = 2;
/// An endpoint no pool has (TEST-NET-1, RFC 5737).
const NOWHERE: &str = "192.0.2.1:9";

/// A Prometheus gauge (summed over its series) that counts the picker's requests in flight.
#[derive(Clone, Debug)]
pub struct InFlightProbe {
    /// The metrics URL, e.g. `http://127.0.0.1:9090/metrics`.
    pub url: String,
    /// The metric name, e.g. `kvroute_router_in_flight`.
    pub metric: String,
}

impl InFlightProbe {
    /// The summed value now.
    pub async fn read(&self) -> anyhow::Result<f64> {
        let text = reqwest::get(&self.url)
            .await
            .with_context(|| format!("GET {}", self.url))?
            .text()
            .await?;
        let mut sum = 0.0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let bare = name.split('{').next().unwrap_or_default();
            if bare == self.metric {
                sum += value.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        Ok(sum)
    }
}

/// What to check and with what.
#[derive(Clone, Debug)]
pub struct Config {
    /// The model the generated requests name (`/v1/chat/completions` bodies).
    pub model: String,
    /// Every endpoint (`ip:port`) the picker may choose for `model`; the subset checks
    /// pick among them. Empty: destinations are not checked against a list.
    pub endpoints: Vec<String>,
    /// Fallbacks expected after the primary when the pool has more endpoints (0: none
    /// required).
    pub min_fallbacks: usize,
    /// Request headers with which the picker must refuse with 429 (`None`: not checked).
    pub reject_429: Option<Vec<(String, String)>>,
    /// Request headers with which the picker must refuse with 503 (`None`: not checked).
    pub reject_503: Option<Vec<(String, String)>>,
    /// Where to read the in-flight count that must return to 0 (`None`: not checked).
    pub in_flight: Option<InFlightProbe>,
    /// The picker's request body limit: a body over it must get an immediate 413 (`None`:
    /// not checked).
    pub max_body_bytes: Option<usize>,
    /// How long to wait for any one answer or condition.
    pub deadline: Duration,
}

impl Config {
    /// Checks for `model` served by `endpoints`, nothing optional.
    pub fn new(model: &str, endpoints: &[String]) -> Self {
        Self {
            model: model.to_string(),
            endpoints: endpoints.to_vec(),
            min_fallbacks: 0,
            reject_429: None,
            reject_503: None,
            in_flight: None,
            max_body_bytes: None,
            deadline: Duration::from_secs(20),
        }
    }
}

/// How one check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It held.
    Passed,
    /// It did not, and why.
    Failed(String),
    /// Not run (not configured).
    Skipped(String),
}

/// One named check.
#[derive(Clone, Debug)]
pub struct Check {
    /// The check's name.
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
}

/// Every check of a run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// In the order run.
    pub checks: Vec<Check>,
}

impl Report {
    /// No check failed.
    pub fn passed(&self) -> bool {
        !self
            .checks
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    /// The outcome of check `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.outcome)
    }

    fn record(&mut self, name: &'static str, result: anyhow::Result<Option<String>>) {
        let outcome = match result {
            Ok(None) => Outcome::Passed,
            Ok(Some(why)) => Outcome::Skipped(why),
            Err(e) => Outcome::Failed(format!("{e:#}")),
        };
        self.checks.push(Check { name, outcome });
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match &c.outcome {
                Outcome::Passed => writeln!(f, "PASS  {}", c.name)?,
                Outcome::Failed(why) => writeln!(f, "FAIL  {}: {why}", c.name)?,
                Outcome::Skipped(why) => writeln!(f, "SKIP  {}: {why}", c.name)?,
            }
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
            .count();
        write!(f, "{} checks, {failed} failed", self.checks.len())
    }
}

/// Runs every check against the picker behind `channel`.
pub async fn run(channel: Channel, cfg: &Config) -> Report {
    let mut report = Report::default();
    let s = Suite {
        channel,
        cfg: cfg.clone(),
    };
    report.record("health", s.health().await);
    report.record("destination_header_matches_metadata", s.destination().await);
    report.record("fallback_list", s.fallbacks().await);
    report.record("subset_hint_honoured", s.subset().await);
    report.record(
        "subset_outside_pool_is_503",
        s.subset_refused(&[NOWHERE]).await,
    );
    report.record("empty_subset_is_503", s.subset_refused(&[]).await);
    report.record("buffered_mode", s.buffered().await);
    report.record("malformed_body_is_4xx", s.malformed().await);
    report.record("oversized_body_is_413", s.oversized().await);
    report.record("reject_429", s.reject(429, cfg.reject_429.as_deref()).await);
    report.record("reject_503", s.reject(503, cfg.reject_503.as_deref()).await);
    report.record("served_fallback_is_accounted", s.served_fallback().await);
    report.record("in_flight_zero_after_done", s.released(false).await);
    report.record("in_flight_zero_after_abort", s.released(true).await);
    report
}

struct Suite {
    channel: Channel,
    cfg: Config,
}

/// One ext_proc stream, as Envoy drives it.
struct Stream {
    tx: Option<mpsc::Sender<ProcessingRequest>>,
    rx: tonic::Streaming<ProcessingResponse>,
    deadline: Duration,
}

impl Stream {
    async fn send(&self, r: ProcessingRequest) -> anyhow::Result<()> {
        let tx = self.tx.as_ref().context("stream closed")?;
        tx.send(r).await.map_err(|_| anyhow!("stream closed"))
    }

    async fn next(&mut self) -> anyhow::Result<ProcessingResponse> {
        match tokio::time::timeout(self.deadline, self.rx.message()).await {
            Err(_) => bail!("no answer within {:?}", self.deadline),
            Ok(Err(status)) => bail!("stream failed: {status}"),
            Ok(Ok(None)) => bail!("stream ended without an answer"),
            Ok(Ok(Some(r))) => Ok(r),
        }
    }

    /// Closes the request side, as Envoy does when the request is over (or the client left).
    fn close(&mut self) {
        self.tx = None;
    }
}

/// A routing answer: the destination from the header and from the metadata.
#[derive(Debug)]
struct Routed {
    header: Option<String>,
    metadata: Option<String>,
    body: Option<Vec<u8>>,
}

impl Routed {
    fn endpoints(&self) -> Vec<String> {
        self.header
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }
}

/// What the request phase ended with.
#[derive(Debug)]
enum Answer {
    Routed(Routed),
    Immediate { status: i32, body: Vec<u8> },
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
    let mut inner = Struct::default();
    inner.fields.insert(key.to_string(), value);
    let mut m = Metadata::default();
    m.filter_metadata.insert(namespace.to_string(), inner);
    m
}

fn subset_metadata(endpoints: &[&str]) -> Metadata {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: endpoints.iter().map(|e| string(e)).collect(),
        })),
    };
    metadata(SUBSET_NAMESPACE, SUBSET, list)
}

fn header_of(
    m: Option<&envoy_types::pb::envoy::service::ext_proc::v3::HeaderMutation>,
    key: &str,
) -> Option<String> {
    m?.set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key.eq_ignore_ascii_case(key))
        .map(|h| {
            if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            }
        })
}

fn metadata_destination(r: &ProcessingResponse) -> Option<String> {
    let lb = r.dynamic_metadata.as_ref()?.fields.get(LB)?;
    let Some(Kind::StructValue(s)) = &lb.kind else {
        return None;
    };
    match &s.fields.get(DESTINATION)?.kind {
        Some(Kind::StringValue(v)) => Some(v.clone()),
        _ => None,
    }
}

fn immediate_of(r: &ProcessingResponse) -> Option<Answer> {
    match &r.response {
        Some(processing_response::Response::ImmediateResponse(i)) => Some(Answer::Immediate {
            status: i.status.as_ref().map_or(0, |s| s.code),
            body: i.body.clone(),
        }),
        _ => None,
    }
}

/// A request the suite sends.
struct Req<'a> {
    body: Vec<u8>,
    subset: Option<&'a [&'a str]>,
    extra: &'a [(String, String)],
    mode: i32,
}

impl Suite {
    fn chat(&self, text: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "model": self.cfg.model,
            "stream": true,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": text}],
        }))
        .unwrap_or_default()
    }

    fn req<'a>(&self, body: Vec<u8>) -> Req<'a> {
        Req {
            body,
            subset: None,
            extra: &[],
            mode: FULL_DUPLEX_STREAMED,
        }
    }

    async fn open(&self) -> anyhow::Result<Stream> {
        let (tx, rx) = mpsc::channel(16);
        let mut client = ExternalProcessorClient::new(self.channel.clone());
        let rx = tokio::time::timeout(
            self.cfg.deadline,
            client.process(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await
        .context("ext_proc stream did not open in time")?
        .context("open the ext_proc stream")?
        .into_inner();
        Ok(Stream {
            tx: Some(tx),
            rx,
            deadline: self.cfg.deadline,
        })
    }

    /// Plays the request phase (headers, then the body in two chunks) and reads the
    /// picker's answer.
    async fn request(&self, s: &mut Stream, r: &Req<'_>) -> anyhow::Result<Answer> {
        let mut pairs: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "gateway.example"),
            ("content-type", "application/json"),
        ];
        pairs.extend(r.extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        s.send(ProcessingRequest {
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: r.mode,
                response_body_mode: r.mode,
                send_body_without_waiting_for_header_response: false,
            }),
            metadata_context: r.subset.map(subset_metadata),
            request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
                headers: Some(headers(&pairs)),
                end_of_stream: false,
                ..Default::default()
            })),
            ..Default::default()
        })
        .await?;
        let split = r.body.len() / 2;
        let chunks = [&r.body[..split], &r.body[split..]];
        let buffered = r.mode == BUFFERED;
        if buffered {
            // Buffered: the headers are answered at once, before any body.
            let first = s.next().await?;
            if let Some(i) = immediate_of(&first) {
                return Ok(i);
            }
            if !matches!(
                first.response,
                Some(processing_response::Response::RequestHeaders(_))
            ) {
                bail!("buffered mode: expected a request-headers answer first, got {first:?}");
            }
        }
        let parts: Vec<&[u8]> = if buffered {
            vec![&r.body[..]]
        } else {
            chunks.to_vec()
        };
        let n = parts.len();
        for (i, c) in parts.into_iter().enumerate() {
            s.send(ProcessingRequest {
                request: Some(processing_request::Request::RequestBody(HttpBody {
                    body: c.to_vec(),
                    end_of_stream: i + 1 == n,
                    ..Default::default()
                })),
                ..Default::default()
            })
            .await?;
        }
        let first = s.next().await?;
        if let Some(i) = immediate_of(&first) {
            return Ok(i);
        }
        match &first.response {
            Some(processing_response::Response::RequestHeaders(h)) if !buffered => {
                let header = header_of(
                    h.response.as_ref().and_then(|c| c.header_mutation.as_ref()),
                    DESTINATION,
                );
                let metadata = metadata_destination(&first);
                let second = s.next().await?;
                let body = match &second.response {
                    Some(processing_response::Response::RequestBody(b)) => {
                        match b
                            .response
                            .as_ref()
                            .and_then(|c| c.body_mutation.as_ref())
                            .and_then(|m| m.mutation.as_ref())
                        {
                            Some(body_mutation::Mutation::StreamedResponse(sr)) => {
                                if !sr.end_of_stream {
                                    bail!("the streamed body answer does not end the body");
                                }
                                Some(sr.body.clone())
                            }
                            other => bail!(
                                "full duplex: the body answer must stream the body back, got {other:?}"
                            ),
                        }
                    }
                    other => bail!("expected the request-body answer, got {other:?}"),
                };
                Ok(Answer::Routed(Routed {
                    header,
                    metadata,
                    body,
                }))
            }
            Some(processing_response::Response::RequestBody(b)) if buffered => {
                let header = header_of(
                    b.response.as_ref().and_then(|c| c.header_mutation.as_ref()),
                    DESTINATION,
                );
                Ok(Answer::Routed(Routed {
                    header,
                    metadata: metadata_destination(&first),
                    body: None,
                }))
            }
            other => bail!("unexpected answer to the request: {other:?}"),
        }
    }

    /// Plays a successful streamed response from `served` and reads every answer.
    async fn respond(&self, s: &mut Stream, served: &str) -> anyhow::Result<()> {
        s.send(ProcessingRequest {
            metadata_context: Some(metadata(LB, SERVED, string(served))),
            request: Some(processing_request::Request::ResponseHeaders(HttpHeaders {
                headers: Some(headers(&[
                    (":status", "200"),
                    ("content-type", "text/event-stream"),
                ])),
                end_of_stream: false,
                ..Default::default()
            })),
            ..Default::default()
        })
        .await?;
        let a = s.next().await?;
        if !matches!(
            a.response,
            Some(processing_response::Response::ResponseHeaders(_))
        ) {
            bail!("expected a response-headers answer, got {a:?}");
        }
        let chunks = [
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n",
        ];
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            s.send(ProcessingRequest {
                request: Some(processing_request::Request::ResponseBody(HttpBody {
                    body: c.as_bytes().to_vec(),
                    end_of_stream: last,
                    ..Default::default()
                })),
                ..Default::default()
            })
            .await?;
            let a = s.next().await?;
            match &a.response {
                Some(processing_response::Response::ResponseBody(b)) => {
                    // Full duplex: the picker owns the body and must pass it on unchanged.
                    if let Some(body_mutation::Mutation::StreamedResponse(sr)) = b
                        .response
                        .as_ref()
                        .and_then(|c| c.body_mutation.as_ref())
                        .and_then(|m| m.mutation.as_ref())
                        && (sr.body != c.as_bytes() || sr.end_of_stream != last)
                    {
                        bail!("the response body chunk came back changed");
                    }
                }
                other => bail!("expected a response-body answer, got {other:?}"),
            }
        }
        s.close();
        Ok(())
    }

    async fn route(&self, r: &Req<'_>) -> anyhow::Result<(Stream, Routed)> {
        let mut s = self.open().await?;
        match self.request(&mut s, r).await? {
            Answer::Routed(routed) => Ok((s, routed)),
            Answer::Immediate { status, body } => {
                bail!("refused with {status}: {}", String::from_utf8_lossy(&body))
            }
        }
    }

    fn check_routed(&self, routed: &Routed) -> anyhow::Result<Vec<String>> {
        let (Some(h), Some(m)) = (&routed.header, &routed.metadata) else {
            bail!(
                "the destination must be in both the header and dynamic_metadata[\"envoy.lb\"]: {routed:?}"
            );
        };
        if h != m {
            bail!("header {h:?} and metadata {m:?} disagree");
        }
        let eps = routed.endpoints();
        if eps.is_empty() {
            bail!("empty destination");
        }
        if !self.cfg.endpoints.is_empty() {
            for e in &eps {
                if !self.cfg.endpoints.contains(e) {
                    bail!("destination {e} is not an endpoint of the pool");
                }
            }
        }
        Ok(eps)
    }

    async fn health(&self) -> anyhow::Result<Option<String>> {
        let mut client = HealthClient::new(self.channel.clone());
        for service in ["liveness", "readiness", EXT_PROC] {
            let status = tokio::time::timeout(
                self.cfg.deadline,
                client.check(HealthCheckRequest {
                    service: service.into(),
                }),
            )
            .await
            .with_context(|| format!("health of {service:?}: no answer"))?
            .with_context(|| format!("health of {service:?}"))?
            .into_inner()
            .status;
            if status != ServingStatus::Serving as i32 {
                bail!("health of {service:?} is {status}, expected SERVING");
            }
        }
        Ok(None)
    }

    async fn destination(&self) -> anyhow::Result<Option<String>> {
        let body = self.chat("conformance: destination");
        let (mut s, routed) = self.route(&self.req(body.clone())).await?;
        let eps = self.check_routed(&routed)?;
        if routed.body.as_deref() != Some(&body[..]) {
            bail!("the body sent on differs from the client's");
        }
        self.respond(&mut s, &eps[0]).await?;
        Ok(None)
    }

    async fn fallbacks(&self) -> anyhow::Result<Option<String>> {
        let want = self
            .cfg
            .min_fallbacks
            .min(self.cfg.endpoints.len().saturating_sub(1));
        if want == 0 {
            return Ok(Some("no fallbacks required for this pool".into()));
        }
        let (mut s, routed) = self
            .route(&self.req(self.chat("conformance: fallbacks")))
            .await?;
        let eps = self.check_routed(&routed)?;
        if eps.len() < 1 + want {
            bail!("{} fallback(s) expected, got {eps:?}", want);
        }
        let mut distinct = eps.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != eps.len() {
            bail!("the destination lists an endpoint twice: {eps:?}");
        }
        self.respond(&mut s, &eps[0]).await?;
        Ok(None)
    }

    async fn subset(&self) -> anyhow::Result<Option<String>> {
        if self.cfg.endpoints.is_empty() {
            return Ok(Some("no endpoints configured".into()));
        }
        for e in self.cfg.endpoints.iter().take(4) {
            let only = [e.as_str()];
            let mut r = self.req(self.chat("conformance: subset"));
            r.subset = Some(&only);
            let (mut s, routed) = self.route(&r).await?;
            let eps = self.check_routed(&routed)?;
            if eps.iter().any(|x| x != e) {
                bail!("subset [{e}] but the destination is {eps:?}");
            }
            self.respond(&mut s, e).await?;
        }
        Ok(None)
    }

    async fn subset_refused(&self, subset: &[&str]) -> anyhow::Result<Option<String>> {
        let mut r = self.req(self.chat("conformance: subset refused"));
        r.subset = Some(subset);
        let mut s = self.open().await?;
        match self.request(&mut s, &r).await? {
            Answer::Immediate { status: 503, .. } => Ok(None),
            other => bail!("expected an ImmediateResponse 503, got {other:?}"),
        }
    }

    async fn buffered(&self) -> anyhow::Result<Option<String>> {
        let mut r = self.req(self.chat("conformance: buffered"));
        r.mode = BUFFERED;
        let mut s = self.open().await?;
        match self.request(&mut s, &r).await? {
            Answer::Routed(routed) => {
                self.check_routed(&routed)?;
                s.close();
                Ok(None)
            }
            other => bail!("expected a destination, got {other:?}"),
        }
    }

    async fn malformed(&self) -> anyhow::Result<Option<String>> {
        let mut s = self.open().await?;
        match self
            .request(&mut s, &self.req(b"{not json".to_vec()))
            .await?
        {
            Answer::Immediate { status, .. } if (400..500).contains(&status) => Ok(None),
            other => bail!("expected an ImmediateResponse 4xx, got {other:?}"),
        }
    }

    async fn oversized(&self) -> anyhow::Result<Option<String>> {
        let Some(limit) = self.cfg.max_body_bytes else {
            return Ok(Some("no body limit configured".into()));
        };
        let filler = "x".repeat(limit + 1);
        let mut s = self.open().await?;
        match self.request(&mut s, &self.req(self.chat(&filler))).await? {
            Answer::Immediate { status: 413, .. } => Ok(None),
            other => bail!("expected an ImmediateResponse 413, got {other:?}"),
        }
    }

    async fn reject(
        &self,
        want: i32,
        extra: Option<&[(String, String)]>,
    ) -> anyhow::Result<Option<String>> {
        let Some(extra) = extra else {
            return Ok(Some(format!("no request configured to get {want}")));
        };
        let mut r = self.req(self.chat("conformance: refused"));
        r.extra = extra;
        let mut s = self.open().await?;
        match self.request(&mut s, &r).await? {
            Answer::Immediate { status, body } if status == want => {
                serde_json::from_slice::<serde_json::Value>(&body)
                    .context("the immediate response's body is not JSON")?;
                Ok(None)
            }
            other => bail!("expected an ImmediateResponse {want}, got {other:?}"),
        }
    }

    async fn served_fallback(&self) -> anyhow::Result<Option<String>> {
        let (mut s, routed) = self
            .route(&self.req(self.chat("conformance: served by a fallback")))
            .await?;
        let eps = self.check_routed(&routed)?;
        let Some(fallback) = eps.get(1) else {
            s.close();
            return Ok(Some("the destination lists no fallback".into()));
        };
        self.respond(&mut s, fallback).await?;
        self.back_to_zero().await?;
        Ok(None)
    }

    /// Waits until the in-flight probe reads 0 (`Ok(false)` when there is no probe).
    async fn back_to_zero(&self) -> anyhow::Result<bool> {
        let Some(probe) = &self.cfg.in_flight else {
            return Ok(false);
        };
        let end = Instant::now() + self.cfg.deadline;
        loop {
            let v = probe.read().await?;
            if v == 0.0 {
                return Ok(true);
            }
            if Instant::now() > end {
                bail!("{} is still {v}", probe.metric);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn released(&self, abort: bool) -> anyhow::Result<Option<String>> {
        let Some(probe) = &self.cfg.in_flight else {
            return Ok(Some("no in-flight probe configured".into()));
        };
        self.back_to_zero().await?;
        let mut open = Vec::new();
        for i in 0..3 {
            let (s, routed) = self
                .route(&self.req(self.chat(&format!("conformance: release {i}"))))
                .await?;
            let eps = self.check_routed(&routed)?;
            open.push((s, eps[0].clone()));
        }
        let held = probe.read().await?;
        if held < open.len() as f64 {
            bail!(
                "{} reads {held} with {} requests routed",
                probe.metric,
                open.len()
            );
        }
        for (mut s, served) in open {
            if abort {
                // The client went away: Envoy closes the stream without response phases.
                drop(s);
            } else {
                self.respond(&mut s, &served).await?;
            }
        }
        self.back_to_zero().await?;
        Ok(None)
    }
}
