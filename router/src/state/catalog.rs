//! Discovery's view (pools, aliases, workers), model resolution and which workers are
//! routable for a model.
//!
//! ```text
//! discovery --set_catalog--> Catalog { pools, workers }
//! client model --resolve_model(_seeded)--> Resolved { backend model, pool, alias draw }
//!     --routable_workers(pool's sets, exclude)--> (id, address, core id, set) for plan()
//! ```

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use kvroute_tls::Identity;

use super::RouterState;
use super::lora::serves;
use super::sidecars::SidecarView;
use crate::auth::{Caller, StreamRefused};
use crate::routing::WorkerId;

/// Everything discovery knows: pools (model names and aliases) and workers. Replaced as a
/// whole on every discovery change ([`RouterState::set_catalog`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Catalog {
    /// InferencePools.
    pub pools: Vec<PoolView>,
    /// Workers of InferenceWorkerSets.
    pub workers: Vec<DiscoveredWorker>,
}

/// One InferencePool as the router uses it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolView {
    /// `namespace/name`.
    pub name: String,
    /// Client-facing model names of the pool: the backend model names themselves and aliases.
    pub models: Vec<ServedModel>,
    /// Names of the InferenceWorkerSets whose workers serve the pool (empty: any worker of
    /// the model).
    pub worker_sets: Vec<String>,
    /// Tenant authentication of the pool's models (`None`: anonymous requests are served).
    #[serde(skip)]
    pub auth: Option<std::sync::Arc<crate::tenant::PoolAuth>>,
}

/// A client-facing model name.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServedModel {
    /// The name clients send.
    pub name: String,
    /// The model name the workers serve (the same as `name` unless it is an alias). For a
    /// split alias: the model that takes the remainder.
    pub backend_model: String,
    /// A split alias's shares, `(model, percent)`, `backend_model` first; empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<(String, u32)>,
}

/// A worker discovery knows about.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DiscoveredWorker {
    /// Stable id (`namespace/pod`); sidecars report the same id.
    pub id: String,
    /// host:port of its OpenAI-compatible API.
    pub address: String,
    /// Model it serves (served model name).
    pub model: String,
    /// Its InferenceWorkerSet.
    pub worker_set: String,
    /// The WorkerSet's namespace.
    pub namespace: String,
    /// The pod's IP: the source address of its sidecar's streams (Kubernetes: the pod IP;
    /// static file: the IP literal of `address`, if it is one).
    pub pod_ip: Option<std::net::IpAddr>,
    /// Pod Ready (always true for the static file).
    pub ready: bool,
    /// Where discovery found it, and so whether a kvroute sidecar is expected to report it.
    pub origin: WorkerOrigin,
    /// Its engine's step budget (vLLM's `max_num_batched_tokens`) when its WorkerSet says
    /// (`discovery::step_budget_tokens`); `None`: the router's `--step-budget-tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_budget_tokens: Option<f64>,
}

/// Where discovery found a worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerOrigin {
    /// A pod of a kvroute InferenceWorkerSet: its sidecar reports its cache and load, and
    /// it is a candidate only once that stream has sent a snapshot.
    #[default]
    WorkerSet,
    /// A pod that a Gateway API Inference Extension `InferencePool` selects: no kvroute
    /// sidecar is expected, so the router registers it itself and routes it on its own
    /// in-flight count alone (no cache view) until a sidecar of its own reports it.
    InferencePool,
}

/// A model as `GET /v1/models` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelInfo {
    /// The client-facing name.
    pub id: String,
    /// The model the workers serve.
    pub backend_model: String,
    /// The pool it comes from (`None` for models known only from workers).
    pub pool: Option<String>,
}

/// Where a client-facing model name goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The model name to send to workers (rewrite the body when it differs).
    pub backend_model: String,
    /// The pool, if the name came from one.
    pub pool: Option<String>,
    /// The draw of a split alias (`None` for other names).
    pub alias: Option<AliasDraw>,
    /// Set when `backend_model` names a LoRA adapter: the model of the workers that serve it
    /// (docs/lora.md). Requests go only to those workers that list the adapter, and their
    /// prefix hashes are seeded with this model and the adapter.
    pub lora_base: Option<String>,
}

impl Resolved {
    /// The model the candidate workers serve: the adapter's base model, else `backend_model`.
    pub fn served_model(&self) -> &str {
        self.lora_base.as_deref().unwrap_or(&self.backend_model)
    }

    /// The LoRA adapter the request runs with, if `backend_model` names one.
    pub fn lora(&self) -> Option<&str> {
        self.lora_base.as_ref().map(|_| self.backend_model.as_str())
    }
}

