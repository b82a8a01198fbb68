//! kvroute-router (work in progress).

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

/// Runs the command (stub).
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

pub mod explain_cmd;
pub mod gateway;
pub mod ingest;
pub mod metrics;
pub mod routing;
pub mod state;
pub mod tokenize_cmd;
