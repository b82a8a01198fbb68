//! `kvroute-mock-vllm`: thin entry point; everything happens in [`kvroute_mock_vllm::run`].

use clap::Parser;

#[derive(Parser)]
#[command(name = "kvroute-mock-vllm", version)]
struct Cli {
    #[command(flatten)]
    args: kvroute_mock_vllm::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kvroute_mock_vllm::run(Cli::parse().args).await
}