/// How a split alias was resolved for one request (shown in the decision record).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AliasDraw {
    /// The alias the client sent.
    pub alias: String,
    /// The model drawn.
    pub model: String,
    /// That model's share, percent.
    pub percent: u32,
    /// The seed of the draw (from the request id, else the router's sequence).
    pub seed: u64,
}

impl RouterState {
    /// The client-facing models: pool names and aliases, plus the models of listed workers,
    /// plus with `--route-unlisted` the models sidecars report.
    pub fn models(&self) -> Vec<ModelInfo> {
        let mut out: BTreeMap<String, ModelInfo> = BTreeMap::new();
        let bare = |out: &mut BTreeMap<String, ModelInfo>, model: &str| {
            if !model.is_empty() && !out.contains_key(model) {
                let info = ModelInfo {
                    id: model.to_string(),
                    backend_model: model.to_string(),
                    pool: None,
                };
                out.insert(model.to_string(), info);
            }
        };
        {
            let catalog = self.0.catalog.read();
            for pool in &catalog.pools {
                for m in &pool.models {
                    out.entry(m.name.clone()).or_insert_with(|| ModelInfo {
                        id: m.name.clone(),
                        backend_model: m.backend_model.clone(),
                        pool: Some(pool.name.clone()),
                    });
                }
            }
            for w in &catalog.workers {
                bare(&mut out, &w.model);
            }
        }
        if self.0.config.route_unlisted {
            for s in self.0.sidecars.read().values() {
                bare(&mut out, &s.identity.model);
            }
        }
        // LoRA adapters: listed under their own name, in their base model's pool.
        for (adapter, base) in self.adapter_models() {
            if !out.contains_key(&adapter) {
                let pool = out.get(&base).and_then(|b| b.pool.clone());
                let info = ModelInfo {
                    id: adapter.clone(),
                    backend_model: adapter.clone(),
                    pool,
                };
                out.insert(adapter, info);
            }
        }
        out.into_values().collect()
    }

    /// Resolves a client-facing model name; a split alias draws from the router's seeded
    /// sequence (see [`RouterState::resolve_model_seeded`]).
    pub fn resolve_model(&self, name: &str) -> Option<Resolved> {
        self.resolve_model_seeded(name, None)
    }

    /// Resolves the model of a request with `headers`: a split alias draws from the hash of
    /// its `x-request-id` when it has one (the Pick API and the gateway call this).
    pub fn resolve_with_headers(
        &self,
        name: &str,
        headers: Option<&http::HeaderMap>,
    ) -> Option<Resolved> {
        self.resolve_model_seeded(name, super::policy::request_seed(headers))
    }

    /// Resolves a client-facing model name. A split alias (pool `modelAliases[].split`)
    /// draws one of its models by weight from `seed` (the request id's hash), or from the
    /// router's own seeded sequence without one: the same seed always resolves the same way.
    pub fn resolve_model_seeded(&self, name: &str, seed: Option<u64>) -> Option<Resolved> {
        let split = {
            let catalog = self.0.catalog.read();
            catalog.pools.iter().find_map(|p| {
                p.models
                    .iter()
                    .find(|m| m.name == name && !m.split.is_empty())
                    .map(|m| (p.name.clone(), m.split.clone()))
            })
        };
        if let Some((pool, shares)) = split {
            let seed = seed.unwrap_or_else(|| self.next_seed());
            let i = kvroute_policy::weighted_choice(seed, shares.iter().map(|s| s.1))
                .unwrap_or_default();
            let (model, percent) = shares.get(i).cloned().unwrap_or_default();
            let lora_base = self.adapter_base(&model);
            return Some(Resolved {
                backend_model: model.clone(),
                pool: Some(pool),
                alias: Some(AliasDraw {
                    alias: name.to_string(),
                    model,
                    percent,
                    seed,
                }),
                lora_base,
            });
        }
        self.models()
            .into_iter()
            .find(|m| m.id == name)
            .map(|m| Resolved {
                lora_base: self.adapter_base(&m.backend_model),
                backend_model: m.backend_model,
                pool: m.pool,
                alias: None,
            })
    }

    /// The auth block of `pool` (`None`: no such pool, or it has none).
    pub fn pool_auth(&self, pool: &str) -> Option<std::sync::Arc<crate::tenant::PoolAuth>> {
        self.0
            .catalog
            .read()
            .pools
            .iter()
            .find(|p| p.name == pool)
            .and_then(|p| p.auth.clone())
    }

    /// Every pool's name and auth block.
    pub fn pool_auths(&self) -> Vec<(String, Option<std::sync::Arc<crate::tenant::PoolAuth>>)> {
        self.0
            .catalog
            .read()
            .pools
            .iter()
            .map(|p| (p.name.clone(), p.auth.clone()))
            .collect()
    }

