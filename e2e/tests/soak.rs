//! The soak over real processes on loopback (e2e/src/soak.rs; docs/soak.md): three mock vLLM
//! workers with their sidecars, two router replicas exchanging placements, seeded mixed load
//! (streaming and not, shared prefixes and independent prompts, three request rates in turn),
//! a fault every 25 s (worker killed, vLLM restarted, ZMQ gap, sidecar restarted, blackhole,
//! router replica restarted), and every router and sidecar sampled every 5 s (RSS, fds,
//! threads, alive tokio tasks). Build the binary first (`cargo build -p kvroute-cli`).
//!
//! `cargo test -p kvroute-e2e --test soak`: the CI version, 3 minutes of load.
//! `cargo test -p kvroute-e2e --release --test soak -- --ignored --nocapture`: the 30-minute
//! soak. `KVROUTE_SOAK_MINUTES` sets either one's length, `KVROUTE_SOAK_SEED` the seed,
//! `KVROUTE_SOAK_REPORT` the directory of the report (`soak-<N>m.json` and `.md`; default
//! `target/soak/`), whose path is printed.
//!
//! Each asserts: no request lost without a clear client error; in-flight and assignment counts
//! back to 0 and the cache views equal after the load stops; for the router and the sidecars
//! that lived through the run, the highest RSS of the last load cycle within 5% of the median
//! of the first cycle after the warm-up, and open fds and alive tasks, once the load drained,
//! back to their idle baseline (sampled in a quiet gap after the warm-up) within a small slack.

use std::path::PathBuf;
use std::time::Duration;

use kvroute_e2e::soak::{self, SoakConfig};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

async fn soak_for(default_minutes: u64) -> anyhow::Result<()> {
    let minutes = env_u64("KVROUTE_SOAK_MINUTES").unwrap_or(default_minutes);
    let seed = env_u64("KVROUTE_SOAK_SEED").unwrap_or(15);
    let dir = tempfile::tempdir()?;
    let tokenizer = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/tokenizers/qwen3"
    ));
    let cfg = SoakConfig::new(
        seed,
        Duration::from_secs(minutes * 60),
        tokenizer,
        dir.path().to_path_buf(),
    );
    let report = soak::run_soak(&cfg).await;
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("logs kept in {}", dir.keep().display());
            return Err(e);
        }
    };
    let out = std::env::var("KVROUTE_SOAK_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            let e2e = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            e2e.parent().unwrap_or(e2e).join("target/soak")
        });
    std::fs::create_dir_all(&out)?;
    let json = out.join(format!("soak-{minutes}m.json"));
    let md = out.join(format!("soak-{minutes}m.md"));
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    let text = report.markdown();
    std::fs::write(&md, &text)?;
    println!("{text}");
    println!("soak report: {} and {}", md.display(), json.display());
    let violations = report.violations();
    if !violations.is_empty() {
        eprintln!("logs kept in {}", dir.keep().display());
    }
    anyhow::ensure!(
        violations.is_empty(),
        "soak bounds missed:\n{}",
        violations.join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_ci() -> anyhow::Result<()> {
    soak_for(3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the 30-minute soak: run with --ignored (KVROUTE_SOAK_MINUTES sets its length)"]
async fn soak_full() -> anyhow::Result<()> {
    soak_for(30).await
}
