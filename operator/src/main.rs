//! `kvroute-operator`: thin entry point; everything happens in [`kvroute_operator::run`].

use clap::Parser;

#[derive(Parser)]
#[command(name = "kvroute-operator", version)]
struct Cli {
    #[command(flatten)]
    args: kvroute_operator::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kvroute_operator::run(Cli::parse().args).await
}
