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
        vec!["bench", "--rate-sweep", "1,x"],
        vec!["bench", "--rate-sweep", "0"],
        vec!["bench", "--rate-sweep=-2"],
        vec!["bench", "--rate-sweep", "nan"],
        vec!["bench", "--rate-sweep", ","],
        vec!["bench", "--profile", "/nonexistent/profile.json"],
    ] {
        let args = Cli::parse_from(flags.clone()).args;
        assert!(bench::run_sim(&args).is_err(), "{flags:?} should fail");
    }
}

#[test]
fn open_loop_levels_report_each_rate_and_the_peak_within_the_slo() {
    // A rate the pool serves easily and one far beyond it (300 prompts of 4,096 new tokens in
    // 6 s, minutes of prefill): the first meets the 8 s p90 SLO, the second cannot, so the
    // peak is the first's.
    let args = Cli::parse_from([
        "bench",
        "--quick",
        "--workload",
        "hot-prefix",
        "--policies",
        "kvroute,random",
        "--sessions",
        "300",
        "--question-tokens",
        "4096",
        "--rate-sweep",
        "0.5,50",
    ])
    .args;
    let v = bench::report::json(&bench::run_sim(&args).expect("sim runs"));
    assert_eq!(v["config"]["rate_sweep"], serde_json::json!([0.5, 50.0]));
    for policy in ["kvroute", "random"] {
        let p = &v["workloads"]["hot-prefix"][policy];
        let levels = p["rate_sweep"].as_array().expect("rate_sweep");
        assert_eq!(levels.len(), 2, "{policy}: {levels:?}");
        let (light, heavy) = (&levels[0], &levels[1]);
        assert_eq!(light["rate_per_s"].as_f64(), Some(0.5));
        assert_eq!(heavy["rate_per_s"].as_f64(), Some(50.0));
        assert_eq!(light["requests"].as_u64(), Some(300), "{policy}");
        assert!(
            light["ttft_p90_s"].as_f64().expect("p90") <= 8.0,
            "{policy}: {light}"
        );
        assert!(
            heavy["ttft_p90_s"].as_f64().expect("p90") > 8.0,
            "{policy}: {heavy}"
        );
        assert_eq!(
            p["peak_goodput_open_rpm"].as_f64(),
            light["throughput_rpm"].as_f64(),
            "{policy}"
        );
    }
    // Without the flag there is no open-loop figure at all.
    let plain = Cli::parse_from(["bench", "--quick", "--workload", "shared-prefix"]).args;
    let v = bench::report::json(&bench::run_sim(&plain).expect("sim runs"));
    assert!(v["config"].get("rate_sweep").is_none());
    assert!(v["workloads"]["shared-prefix"]["kvroute"]["peak_goodput_open_rpm"].is_null());
}