    pub(super) fn pool_worker_sets(&self, pool: Option<&str>) -> Vec<String> {
        let Some(pool) = pool else { return Vec::new() };
        self.0
            .catalog
            .read()
            .pools
            .iter()
            .find(|p| p.name == pool)
            .map(|p| p.worker_sets.clone())
            .unwrap_or_default()
    }

    /// (worker id, address, core id, WorkerSet) of every routable worker of `model`, sorted
    /// by id; with `lora`, only those whose sidecar lists that adapter.
    pub(super) fn routable_workers(
        &self,
        model: &str,
        lora: Option<&str>,
        sets: &[String],
        exclude: &[String],
    ) -> Vec<(String, String, WorkerId, String)> {
        let catalog = self.0.catalog.read();
        let sidecars = self.0.sidecars.read();
        let live = |s: &SidecarView| s.synced && s.stream_open && serves(s, lora);
        let mut out = Vec::new();
        let in_sets = |ws: &str| sets.is_empty() || sets.iter().any(|s| s == ws);
        let mut listed_keys = Vec::new();
        for w in &catalog.workers {
            let Some((key, s)) = find_sidecar(&sidecars, w) else {
                continue;
            };
            listed_keys.push(key.to_string());
            if w.model == model
                && w.ready
                && in_sets(&w.worker_set)
                && !exclude.contains(&w.id)
                && live(s)
            {
                out.push((
                    w.id.clone(),
                    w.address.clone(),
                    s.worker,
                    w.worker_set.clone(),
                ));
            }
        }
        if self.0.config.route_unlisted {
            for (key, s) in sidecars.iter() {
                if s.identity.model == model
                    && live(s)
                    && !listed_keys.contains(key)
                    && in_sets(&s.identity.worker_set)
                    && !exclude.contains(key)
                {
                    out.push((
                        key.clone(),
                        s.identity.address.clone(),
                        s.worker,
                        s.identity.worker_set.clone(),
                    ));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The ids of `resolved`'s routable workers whose address `keep` rejects: what a pick
    /// restricted to a subset of endpoints excludes (the endpoint picker's subset hint).
    pub fn routable_outside(
        &self,
        resolved: &Resolved,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let sets = self.pool_worker_sets(resolved.pool.as_deref());
        self.routable_workers(resolved.served_model(), resolved.lora(), &sets, &[])
            .into_iter()
            .filter(|(_, address, _, _)| !keep(address))
            .map(|(id, ..)| id)
            .collect()
    }
}

impl RouterState {
    /// May `caller` open an Ingest stream for `worker_id`? Anonymous (plaintext) callers
    /// may, as before TLS. A verified caller must hold the WorkerSet identity of a worker
    /// discovery lists under exactly that id, and connect from its pod IP when discovery
    /// knows it; `--route-unlisted` does not apply. Returns the listed worker (its address
    /// and WorkerSet replace what the stream claims), `None` for anonymous callers.
    pub fn authorize_stream(
        &self,
        caller: &Caller,
        worker_id: &str,
    ) -> Result<Option<DiscoveredWorker>, StreamRefused> {
        let Caller::Verified { identity, ip } = caller else {
            return Ok(None);
        };
        let Identity::WorkerSet { namespace, name } = identity else {
            return Err(StreamRefused::NotAWorkerSet(identity.uri()));
        };
        let catalog = self.0.catalog.read();
        let w = catalog
            .workers
            .iter()
            .find(|w| w.id == worker_id)
            .ok_or_else(|| StreamRefused::Unlisted(worker_id.to_string()))?;
        if w.namespace != *namespace || w.worker_set != *name {
            return Err(StreamRefused::ForeignWorkerSet {
                worker: worker_id.to_string(),
                listed: format!("{}/{}", w.namespace, w.worker_set),
                claimed: format!("{namespace}/{name}"),
            });
        }
        if let Some(expected) = w.pod_ip
            && *ip != Some(expected)
        {
            return Err(StreamRefused::PeerAddress {
                worker: worker_id.to_string(),
                expected,
                got: ip.map_or_else(|| "unknown".to_string(), |ip| ip.to_string()),
            });
        }
        Ok(Some(w.clone()))
    }
}

/// The sidecar view of a discovered worker: by id, else by address.
pub(super) fn find_sidecar<'a>(
    sidecars: &'a HashMap<String, SidecarView>,
    w: &DiscoveredWorker,
) -> Option<(&'a str, &'a SidecarView)> {
    if let Some((k, s)) = sidecars.get_key_value(&w.id) {
        return Some((k.as_str(), s));
    }
    sidecars
        .iter()
        .find(|(_, s)| !w.address.is_empty() && s.identity.address == w.address)
        .map(|(k, s)| (k.as_str(), s))
}
