//! kvroute-mock-vllm: a process that clients, sidecars and routers cannot tell from a vLLM 0.33
//! server except by speed and by the text it generates. No GPU: a pure engine model runs in
//! simulated time and a driver paces it against the wall clock (`--speedup`).
//!
//! ```text
//!  HTTP (axum, OpenAI API) --tokenize--> driver (tokio, wall clock / speedup) --> engine (pure)
//!        ^ SSE tokens <------------------------+                                   |
//!                                              +--> ZMQ PUB + ROUTER replay <-- KV events
//! ```
//!
//! [`engine`] is the pure model (also used directly by the bench simulation and the oracle
//! policy); [`vllm_hash`] reproduces vLLM's block hashes.

pub mod engine;
pub mod vllm_hash;

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

/// Runs the command (stub).
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
