//! LoRA adapters on the state's side (docs/lora.md): which adapters the workers serve, from
//! their sidecars' load samples, and what an adapter name resolves to.
//!
//! ```text
//! LoadSample.lora_adapters --sidecar_load--> SidecarView.lora_adapters (per worker)
//! client model "sql" --adapter_base--> base model "qwen" (the workers listing "sql")
//!     Resolved { backend_model: "sql", lora_base: Some("qwen") }
//!     --routable_workers(qwen, Some(sql))--> only workers listing "sql"
//!     --RouteRequest { model: qwen, lora: Some(sql) }--> root_hash(qwen, sql)
//! ```
//!
//! The workers a sidecar counts for are those discovery lists (their discovered model is the
//! base), plus with `--route-unlisted` every reporting sidecar (its reported model). A name
//! that some worker serves as its model is never an adapter: the base model wins.

use std::collections::BTreeMap;

use super::RouterState;
use super::catalog::find_sidecar;
use super::sidecars::SidecarView;

/// Whether the worker of `s` serves `lora` (always, without an adapter).
pub(super) fn serves(s: &SidecarView, lora: Option<&str>) -> bool {
    lora.is_none_or(|l| s.lora_adapters.iter().any(|(name, _)| name == l))
}

impl RouterState {
    /// Every adapter any counted worker serves, with its base model (the worker's model; the
    /// lexically first when workers of several models list the same name), sorted by name.
    /// Names that are a worker's model are left out.
    pub(super) fn adapter_models(&self) -> Vec<(String, String)> {
        let catalog = self.0.catalog.read();
        let sidecars = self.0.sidecars.read();
        let mut bases: Vec<&str> = Vec::new();
        let mut adapters: BTreeMap<&str, &str> = BTreeMap::new();
        let mut counted: Vec<(&str, &SidecarView)> = Vec::new();
        let mut listed_keys: Vec<&str> = Vec::new();
        for w in &catalog.workers {
            bases.push(&w.model);
            if let Some((key, s)) = find_sidecar(&sidecars, w) {
                listed_keys.push(key);
                counted.push((&w.model, s));
            }
        }
        if self.0.config.route_unlisted {
            for (key, s) in sidecars.iter() {
                bases.push(&s.identity.model);
                if !listed_keys.contains(&key.as_str()) {
                    counted.push((&s.identity.model, s));
                }
            }
        }
        for (model, s) in counted {
            for (name, _) in &s.lora_adapters {
                let base = adapters.entry(name).or_insert(model);
                if model < *base {
                    *base = model;
                }
            }
        }
        adapters
            .into_iter()
            .filter(|(name, _)| !bases.contains(name))
            .map(|(name, base)| (name.to_string(), base.to_string()))
            .collect()
    }

