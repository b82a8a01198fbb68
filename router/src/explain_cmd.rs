//! `kvroute explain` (stub).

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {}

/// Runs the command (stub).
pub async fn run(_args: ExplainArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
