//! Active-active replicas benchmark (docs/replicas.md): 1, 2 and 3 router replicas in one
//! process with the peer exchange over loopback gRPC (see `kvroute_router::burst`). For each:
//! routed requests per second with every replica picking on a thread of its own (each request
//! completing at once, 2,048-token prompts), the pick's p50 and p99 (what the exchange adds
//! to a decision: publishing its placement, and the lock the peers' updates also take), and
//! the exchange's lag (from a wave of placements to every replica counting them).
//!
//! `cargo bench -p kvroute-router --bench replicas` (the figures depend on the machine's cores:
//! the replicas share them here, unlike separate pods).

use kvroute_router::burst::Cluster;

const PER_REPLICA: usize = 2_000;
const PROMPT: usize = 2_048;

fn main() -> anyhow::Result<()> {
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && a != "replicas")
    {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!("replicas | routed req/s | pick p50 | pick p99 | exchange lag per wave (mean)");
    for n in 1..=3usize {
        rt.block_on(async {
            let c = Cluster::start(n, 16, n > 1).await?;
            // Warm-up, then the measured run.
            c.throughput(200, PROMPT).await?;
            let t = c.throughput(PER_REPLICA, PROMPT).await?;
            let lag = if n > 1 {
                let b = c.burst(300, PROMPT, 32, 3).await?;
                format!(
                    "{:.0} µs",
                    b.sync_time.as_secs_f64() * 1e6 / b.waves.max(1) as f64
                )
            } else {
                "-".to_string()
            };
            println!(
                "{n} | {:.0} | {:.0} µs | {:.0} µs | {lag}",
                t.per_second(),
                t.p50.as_secs_f64() * 1e6,
                t.p99.as_secs_f64() * 1e6,
            );
            anyhow::Ok(())
        })?;
    }
    Ok(())
}
