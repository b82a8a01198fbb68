// The gateway's pure wire modules, compiled in directly (`#[path]`) rather than through the
// `kvroute-router` crate, so the fuzz build does not pull axum, tonic, kube and the tokenizer
// onto a nightly toolchain. They depend only on serde_json, bytes and thiserror.

#[path = "../../src/gateway/error.rs"]
#[allow(dead_code)]
pub mod error;
#[path = "../../src/gateway/openai.rs"]
#[allow(dead_code)]
pub mod openai;
#[path = "../../src/gateway/anthropic.rs"]
#[allow(dead_code)]
pub mod anthropic;
#[path = "../../src/gateway/sse.rs"]
#[allow(dead_code)]
pub mod sse;

// error.rs names the router's pick and tenant error types by crate path; in the fuzz build
// they come from the router crate itself (already a dependency for ingest_session).
pub mod state {
    pub use kvroute_router::state::PickError;
}
pub mod tenant {
    pub use kvroute_router::tenant::{AuthError, LimitExceeded};
}
