//! A tiny `kvroute bench --mode scale`: 20 simulated sidecars into 1 and into 2 real router
//! processes (peer exchange on), a few seconds of deltas, loads and picks. Checks what must
//! hold whatever the machine: every stream opened and stayed open, every report sent was
//! acked (the router applies each report and acks its sequence number), every pick was
//! answered, and the picks went to workers whose snapshots hold the prompt (the index is
//! right under the load). No figure thresholds on time or memory: benchmarks are not timing
//! assertions.

use clap::Parser;
use kvroute_e2e::bench::BenchArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_scale_run_acks_every_report_and_routes_to_holders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("scale.json");
    let cli = Cli::parse_from([
        "bench",
        "--mode",
        "scale",
        "--sidecars",
        "20",
        "--snapshot-blocks",
        "64",
        "--scale-seconds",
        "2",
        "--picks-per-s",
        "20",
        "--scale-replicas",
        "1,2",
        "--json",
        json_path.to_str().expect("utf-8 path"),
    ]);
    kvroute_e2e::bench::run(cli.args).await.expect("scale run");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json written"))
            .expect("valid JSON");
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for (run, replicas) in runs.iter().zip([1, 2]) {
        assert_eq!(run["replicas"], replicas);
        assert_eq!(run["streams_failed"], 0, "{run}");
        let per = run["per_replica"].as_array().expect("per replica");
        assert_eq!(per.len(), replicas);
        for f in per {
            assert!(f["reports_acked"].as_u64().expect("acked") > 0, "{f}");
            assert_eq!(f["reports_unacked"], 0, "{f}");
            assert_eq!(f["pick_errors"], 0, "{f}");
            assert!(f["picks"].as_u64().expect("picks") > 0, "{f}");
            let hit = f["hit_share"].as_f64().expect("hit share");
            assert!(hit >= 0.9, "picks sent to workers without the prompt: {f}");
            for key in [
                "rss_after_snapshots_mib",
                "rss_end_mib",
                "ingest_lag_p99_ms",
            ] {
                assert!(f[key].as_f64().is_some_and(f64::is_finite), "{key}: {f}");
            }
        }
    }
}