    /// The base model of adapter `name` (see [`RouterState::adapter_models`]); `None` when no
    /// counted worker lists it, or when it is a worker's model.
    pub fn adapter_base(&self, name: &str) -> Option<String> {
        self.adapter_models()
            .into_iter()
            .find(|(adapter, _)| adapter == name)
            .map(|(_, base)| base)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kvroute_hash::{chain, root_hash};

    use crate::metrics::RouterMetrics;
    use crate::state::*;

    const BS: usize = 4;

    fn state() -> RouterState {
        let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let cfg = RouterConfig {
            route_unlisted: true,
            seed: 3,
            ..RouterConfig::default()
        };
        RouterState::new(cfg, metrics).expect("state")
    }

    /// Worker `id` of model `m` with `blocks` cached, serving `adapters` (`None`: a sidecar
    /// that does not report adapters).
    fn worker(s: &RouterState, id: &str, blocks: &[u64], adapters: Option<&[&str]>) {
        let now = Instant::now();
        let identity = SidecarIdentity {
            worker_id: id.into(),
            address: format!("{id}:8000"),
            model: "m".into(),
            block_size: BS,
            epoch: 1,
            worker_set: "ws".into(),
        };
        s.sidecar_snapshot_start(1, &identity, blocks, now)
            .expect("snapshot");
        assert!(s.sidecar_snapshot_chunk(1, id, &[], true, now));
        let load = LoadView {
            lora_adapters: adapters
                .map(|a| a.iter().map(|n| (n.to_string(), "m".to_string())).collect()),
            ..LoadView::default()
        };
        assert_eq!(s.sidecar_load(1, id, load, now), LoadApplied::Applied);
    }

    fn input<'a>(model: &'a str, tokens: &'a [u32]) -> PickInput<'a> {
        PickInput {
            model,
            prompt: Prompt::Tokens(tokens),
            cache_salt: None,
            lora: None,
            headers: None,
            resolved: None,
            exclude: &[],
            max_tokens: None,
            tenant: None,
            labels: &[],
            seed: None,
        }
    }

    fn cached(rec: &DecisionRecord, worker: &str) -> usize {
        rec.candidates
            .iter()
            .find(|c| c.worker == worker)
            .map_or(usize::MAX, |c| c.figures.cached_blocks)
    }

    #[test]
    fn an_adapter_routes_only_to_its_workers_and_hits_only_its_own_cache() {
        let s = state();
        let tokens: Vec<u32> = (1..=2048).collect();
        let under_sql = chain(root_hash("m", Some("sql")), &tokens, BS, &[]);
        let under_base = chain(root_hash("m", None), &tokens, BS, &[]);
        worker(&s, "a", &[], Some(&["sql"]));
        worker(&s, "a2", &under_sql, Some(&["sql", "de"]));
        worker(&s, "b", &under_base, Some(&["de"]));
        worker(&s, "plain", &under_base, None);

        let r = s.resolve_model("sql").expect("an adapter resolves");
        assert_eq!(
            (r.backend_model.as_str(), r.served_model(), r.lora()),
            ("sql", "m", Some("sql"))
        );
        let rec = s
            .explain(&input("sql", &tokens), Instant::now())
            .expect("explain");
        let mut names: Vec<&str> = rec.candidates.iter().map(|c| c.worker.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["a", "a2"], "only the workers serving sql");
        assert_eq!(rec.chosen, "a2", "the one holding the prompt under sql");
        assert_eq!((cached(&rec, "a2"), cached(&rec, "a")), (512, 0));
        assert_eq!(
            rec.lora,
            Some(LoraRecord {
                adapter: "sql".into(),
                base_model: "m".into()
            })
        );

        // "de": a2 serves it but holds the prompt under sql, b holds it under the base model.
        let rec = s
            .explain(&input("de", &tokens), Instant::now())
            .expect("explain");
        assert_eq!((cached(&rec, "a2"), cached(&rec, "b")), (0, 0));
        // The base model: every worker; only the blocks cached without an adapter count.
        let rec = s
            .explain(&input("m", &tokens), Instant::now())
            .expect("explain");
        assert_eq!(rec.candidates.len(), 4);
        assert_eq!((cached(&rec, "a2"), cached(&rec, "b")), (0, 512));
        assert_eq!(rec.lora, None);

        let picked = s
            .pick(&input("sql", &tokens), Instant::now())
            .expect("pick");
        assert_eq!(
            (picked.worker.as_str(), picked.backend_model.as_str()),
            ("a2", "sql"),
            "the body keeps the adapter's name"
        );
        assert_eq!(
            s.pick(&input("fr", &tokens), Instant::now())
                .map(|p| p.worker),
            Err(PickError::UnknownModel("fr".into()))
        );
    }

    #[test]
    fn adapter_lists_follow_the_samples_and_the_streams() {
        let s = state();
        worker(&s, "a", &[], Some(&["sql"]));
        let ids: Vec<String> = s.models().into_iter().map(|m| m.id).collect();
        assert_eq!(ids, ["m", "sql"]);
        // A sample without the field (an older sidecar) keeps the list; an empty list clears it.
        let now = Instant::now();
        s.sidecar_load(1, "a", LoadView::default(), now);
        assert_eq!(s.adapter_base("sql").as_deref(), Some("m"));
        let report = s.workers_report(now);
        assert_eq!(report.workers[0].lora_adapters, ["sql"]);
        // The stream closes: the adapter is still known, but no worker can take it now.
        s.sidecar_closed(1, "a", now);
        let tokens = [1, 2, 3, 4];
        assert_eq!(
            s.pick(&input("sql", &tokens), now).map(|p| p.worker),
            Err(PickError::NoReadyWorker("sql".into()))
        );
        worker(&s, "a", &[], Some(&[]));
        assert_eq!(s.adapter_base("sql"), None);
        assert_eq!(
            s.pick(&input("sql", &tokens), now).map(|p| p.worker),
            Err(PickError::UnknownModel("sql".into()))
        );
        // A worker's own model is never taken for an adapter.
        worker(&s, "a", &[], Some(&["m"]));
        assert_eq!(s.adapter_base("m"), None);
    }
}
