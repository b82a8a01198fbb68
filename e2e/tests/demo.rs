//! Runs a small `kvroute demo` (real processes on loopback: mock workers, sidecars, router)
//! and checks its JSON: both policies present and every request served. No figure is asserted:
//! the numbers depend on the machine.

use std::path::PathBuf;

use kvroute_e2e::demo::{DemoArgs, run};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_demo_serves_every_request_with_both_policies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("figures.json");
    let chart = dir.path().join("ttft.svg");
    let requests = 8;
    let args = DemoArgs {
        workers: 2,
        speedup: 20.0,
        requests,
        concurrency: 2,
        prefixes: 2,
        prefix_tokens: 200,
        question_tokens: 16,
        min_output_tokens: 4,
        max_output_tokens: 8,
        seed: 1,
        profile: "l40s-qwen3-32b-fp8".into(),
        tokenizer: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/tokenizers/qwen3"
        )),
        policies: vec!["random".into(), "kvroute".into()],
        chart: chart.clone(),
        json: Some(json_path.clone()),
        log_dir: Some(dir.path().join("logs")),
        no_progress: true,
    };
    if let Err(e) = run(args).await {
        // Show the processes' logs: they say why a deployment did not come up.
        for entry in walk(&dir.path().join("logs")) {
            let text = std::fs::read_to_string(&entry).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            eprintln!(
                "== {}\n{}",
                entry.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        panic!("demo failed: {e:#}");
    }
    let figures: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json written"))
            .expect("json");
    for policy in ["random", "kvroute"] {
        let p = &figures["policies"][policy];
        assert_eq!(p["completed"], requests, "{policy}: {p}");
        assert_eq!(p["failed"], 0, "{policy}: {p}");
        let per_worker: Vec<u64> = p["requests_per_worker"]
            .as_array()
            .expect("per worker")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert_eq!(per_worker.len(), 2);
        assert_eq!(
            per_worker.iter().sum::<u64>(),
            requests as u64,
            "{policy}: every request has a worker"
        );
        for key in ["ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "cache_hit_rate"] {
            assert!(
                p[key].as_f64().is_some_and(|x| x >= 0.0),
                "{policy}.{key}: {p}"
            );
        }
    }
    let svg = std::fs::read_to_string(&chart).expect("chart written");
    assert_eq!(svg.matches("<polyline").count(), 2);
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
