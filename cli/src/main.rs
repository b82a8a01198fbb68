//! `kvroute`: the one user-facing command. Every component also runs as a subcommand, so a
//! single binary can start a whole local deployment (`kvroute demo`) without building the
//! per-component binaries.
//!
//! ```text
//! kvroute demo | bench | tokenize | explain | crdgen | tenant-key   user commands
//! kvroute router | sidecar | mock-vllm | operator         components (same as kvroute-<name>)
//! ```

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kvroute",
    version,
    about = "KV-cache-aware inference router for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start mock workers, sidecars and the router on loopback and compare random routing with
    /// kvroute on a shared-prefix workload (a preset of `bench --mode live`).
    Demo(kvroute_e2e::demo::DemoArgs),
    /// Benchmark routing policies (simulated or live).
    Bench(Box<kvroute_e2e::bench::BenchArgs>),
    /// Tokenize a chat request or prompt like vLLM and print token ids and kvroute block hashes.
    Tokenize(kvroute_router::tokenize_cmd::TokenizeArgs),
    /// Ask a running router why it would route a request where it would.
    Explain(kvroute_router::explain_cmd::ExplainArgs),
    /// Write the CRD YAML (crds/) and the OLM bundle (bundle/) from the Rust types.
    Crdgen(kvroute_operator::crdgen::CrdgenArgs),
    /// Make tenant API keys (`tenant-key new --tenant T`: a key and its Secret line).
    TenantKey(kvroute_router::tenant_key_cmd::TenantKeyArgs),
    /// Run the router (same as `kvroute-router`).
    Router(Box<kvroute_router::Args>),
    /// Run the sidecar (same as `kvroute-sidecar`).
    Sidecar(kvroute_sidecar::Args),
    /// Run the mock vLLM worker (same as `kvroute-mock-vllm`).
    MockVllm(kvroute_mock_vllm::Args),
    /// Run the operator (same as `kvroute-operator`).
    Operator(kvroute_operator::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli { command } = Cli::parse();
    match command {
        Command::Demo(args) => kvroute_e2e::demo::run(args).await,
        Command::Bench(args) => kvroute_e2e::bench::run(*args).await,
        Command::Tokenize(args) => kvroute_router::tokenize_cmd::run(args).await,
        Command::Explain(args) => kvroute_router::explain_cmd::run(args).await,
        Command::Crdgen(args) => kvroute_operator::crdgen::run(args).await,
        Command::TenantKey(args) => kvroute_router::tenant_key_cmd::run(args).await,
        Command::Router(args) => kvroute_router::run(*args).await,
        Command::Sidecar(args) => kvroute_sidecar::run(args).await,
        Command::MockVllm(args) => kvroute_mock_vllm::run(args).await,
        Command::Operator(args) => kvroute_operator::run(args).await,
    }
}
