//! `kvroute-router`: thin entry point; everything happens in [`kvroute_router::run`].

use clap::Parser;

#[derive(Parser)]
#[command(name = "kvroute-router", version)]
struct Cli {
    #[command(flatten)]
    args: kvroute_router::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kvroute_router::run(Cli::parse().args).await
}
