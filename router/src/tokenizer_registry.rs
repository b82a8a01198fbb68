//! Which tokenizer each model uses, and whether it is loaded: the local directories of
//! `--tokenizer` (loaded once at start, and they win), plus one entry per model whose
//! WorkerSet names a source (discovery's [`TokenizerPlan`]), filled in by the loader task.
//! A synchronous index behind a lock, like the rest of the router state; the loader learns
//! about plan changes through a `watch` channel.
//!
//! ```text
//! --tokenizer DIR | MODEL=DIR --load at start--> local (wins)
//! discovery --set_plan(TokenizerPlan)--> entries{model: source, loaded?, failures}
//!                                  \--watch--> TokenizerLoader --loaded / failed--^
//! RouterState::tokens_for --lookup(name, backend)--> Ready | NotLoaded | NotConfigured
//! readiness --first_load_pending()  admin /readyz?model=, /debug/tokenizers --report()      metrics --refresh_gauges()
//! ```
//!
//! A model whose source is known but whose tokenizer is not loaded is *not ready*: requests
//! that need tokens get a 503 unless one of the model's pools sets
//! `spec.routing.allowLoadOnly` (then they are routed on load alone and counted as
//! degraded). A model with no source at all (`--tokenizer-fetch` off and no directory)
//! keeps the old behaviour: load-only, counted as degraded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvroute_crds::workerset::ResolvedTokenizer;
use kvroute_tokenization::Tokenizer;
use parking_lot::RwLock;
use serde::Serialize;
use tokio::sync::watch;

use crate::state::{StateError, TokenizerDirs};

/// What discovery says about tokenizers: each served model's source and the client-facing
/// model names whose pools allow load-only routing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenizerPlan {
    /// Served model name -> where its tokenizer comes from.
    pub sources: BTreeMap<String, ResolvedTokenizer>,
    /// Client-facing names (served names and aliases) of pools with `allowLoadOnly`.
    pub load_only: BTreeSet<String>,
}

/// The outcome of a lookup.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// Use this tokenizer.
    Ready(Arc<Tokenizer>),
    /// The model has a source but its tokenizer is not loaded yet.
    NotLoaded {
        /// At least one attempt failed (else: the first download is still running).
        failed: bool,
        /// A pool of the model allows routing on load alone meanwhile.
        load_only: bool,
    },
    /// No tokenizer is configured for the model.
    NotConfigured,
}

/// A loaded tokenizer and where it came from.
#[derive(Clone)]
struct Loaded {
    tokenizer: Arc<Tokenizer>,
    source: ResolvedTokenizer,
    origin: String,
}

/// One model with a source from discovery.
#[derive(Clone)]
struct Entry {
    /// The source discovery wants now.
    source: ResolvedTokenizer,
    /// The last tokenizer loaded (possibly from a previous source: it keeps serving until
    /// the new source loads).
    loaded: Option<Loaded>,
    /// Failed attempts for `source` since it was set.
    failures: u32,
    /// The last failure: (metric label, message).
    last_error: Option<(&'static str, String)>,
}

impl Entry {
    /// True until a tokenizer from the current source is loaded (none, or an older source's).
    fn wants_load(&self) -> bool {
        self.loaded.as_ref().is_none_or(|l| l.source != self.source)
    }
}

/// One row of `/debug/tokenizers`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TokenizerReport {
    /// Served model name (or `*` for the `--tokenizer DIR` default).
    pub model: String,
    /// `local`, `loaded`, `loading`, `failing`, `stale` (an older source still serves while
    /// the current one loads).
    pub state: &'static str,
    /// Where the current source points.
    pub source: String,
    /// Where the loaded tokenizer came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded_from: Option<String>,
    /// Failed attempts for the current source.
    pub failures: u32,
    /// The last failure, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Requests may be routed on load alone while it is not loaded.
    pub load_only_allowed: bool,
}

/// Tokenizers by model: local directories plus discovered sources. Cheap to share
/// (`Arc` inside the state).
pub struct Tokenizers {
    default: Option<(PathBuf, Arc<Tokenizer>)>,
    per_model: BTreeMap<String, (PathBuf, Arc<Tokenizer>)>,
    inner: RwLock<Discovered>,
    plan_tx: watch::Sender<TokenizerPlan>,
    fetch_hub: AtomicBool,
}

