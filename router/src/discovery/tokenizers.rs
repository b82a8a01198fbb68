//! The tokenizer side of discovery: each served model's tokenizer source (from its
//! WorkerSet's `spec.model`, defaults applied) and which client-facing names may be routed on
//! load alone while a tokenizer is missing (pools with `spec.routing.allowLoadOnly`). Pure.
//!
//! ```text
//! WorkerSets --model.tokenizer_source()--> sources{served model: source}
//! Pools (allowLoadOnly) + Catalog pool views --> load_only{names}
//!     --> TokenizerPlan --> Tokenizers::set_plan
//! ```

use kvroute_crds::{InferencePool, InferenceWorkerSet};

use crate::state::Catalog;
use crate::tokenizer_registry::TokenizerPlan;

/// Builds the plan. When two WorkerSets serve the same model name with different sources,
/// the first by `namespace/name` wins.
pub fn build_tokenizer_plan(
    sets: &[InferenceWorkerSet],
    pools: &[InferencePool],
    catalog: &Catalog,
) -> TokenizerPlan {
    let key = |s: &InferenceWorkerSet| {
        (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        )
    };
    let mut ordered: Vec<&InferenceWorkerSet> = sets.iter().collect();
    ordered.sort_by_key(|s| key(s));
    let mut plan = TokenizerPlan::default();
    for set in ordered {
        let model = set.spec.model.served().to_string();
        if model.is_empty() {
            continue;
        }
        plan.sources
            .entry(model)
            .or_insert_with(|| set.spec.model.tokenizer_source());
    }
    for pool in pools.iter().filter(|p| p.spec.routing.allow_load_only) {
        let name = format!(
            "{}/{}",
            pool.metadata.namespace.as_deref().unwrap_or("default"),
            pool.metadata.name.as_deref().unwrap_or_default()
        );
        for view in catalog.pools.iter().filter(|v| v.name == name) {
            for m in &view.models {
                plan.load_only.insert(m.name.clone());
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{WorkerSource, build_catalog};
    use kvroute_crds::workerset::ResolvedTokenizer;
    use kvroute_crds::{AnyResource, parse_documents};

    const DOCS: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: ml}
spec:
  model: {name: Qwen/Qwen3-0.6B, servedName: qwen3}
  engine: {mode: mock}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: llama, namespace: ml}
spec:
  model:
    name: meta-llama/Llama-3.1-8B-Instruct
    tokenizer: {hub: {revision: abc123, tokenSecretRef: {name: hf, key: token}}}
  engine: {mode: mock}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: lenient, namespace: ml}
spec:
  targets: [{workerSet: qwen}]
  modelAliases: [{name: chat, model: qwen3}]
  routing: {allowLoadOnly: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: strict, namespace: ml}
spec:
  targets: [{workerSet: llama}]
"#;

    #[test]
    fn sources_default_to_the_model_repo_and_load_only_follows_the_pool() {
        let mut sets = Vec::new();
        let mut pools = Vec::new();
        for doc in parse_documents(DOCS).expect("parse") {
            match doc {
                AnyResource::WorkerSet(s) => sets.push(s),
                AnyResource::Pool(p) => pools.push(p),
                _ => {}
            }
        }
        let catalog = build_catalog(&sets, &pools, WorkerSource::Status);
        let plan = build_tokenizer_plan(&sets, &pools, &catalog);
        assert_eq!(
            plan.sources.get("qwen3"),
            Some(&ResolvedTokenizer::Hub {
                repo: "Qwen/Qwen3-0.6B".into(),
                revision: "main".into(),
                token: None
            })
        );
        assert_eq!(
            plan.sources.get("meta-llama/Llama-3.1-8B-Instruct"),
            Some(&ResolvedTokenizer::Hub {
                repo: "meta-llama/Llama-3.1-8B-Instruct".into(),
                revision: "abc123".into(),
                token: Some(("hf".into(), "token".into())),
            })
        );
        let load_only: Vec<&str> = plan.load_only.iter().map(String::as_str).collect();
        assert_eq!(load_only, vec!["chat", "qwen3"]);
    }
}
