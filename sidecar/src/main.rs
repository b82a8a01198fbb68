//! `kvroute-sidecar`: thin entry point; everything happens in [`kvroute_sidecar::run`].

use clap::Parser;

#[derive(Parser)]
#[command(name = "kvroute-sidecar", version)]
struct Cli {
    #[command(flatten)]
    args: kvroute_sidecar::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kvroute_sidecar::run(Cli::parse().args).await
}