#[derive(Default)]
struct Discovered {
    entries: BTreeMap<String, Entry>,
    load_only: BTreeSet<String>,
}

/// Sets `kvroute_router_tokenizer_loaded{model}` for every discovered model (reset first, so
/// models discovery dropped disappear).
pub fn refresh_gauges(tokenizers: &Tokenizers, gauge: &prometheus::IntGaugeVec) {
    gauge.reset();
    for (model, loaded) in tokenizers.loaded_states() {
        gauge
            .with_label_values(&[model.as_str()])
            .set(i64::from(loaded));
    }
}

/// Human-readable form of a source.
pub fn describe(source: &ResolvedTokenizer) -> String {
    match source {
        ResolvedTokenizer::Hub {
            repo,
            revision,
            token,
        } => match token {
            Some((secret, key)) => format!("hub {repo}@{revision} (token {secret}/{key})"),
            None => format!("hub {repo}@{revision}"),
        },
        ResolvedTokenizer::ConfigMap(name) => format!("configMap {name}"),
        ResolvedTokenizer::Path(p) => format!("path {p}"),
    }
}

impl Tokenizers {
    /// Loads the `--tokenizer` directories (an unreadable one fails start-up).
    pub fn load(dirs: &TokenizerDirs) -> Result<Self, StateError> {
        let load = |dir: &PathBuf| {
            Tokenizer::from_dir(dir)
                .map(|t| (dir.clone(), Arc::new(t)))
                .map_err(|source| StateError::Tokenizer {
                    dir: dir.clone(),
                    source,
                })
        };
        let default = dirs.default.as_ref().map(load).transpose()?;
        let mut per_model = BTreeMap::new();
        for (model, dir) in &dirs.per_model {
            per_model.insert(model.clone(), load(dir)?);
        }
        Ok(Self {
            default,
            per_model,
            inner: RwLock::new(Discovered::default()),
            plan_tx: watch::Sender::new(TokenizerPlan::default()),
            fetch_hub: AtomicBool::new(false),
        })
    }

    /// `--tokenizer-fetch`: take Hub sources into the plan (off: only ConfigMap and path
    /// sources are loaded, and Hub models keep the load-only fallback). Set before discovery
    /// starts.
    pub fn set_fetch_hub(&self, on: bool) {
        self.fetch_hub.store(on, Ordering::Release);
    }

    /// True when a `--tokenizer` directory serves `model` (such models are never fetched).
    pub fn has_local(&self, model: &str) -> bool {
        self.default.is_some() || self.per_model.contains_key(model)
    }

    /// The tokenizer for the client-facing `name` of `backend`: a local directory for the
    /// name, else for the backend model, else the local default, else the backend model's
    /// discovered source.
    pub fn lookup(&self, name: &str, backend: &str) -> Lookup {
        let local = self
            .per_model
            .get(name)
            .or_else(|| self.per_model.get(backend))
            .or(self.default.as_ref());
        if let Some((_, t)) = local {
            return Lookup::Ready(t.clone());
        }
        let inner = self.inner.read();
        match inner.entries.get(backend) {
            None => Lookup::NotConfigured,
            Some(Entry {
                loaded: Some(l), ..
            }) => Lookup::Ready(l.tokenizer.clone()),
            Some(e) => Lookup::NotLoaded {
                failed: e.failures > 0,
                load_only: inner.load_only.contains(name) || inner.load_only.contains(backend),
            },
        }
    }

