//! CI smoke test of `kvroute bench --mode sim --quick`: it runs, covers every workload and
//! policy, and writes JSON of the documented shape with finite figures. No figure thresholds:
//! benchmarks are not timing assertions.

use clap::Parser;
use kvroute_e2e::bench::{self, BenchArgs, POLICIES};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

#[test]
fn quick_sim_writes_every_policy_and_workload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("bench.json");
    let svg_dir = dir.path().join("svg");
    let cli = Cli::parse_from([
        "bench",
        "--quick",
        "--json",
        json_path.to_str().expect("utf-8 path"),
        "--svg-dir",
        svg_dir.to_str().expect("utf-8 path"),
    ]);
    let result = bench::run_sim(&cli.args).expect("sim runs");
    bench::write_outputs(&result, &cli.args).expect("outputs written");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json written"))
            .expect("valid JSON");
    for workload in ["shared-prefix", "multi-turn", "independent", "mixed"] {
        for policy in POLICIES {
            let p = &v["workloads"][workload][policy];
            for key in [
                "ttft_p50_s",
                "ttft_p90_s",
                "ttft_p99_s",
                "e2e_p50_s",
                "cache_hit_rate",
                "peak_goodput_rpm",
            ] {
                let x = p[key].as_f64().unwrap_or(f64::NAN);
                assert!(
                    x.is_finite() && x >= 0.0,
                    "{workload}/{policy}/{key} = {}",
                    p[key]
                );
            }
            let served: u64 = p["requests_per_worker"]
                .as_array()
                .expect("requests_per_worker")
                .iter()
                .filter_map(|n| n.as_u64())
                .sum();
            assert_eq!(
                served,
                p["requests"].as_u64().expect("requests"),
                "{workload}/{policy}"
            );
            assert!(served > 0, "{workload}/{policy} served nothing");
            // Prediction truth is kvroute's figure: present for it only.
            assert_eq!(
                p["prediction"].is_object(),
                policy == "kvroute",
                "{workload}/{policy}: {}",
                p["prediction"]
            );
            // The per-request floor is a floor: no request beats it.
            assert_eq!(p["below_floor"].as_u64(), Some(0), "{workload}/{policy}");
            for key in ["ttft_over_floor_p50", "ttft_over_floor_p90"] {
                let x = p[key].as_f64().unwrap_or(f64::NAN);
                assert!(x >= 1.0 - 1e-9, "{workload}/{policy}/{key} = {}", p[key]);
            }
        }
    }
    assert!(v["goals"].as_array().is_some_and(|g| !g.is_empty()));
    let charts = std::fs::read_dir(&svg_dir).expect("svg dir").count();
    assert_eq!(charts, 8, "a CDF and a goodput chart per workload");
}

#[test]
fn same_seed_same_figures() {
    let args = Cli::parse_from([
        "bench",
        "--quick",
        "--workload",
        "shared-prefix",
        "--policies",
        "kvroute,random",
    ])
    .args;
    let a = serde_json::to_string(&bench::report::json(&bench::run_sim(&args).expect("run a")))
        .expect("json");
    let b = serde_json::to_string(&bench::report::json(&bench::run_sim(&args).expect("run b")))
        .expect("json");
    assert_eq!(a, b);
}

#[test]
fn bad_flags_are_errors_not_panics() {
    for flags in [
        vec!["bench", "--workload", "nope"],
        vec!["bench", "--policies", "kvroute,nope"],
        vec!["bench", "--workers", "0"],
        vec!["bench", "--concurrency-sweep", "4,x"],
        vec!["bench", "--profile", "/nonexistent/profile.json"],
    ] {
        let args = Cli::parse_from(flags.clone()).args;
        assert!(bench::run_sim(&args).is_err(), "{flags:?} should fail");
    }
}
