//! `kvroute tokenize` (stub).

/// Command-line arguments (stub: replaced by the component's real flags).
#[derive(Debug, Clone, clap::Args)]
pub struct TokenizeArgs {}

/// Runs the command (stub).
pub async fn run(_args: TokenizeArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