    /// Replaces discovery's view. Models a local directory serves are left out; entries whose
    /// source changed keep their loaded tokenizer until the new one loads.
    pub fn set_plan(&self, mut plan: TokenizerPlan) {
        let fetch_hub = self.fetch_hub.load(Ordering::Acquire);
        plan.sources.retain(|model, source| {
            !self.has_local(model)
                && (fetch_hub || !matches!(source, ResolvedTokenizer::Hub { .. }))
        });
        {
            let mut inner = self.inner.write();
            inner.entries.retain(|m, _| plan.sources.contains_key(m));
            for (model, source) in &plan.sources {
                let entry = inner.entries.entry(model.clone()).or_insert_with(|| Entry {
                    source: source.clone(),
                    loaded: None,
                    failures: 0,
                    last_error: None,
                });
                if &entry.source != source {
                    entry.source = source.clone();
                    entry.failures = 0;
                    entry.last_error = None;
                }
            }
            // A model whose source another model already loaded shares that tokenizer at once.
            let by_source: BTreeMap<ResolvedTokenizer, Loaded> = inner
                .entries
                .values()
                .filter_map(|e| e.loaded.as_ref())
                .map(|l| (l.source.clone(), l.clone()))
                .collect();
            for e in inner.entries.values_mut() {
                if e.wants_load()
                    && let Some(l) = by_source.get(&e.source)
                {
                    e.loaded = Some(l.clone());
                    e.failures = 0;
                    e.last_error = None;
                }
            }
            inner.load_only = plan.load_only.clone();
        }
        self.plan_tx.send_if_modified(|current| {
            let changed = current.sources != plan.sources;
            *current = plan;
            changed
        });
    }

    /// The plan (models to fetch), for the loader; changes when sources change.
    pub fn subscribe(&self) -> watch::Receiver<TokenizerPlan> {
        self.plan_tx.subscribe()
    }

    /// Records a tokenizer loaded from `source` for every model that wants that source now:
    /// they share the one parsed tokenizer. Returns those models (none when discovery
    /// meanwhile changed or dropped the source: the result is ignored then).
    pub fn loaded(
        &self,
        source: &ResolvedTokenizer,
        tokenizer: Tokenizer,
        origin: String,
    ) -> Vec<String> {
        let loaded = Loaded {
            tokenizer: Arc::new(tokenizer),
            source: source.clone(),
            origin,
        };
        let mut inner = self.inner.write();
        let mut models = Vec::new();
        for (model, e) in inner.entries.iter_mut() {
            if &e.source == source {
                e.loaded = Some(loaded.clone());
                e.last_error = None;
                models.push(model.clone());
            }
        }
        models
    }

    /// Records a failed attempt at `source` for every model that wants it; returns each
    /// such model with its failures for this source so far.
    pub fn failed(
        &self,
        source: &ResolvedTokenizer,
        label: &'static str,
        message: String,
    ) -> Vec<(String, u32)> {
        let mut inner = self.inner.write();
        let mut models = Vec::new();
        for (model, e) in inner.entries.iter_mut() {
            if &e.source == source {
                e.failures = e.failures.saturating_add(1);
                e.last_error = Some((label, message.clone()));
                models.push((model.clone(), e.failures));
            }
        }
        models
    }

    /// Sources that some model wants and has not loaded from yet: what the loader fetches.
    pub fn pending_sources(&self) -> BTreeSet<ResolvedTokenizer> {
        let inner = self.inner.read();
        inner
            .entries
            .values()
            .filter(|e| e.wants_load())
            .map(|e| e.source.clone())
            .collect()
    }

