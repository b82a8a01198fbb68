//! A tiny `kvroute bench --mode live`: 2 mock workers with their sidecars and a router per
//! policy, on loopback. Checks that every request succeeded and that the JSON has the same
//! shape as the simulation's. No figure thresholds: benchmarks are not timing assertions.

use clap::Parser;
use kvroute_e2e::bench::live::{LiveConfig, run_live};
use kvroute_e2e::bench::{BenchArgs, write_outputs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_live_bench_writes_the_sim_json_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("live.json");
    let svg_dir = dir.path().join("svg");
    let cli = Cli::parse_from([
        "bench",
        "--mode",
        "live",
        "--workload",
        "multi-turn",
        "--policies",
        "random,kvroute,greedy-clairvoyant",
        "--workers",
        "2",
        "--sessions",
        "4",
        "--turns",
        "2",
        "--prefixes",
        "2",
        "--prefix-tokens",
        "64",
        "--question-tokens",
        "16",
        "--output-tokens",
        "4",
        "--concurrency",
        "2",
        "--concurrency-sweep",
        "2",
        "--json",
        json_path.to_str().expect("utf-8 path"),
        "--svg-dir",
        svg_dir.to_str().expect("utf-8 path"),
    ]);
    let live = LiveConfig {
        speedup: 20.0,
        tokenizer: concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3").into(),
        log_dir: Some(dir.path().join("logs")),
        external_routers: Vec::new(),
        external_workers: Vec::new(),
        text_prompts: false,
    };
    let result = run_live(&cli.args, &live).await.expect("live bench runs");
    write_outputs(&result, &cli.args).expect("outputs written");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json written"))
            .expect("valid JSON");
    assert_eq!(v["config"]["mode"], "live");
    // Multi-turn: each second turn carries the first turn and the tokens generated for it.
    for (workload, requests) in [("multi-turn", 8)] {
        let w = v["workloads"][workload]
            .as_object()
            .unwrap_or_else(|| panic!("{workload} missing: {v}"));
        let names: Vec<&str> = w.keys().map(String::as_str).collect();
        assert_eq!(names.len(), 2, "greedy-clairvoyant is sim-only: {names:?}");
        for policy in ["random", "kvroute"] {
            let p = &w[policy];
            for key in ["ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p50_s"] {
                let x = p[key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{workload}/{policy}/{key}: {p}"));
                assert!(x > 0.0, "{workload}/{policy}/{key} = {x}");
            }
            let hit = p["cache_hit_rate"].as_f64().expect("cache_hit_rate");
            assert!((0.0..=1.0).contains(&hit), "{workload}/{policy}: {hit}");
            assert!(p["peak_goodput_rpm"].as_f64().is_some(), "{p}");
            assert_eq!(p["requests"], requests, "{workload}/{policy}: {p}");
            assert_eq!(p["rejected"], 0, "{workload}/{policy}: failures");
            let per_worker: Vec<u64> = p["requests_per_worker"]
                .as_array()
                .expect("requests_per_worker")
                .iter()
                .filter_map(serde_json::Value::as_u64)
                .collect();
            assert_eq!(per_worker.len(), 2);
            assert_eq!(per_worker.iter().sum::<u64>(), requests, "{p}");
            assert_eq!(p["sweep"].as_array().map(Vec::len), Some(1), "{p}");
        }
    }
    assert!(svg_dir.read_dir().expect("svg dir").count() > 0);
}
