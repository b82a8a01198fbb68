//! `kvroute demo` (stub).

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {}

/// Runs the command (stub).
pub async fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
