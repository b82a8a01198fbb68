//! `kvroute bench` (stub).

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {}

/// Runs the command (stub).
pub async fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
