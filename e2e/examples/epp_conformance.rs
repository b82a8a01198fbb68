//! `epp-conformance`: runs the black-box endpoint picker conformance suite
//! ([`kvroute_e2e::epp_conformance`]) against any Gateway API Inference Extension EPP and
//! prints one line per check; exits non-zero when a check fails.
//!
//! ```text
//! cargo run -p kvroute-e2e --example epp-conformance -- \
//!     --target http://epp.example:9002 --tls-dir ./picker-tls --server-name epp.example \
//!     --model tiny --endpoint 10.0.0.1:8000 --endpoint 10.0.0.2:8000 --min-fallbacks 1
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kvroute_e2e::epp_conformance::{Config, InFlightProbe, run};
use kvroute_tls::{ClientTls, WatchedClient};

#[derive(Parser)]
#[command(name = "epp-conformance")]
struct Cli {
    /// The picker's gRPC address, `http://HOST:PORT` (TLS, when wanted, comes from --tls-dir).
    #[arg(long)]
    target: String,
    /// Client certificate directory (tls.crt, tls.key, ca.crt) for an mTLS picker.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// The name the picker's certificate must carry (default: the target's host).
    #[arg(long)]
    server_name: Option<String>,
    /// The model the requests name.
    #[arg(long)]
    model: String,
    /// An endpoint (`ip:port`) of the model's pool; repeat for each.
    #[arg(long = "endpoint")]
    endpoints: Vec<String>,
    /// Fallbacks expected after the primary when the pool has more endpoints.
    #[arg(long, default_value_t = 0)]
    min_fallbacks: usize,
    /// `NAME=VALUE`: a request header with which the picker must answer 429.
    #[arg(long)]
    reject_429: Option<String>,
    /// `NAME=VALUE`: a request header with which the picker must answer 503.
    #[arg(long)]
    reject_503: Option<String>,
    /// A Prometheus URL and gauge of in-flight requests that must return to 0, as
    /// `URL#METRIC` (e.g. `http://127.0.0.1:9090/metrics#kvroute_router_in_flight`).
    #[arg(long)]
    in_flight: Option<String>,
    /// The picker's request body limit, to check that a larger body gets 413.
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Seconds to wait for any one answer.
    #[arg(long, default_value_t = 20)]
    deadline_s: u64,
}

fn header(v: Option<String>) -> anyhow::Result<Option<Vec<(String, String)>>> {
    v.map(|v| {
        let (k, v) = v
            .split_once('=')
            .with_context(|| format!("{v:?}: expected NAME=VALUE"))?;
        Ok(vec![(k.to_string(), v.to_string())])
    })
    .transpose()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let endpoint = tonic::transport::Endpoint::from_shared(cli.target.clone())
        .with_context(|| format!("--target {}", cli.target))?
        .connect_timeout(Duration::from_secs(cli.deadline_s));
    let channel = match &cli.tls_dir {
        Some(dir) => {
            let tls = ClientTls::new(
                WatchedClient::client(dir.clone())
                    .with_context(|| format!("--tls-dir {}", dir.display()))?,
                cli.server_name.as_deref(),
            )?;
            tls.channel(endpoint).await?
        }
        None => endpoint.connect().await.context("connect to the picker")?,
    };
    let mut cfg = Config::new(&cli.model, &cli.endpoints);
    cfg.min_fallbacks = cli.min_fallbacks;
    cfg.reject_429 = header(cli.reject_429)?;
    cfg.reject_503 = header(cli.reject_503)?;
    cfg.max_body_bytes = cli.max_body_bytes;
    cfg.deadline = Duration::from_secs(cli.deadline_s);
    cfg.in_flight = cli
        .in_flight
        .map(|v| {
            v.split_once('#')
                .map(|(url, metric)| InFlightProbe {
                    url: url.to_string(),
                    metric: metric.to_string(),
                })
                .with_context(|| format!("--in-flight {v:?}: expected URL#METRIC"))
        })
        .transpose()?;
    let report = run(channel, &cfg).await;
    println!("{report}");
    if !report.passed() {
        std::process::exit(1);
    }
    Ok(())
}
