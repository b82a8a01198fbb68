//! Any byte string fed to `parse_documents` (the router's file mode reads user YAML) must give
//! Ok or a typed error, never a panic; whatever parses must also validate without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(docs) = kvroute_crds::parse_documents(text) {
        for doc in docs {
            let _ = match doc {
                kvroute_crds::AnyResource::WorkerSet(w) => w.spec.validate(),
                kvroute_crds::AnyResource::Pool(p) => p.spec.validate(),
                kvroute_crds::AnyResource::Policy(p) => p.spec.validate(),
                kvroute_crds::AnyResource::Provider(p) => p.spec.validate(),
                kvroute_crds::AnyResource::GatewayBackend(b) => b.spec.validate(),
                kvroute_crds::AnyResource::GiePool(p) => p
                    .issues()
                    .into_iter()
                    .map(|i| kvroute_crds::SpecIssue::new("metadata.annotations", i.to_string()))
                    .collect(),
                kvroute_crds::AnyResource::Secret(_) | kvroute_crds::AnyResource::Pod(_) => {
                    Vec::new()
                }
            };
        }
    }
});
