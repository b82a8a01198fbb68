//! `kvroute crdgen` (stub).

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct CrdgenArgs {}

/// Runs the command (stub).
pub async fn run(_args: CrdgenArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