    /// Discovered models whose tokenizer is not loaded and whose pools do not allow
    /// load-only routing: requests for them that need tokens are refused.
    pub fn blocked_models(&self) -> BTreeSet<String> {
        let inner = self.inner.read();
        inner
            .entries
            .iter()
            .filter(|(m, e)| e.loaded.is_none() && !inner.load_only.contains(*m))
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Discovered models whose tokenizer has neither loaded nor failed yet and whose pools do
    /// not allow load-only routing: what a starting router waits for before it is ready
    /// (see [`crate::readiness`]).
    pub fn first_load_pending(&self) -> BTreeSet<String> {
        let inner = self.inner.read();
        inner
            .entries
            .iter()
            .filter(|(m, e)| e.loaded.is_none() && e.failures == 0 && !inner.load_only.contains(*m))
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Every discovered model and whether its tokenizer is loaded (for the
    /// `kvroute_router_tokenizer_loaded` gauge).
    pub fn loaded_states(&self) -> Vec<(String, bool)> {
        let inner = self.inner.read();
        inner
            .entries
            .iter()
            .map(|(m, e)| (m.clone(), e.loaded.is_some()))
            .collect()
    }

    /// `/debug/tokenizers`: local directories first, then discovered models.
    pub fn report(&self) -> Vec<TokenizerReport> {
        let mut out = Vec::new();
        let local = |model: &str, dir: &PathBuf| TokenizerReport {
            model: model.to_string(),
            state: "local",
            source: format!("dir {}", dir.display()),
            loaded_from: Some(format!("dir {}", dir.display())),
            failures: 0,
            last_error: None,
            load_only_allowed: false,
        };
        if let Some((dir, _)) = &self.default {
            out.push(local("*", dir));
        }
        for (model, (dir, _)) in &self.per_model {
            out.push(local(model, dir));
        }
        let inner = self.inner.read();
        for (model, e) in &inner.entries {
            let state = match &e.loaded {
                Some(l) if l.source == e.source => "loaded",
                Some(_) => "stale",
                None if e.failures > 0 => "failing",
                None => "loading",
            };
            out.push(TokenizerReport {
                model: model.clone(),
                state,
                source: describe(&e.source),
                loaded_from: e.loaded.as_ref().map(|l| l.origin.clone()),
                failures: e.failures,
                last_error: e.last_error.as_ref().map(|(_, m)| m.clone()),
                load_only_allowed: inner.load_only.contains(model),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");

    fn hub(repo: &str, revision: &str) -> ResolvedTokenizer {
        ResolvedTokenizer::Hub {
            repo: repo.into(),
            revision: revision.into(),
            token: None,
        }
    }

    fn plan(models: &[(&str, ResolvedTokenizer)], load_only: &[&str]) -> TokenizerPlan {
        TokenizerPlan {
            sources: models
                .iter()
                .map(|(m, s)| (m.to_string(), s.clone()))
                .collect(),
            load_only: load_only.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn qwen3() -> Tokenizer {
        Tokenizer::from_dir(std::path::Path::new(QWEN3)).expect("qwen3")
    }

    #[test]
    fn discovered_model_is_not_loaded_until_the_loader_reports() {
        let t = Tokenizers::load(&TokenizerDirs::default()).expect("no dirs");
        assert!(matches!(t.lookup("a", "a"), Lookup::NotConfigured));
        let src = hub("Qwen/Qwen3-0.6B", "main");
        // Without --tokenizer-fetch, Hub sources are ignored (the old load-only fallback) but
        // directory sources are planned.
        t.set_plan(plan(
            &[
                ("qwen3", src.clone()),
                ("d", ResolvedTokenizer::Path("/t".into())),
            ],
            &[],
        ));
        assert!(matches!(t.lookup("qwen3", "qwen3"), Lookup::NotConfigured));
        assert!(matches!(t.lookup("d", "d"), Lookup::NotLoaded { .. }));
        t.set_fetch_hub(true);
        t.set_plan(plan(&[("qwen3", src.clone())], &["chat-lo"]));
        assert!(matches!(
            t.lookup("qwen3", "qwen3"),
            Lookup::NotLoaded {
                failed: false,
                load_only: false
            }
        ));
        // An alias listed by a load-only pool may route meanwhile.
        assert!(matches!(
            t.lookup("chat-lo", "qwen3"),
            Lookup::NotLoaded {
                load_only: true,
                ..
            }
        ));
        assert_eq!(
            t.first_load_pending(),
            BTreeSet::from(["qwen3".to_string()])
        );
        assert_eq!(
            t.failed(&src, "network", "down".into()),
            vec![("qwen3".to_string(), 1)]
        );
        // Failed once: still blocked, but no longer what start-up waits for.
        assert!(t.first_load_pending().is_empty());
        assert!(matches!(
            t.lookup("qwen3", "qwen3"),
            Lookup::NotLoaded { failed: true, .. }
        ));
        assert_eq!(t.blocked_models(), BTreeSet::from(["qwen3".to_string()]));
        assert_eq!(t.report()[0].state, "failing");

        assert_eq!(t.pending_sources(), BTreeSet::from([src.clone()]));
        assert_eq!(t.loaded(&src, qwen3(), "hub x".into()), vec!["qwen3"]);
        assert!(t.pending_sources().is_empty());
        assert!(matches!(t.lookup("qwen3", "qwen3"), Lookup::Ready(_)));
        assert!(t.blocked_models().is_empty());
        assert_eq!(t.loaded_states(), vec![("qwen3".to_string(), true)]);

        // A new revision keeps the old tokenizer serving, marked stale, until it loads.
        let next = hub("Qwen/Qwen3-0.6B", "v2");
        t.set_plan(plan(&[("qwen3", next.clone())], &[]));
        assert!(matches!(t.lookup("qwen3", "qwen3"), Lookup::Ready(_)));
        assert_eq!(t.report()[0].state, "stale");
        // A late result for the old source is ignored.
        assert!(t.loaded(&src, qwen3(), "late".into()).is_empty());
        assert_eq!(t.report()[0].loaded_from.as_deref(), Some("hub x"));

        // Dropped by discovery: gone.
        t.set_plan(TokenizerPlan::default());
        assert!(matches!(t.lookup("qwen3", "qwen3"), Lookup::NotConfigured));
        assert!(t.report().is_empty());
    }

    #[test]
    fn models_with_one_source_share_one_tokenizer() {
        let t = Tokenizers::load(&TokenizerDirs::default()).expect("no dirs");
        t.set_fetch_hub(true);
        let src = hub("Qwen/Qwen3-0.6B", "main");
        let other = hub("o/o", "main");
        t.set_plan(plan(
            &[
                ("qwen3", src.clone()),
                ("qwen3-canary", src.clone()),
                ("o", other.clone()),
            ],
            &[],
        ));
        // One fetch per source, not per model.
        assert_eq!(
            t.pending_sources(),
            BTreeSet::from([src.clone(), other.clone()])
        );
        let failed = t.failed(&src, "network", "down".into());
        assert_eq!(
            failed,
            vec![("qwen3".to_string(), 1), ("qwen3-canary".to_string(), 1)]
        );
        assert_eq!(
            t.loaded(&src, qwen3(), "hub x".into()),
            vec!["qwen3", "qwen3-canary"]
        );
        assert_eq!(t.pending_sources(), BTreeSet::from([other.clone()]));
        let (Lookup::Ready(a), Lookup::Ready(b)) = (
            t.lookup("qwen3", "qwen3"),
            t.lookup("qwen3-canary", "qwen3-canary"),
        ) else {
            panic!("both models are ready");
        };
        assert!(Arc::ptr_eq(&a, &b), "one parsed tokenizer");
        assert!(matches!(t.lookup("o", "o"), Lookup::NotLoaded { .. }));

        // A model discovered later with a loaded source is ready at once.
        t.set_plan(plan(
            &[
                ("qwen3", src.clone()),
                ("qwen3-canary", src.clone()),
                ("qwen3-b", src.clone()),
                ("o", other.clone()),
            ],
            &[],
        ));
        let Lookup::Ready(c) = t.lookup("qwen3-b", "qwen3-b") else {
            panic!("shares the loaded tokenizer");
        };
        assert!(Arc::ptr_eq(&a, &c));
        assert_eq!(t.pending_sources(), BTreeSet::from([other]));
        let b_row = t.report().into_iter().find(|r| r.model == "qwen3-b");
        assert_eq!(b_row.map(|r| r.state), Some("loaded"));
    }

    #[test]
    fn a_local_directory_wins_and_is_never_planned() {
        let dirs = TokenizerDirs {
            default: None,
            per_model: BTreeMap::from([("qwen3".to_string(), PathBuf::from(QWEN3))]),
        };
        let t = Tokenizers::load(&dirs).expect("dirs");
        t.set_fetch_hub(true);
        let rx = t.subscribe();
        t.set_plan(plan(
            &[
                ("qwen3", hub("Qwen/Qwen3-0.6B", "main")),
                ("other", hub("o/o", "main")),
            ],
            &[],
        ));
        assert!(matches!(t.lookup("qwen3", "qwen3"), Lookup::Ready(_)));
        let planned: Vec<String> = rx.borrow().sources.keys().cloned().collect();
        assert_eq!(planned, vec!["other".to_string()]);
        let rows: Vec<(String, &str)> =
            t.report().into_iter().map(|r| (r.model, r.state)).collect();
        assert_eq!(
            rows,
            vec![
                ("qwen3".to_string(), "local"),
                ("other".to_string(), "loading")
            ]
        );
    }
}
