//! The `kinference` scenario: Buoyant's published benchmark set-up, frozen, in simulation.
//!
//! ```text
//! SCENARIO (constants, frozen before kvroute ran on it)
//!   pool: 3 x l40s-27b-fp8            (kinference-hetero: 2 x l40s-27b-fp8 + h100-27b-fp8)
//!   shared-prefix / multi-turn / independent: GuideLLM-style prefix + prompt + output tokens,
//!   a headline concurrency and a concurrency sweep each
//!     |  for seed in seed..seed+K:  bench::run_sim per workload (every policy)
//!     |                             + kvroute's headline requests -> calibration::evaluate
//!     v
//! JSON (today's shape + published figures, prediction quality, spread over seeds), Markdown
//! ```
//!
//! The workload lengths and loads were searched so that *random* routing lands within ±15%
//! of Buoyant's published random figures (bench/README.md, "The kinference scenario", has
//! the table of tries and their commands); only then was kvroute run on it. The engine
//! profile was not tuned: its numbers come from shared/reference/l40s-profile.md and public
//! GPU figures (mock-vllm/profiles/). The router starts from a generic prior
//! (profiles::GENERIC_PRIOR), not the profile's speed.

use std::fmt::Write as _;

use anyhow::{Context, bail};
use kvroute_router::routing::BoundConfig;
use serde::Serialize;
use serde_json::{Value, json};

use super::calibration::PredictionQuality;
use super::report::{self, num};
use super::workload::{WorkloadKind, WorkloadSpec};
use super::{BenchArgs, PolicyResult, SuiteResult, WorkloadResult, run_sim};

/// One workload of a scenario and the load it runs at.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioWorkload {
    /// Sessions, lengths and output tokens.
    pub spec: WorkloadSpec,
    /// Closed-loop clients of the headline run.
    pub concurrency: usize,
    /// Concurrency levels of the goodput sweep.
    pub sweep: &'static [usize],
}

/// A frozen benchmark set-up.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    /// `kinference` or `kinference-hetero`.
    pub name: &'static str,
    /// Worker profiles (sim::SimConfig::profile: worker i runs the `i % len`-th).
    pub pool: &'static str,
    /// Workers per policy.
    pub workers: usize,
    /// Shared prefix, multi-turn, independent.
    pub workloads: Vec<ScenarioWorkload>,
    /// Whether Buoyant's published figures describe this pool (only the all-L40S one).
    pub published_applies: bool,
    /// The CI smoke size (`--quick`), not the calibrated one.
    pub quick: bool,
}

/// The three L40S workers of Buoyant's benchmark.
pub const L40S_POOL: &str = "l40s-27b-fp8";
/// The heterogeneous pool: two L40S and one H100, each worker's speed learned online.
pub const HETERO_POOL: &str = "l40s-27b-fp8,l40s-27b-fp8,h100-27b-fp8";

/// Shared prefix: GuideLLM `prefix_tokens=SP_PREFIX_TOKENS, prefix_count=SP_PREFIXES,
/// prompt_tokens=SP_PROMPT_TOKENS, output_tokens=SP_OUTPUT_TOKENS`. The prefix length is the
/// second search's (bench/README.md, "The second search"): at 38,912 random's peak goodput
/// was 10.3 req/min against Buoyant's 14 on the reported seeds.
const SP_PREFIXES: usize = 9;
const SP_PREFIX_TOKENS: usize = 36_864;
const SP_PROMPT_TOKENS: usize = 1_024;
const SP_OUTPUT_TOKENS: u32 = 128;
const SP_SESSIONS: usize = 384;
const SP_CONCURRENCY: usize = 8;
/// Conversations: a first message, then `MT_TURNS - 1` follow-ups after the whole history.
const MT_FIRST_TOKENS: usize = 10_240;
const MT_PROMPT_TOKENS: usize = 1_024;
const MT_OUTPUT_TOKENS: u32 = 128;
const MT_TURNS: usize = 5;
const MT_SESSIONS: usize = 96;
const MT_CONCURRENCY: usize = 8;
/// Unrelated prompts as long as a shared-prefix request, at 6 clients: at 8, random's median
/// TTFT was 1.2-1.3x Buoyant's (prompts queued behind each other), at 6 and below it is the
/// idle prefill time, as Buoyant's random and Kinference figures (6.92 and 6.83 s) suggest
/// (bench/README.md, "The second search").
const IN_PROMPT_TOKENS: usize = SP_PREFIX_TOKENS + SP_PROMPT_TOKENS;
const IN_OUTPUT_TOKENS: u32 = SP_OUTPUT_TOKENS;
const IN_SESSIONS: usize = 384;
const IN_CONCURRENCY: usize = 6;
/// GuideLLM-style concurrency sweep, fine at the low levels where random meets the SLO.
const SWEEP: &[usize] = &[1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32];
/// Sessions per sweep level: p90 of 64 requests (the suite's default at low levels) swung
/// random's peak goodput by 30% between seeds.
const SWEEP_SESSIONS: usize = 192;
/// `--quick`: a CI smoke size (not calibrated).
const QUICK_SESSIONS: usize = 12;
const QUICK_SWEEP: &[usize] = &[2, 4];

impl Scenario {
    /// The scenario called `name`.
    pub fn by_name(name: &str, quick: bool) -> anyhow::Result<Self> {
        let (pool, published_applies) = match name {
            "kinference" => (L40S_POOL, true),
            "kinference-hetero" => (HETERO_POOL, false),
            other => {
                bail!("unknown --scenario {other:?}: expected kinference or kinference-hetero")
            }
        };
        let base = WorkloadSpec::default_for(WorkloadKind::SharedPrefix);
        let mut workloads = vec![
            ScenarioWorkload {
                spec: WorkloadSpec {
                    kind: WorkloadKind::SharedPrefix,
                    sessions: SP_SESSIONS,
                    prefixes: SP_PREFIXES,
                    prefix_tokens: SP_PREFIX_TOKENS,
                    question_tokens: SP_PROMPT_TOKENS,
                    output_tokens: SP_OUTPUT_TOKENS,
                    max_output_tokens: None,
                    ..base.clone()
                },
                concurrency: SP_CONCURRENCY,
                sweep: SWEEP,
            },
            ScenarioWorkload {
                spec: WorkloadSpec {
                    kind: WorkloadKind::MultiTurn,
                    sessions: MT_SESSIONS,
                    prefixes: 0,
                    prefix_tokens: 0,
                    first_turn_tokens: MT_FIRST_TOKENS,
                    question_tokens: MT_PROMPT_TOKENS,
                    output_tokens: MT_OUTPUT_TOKENS,
                    max_output_tokens: None,
                    turns: MT_TURNS,
                    ..base.clone()
                },
                concurrency: MT_CONCURRENCY,
                sweep: SWEEP,
            },
            ScenarioWorkload {
                spec: WorkloadSpec {
                    kind: WorkloadKind::Independent,
                    sessions: IN_SESSIONS,
                    prefixes: 0,
                    prefix_tokens: 0,
                    question_tokens: IN_PROMPT_TOKENS,
                    output_tokens: IN_OUTPUT_TOKENS,
                    max_output_tokens: None,
                    ..base
                },
                concurrency: IN_CONCURRENCY,
                sweep: SWEEP,
            },
        ];
        if quick {
            for w in &mut workloads {
                w.spec.sessions = QUICK_SESSIONS.min(w.spec.sessions);
                w.concurrency = w.concurrency.min(4);
                w.sweep = QUICK_SWEEP;
            }
        }
        Ok(Scenario {
            name: if name == "kinference" {
                "kinference"
            } else {
                "kinference-hetero"
            },
            pool,
            workers: 3,
            workloads,
            published_applies,
            quick,
        })
    }

    /// The flags of `kvroute bench --mode sim` that run workload `w` of this scenario with
    /// `seed`, everything else taken from `args` (policies, report delay, scrape interval).
    pub fn bench_args(&self, w: &ScenarioWorkload, seed: u64, args: &BenchArgs) -> BenchArgs {
        let s = &w.spec;
        BenchArgs {
            mode: "sim".into(),
            workload: s.kind.name().into(),
            workers: self.workers,
            seed: Some(seed),
            generic_prior: true,
            scenario: None,
            seeds: 1,
            concurrency: w.concurrency,
            sweep_sessions: Some(if self.quick {
                QUICK_SESSIONS
            } else {
                SWEEP_SESSIONS
            }),
            concurrency_sweep: w
                .sweep
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            rate: None,
            sessions: Some(s.sessions),
            prefixes: Some(s.prefixes),
            prefix_tokens: Some(s.prefix_tokens),
            question_tokens: Some(s.question_tokens),
            output_tokens: Some(s.output_tokens),
            max_output_tokens: s.max_output_tokens,
            turns: Some(s.turns),
            first_turn_tokens: Some(s.first_turn_tokens),
            profile: self.pool.into(),
            json: None,
            markdown: None,
            svg_dir: None,
            quick: false,
            repeats: 1,
            records: None,
            ..args.clone()
        }
    }
}

/// One figure Buoyant published for random routing and for Kinference.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Published {
    /// Workload name.
    pub workload: &'static str,
    /// `ttft_p50_s`, `e2e_p50_s` or `peak_goodput_rpm`.
    pub figure: &'static str,
    /// Random routing's published value.
    pub random: f64,
    /// Kinference's published value.
    pub kinference: f64,
}

/// Buoyant's published figures (issue 16, item 5): 3 L40S, p90 TTFT <= 8 s goodput.
pub const PUBLISHED: [Published; 5] = [
    Published {
        workload: "shared-prefix",
        figure: "ttft_p50_s",
        random: 6.88,
        kinference: 0.31,
    },
    Published {
        workload: "shared-prefix",
        figure: "e2e_p50_s",
        random: 20.5,
        kinference: 11.3,
    },
    Published {
        workload: "shared-prefix",
        figure: "peak_goodput_rpm",
        random: 14.0,
        kinference: 103.0,
    },
    Published {
        workload: "multi-turn",
        figure: "ttft_p50_s",
        random: 1.70,
        kinference: 0.59,
    },
    Published {
        workload: "independent",
        figure: "ttft_p50_s",
        random: 6.92,
        kinference: 6.83,
    },
];

/// How far random may land from the published random figure and still count as the same
/// operating point.
pub const CALIBRATION_TOLERANCE: f64 = 0.15;

/// One figure of one policy's run.
pub fn figure(p: &PolicyResult, name: &str) -> f64 {
    match name {
        "ttft_p50_s" => p.summary.ttft_p50_s,
        "ttft_p90_s" => p.summary.ttft_p90_s,
        "e2e_p50_s" => p.summary.e2e_p50_s,
        "peak_goodput_rpm" => p.peak_goodput_rpm,
        _ => f64::NAN,
    }
}

/// Everything one seed produced.
pub struct SeedRun {
    /// The seed.
    pub seed: u64,
    /// Every workload and policy, as `kvroute bench --mode sim` reports them.
    pub suite: SuiteResult,
    /// kvroute's prediction quality per workload.
    pub prediction: Vec<(String, PredictionQuality)>,
}

/// Runs the scenario for one seed.
pub fn run_seed(sc: &Scenario, seed: u64, args: &BenchArgs) -> anyhow::Result<SeedRun> {
    let mut suite: Option<SuiteResult> = None;
    let mut prediction = Vec::new();
    for w in &sc.workloads {
        let a = sc.bench_args(w, seed, args);
        let r = run_sim(&a)?;
        // kvroute's headline run, as `run_sim` measured it.
        let kvroute = r
            .workloads
            .iter()
            .flat_map(|wr| wr.policies.iter())
            .find(|p| p.policy == "kvroute");
        if let Some(q) = kvroute.and_then(|p| p.prediction.clone()) {
            prediction.push((w.spec.kind.name().to_string(), q));
        }
        match &mut suite {
            None => suite = Some(r),
            Some(s) => s.workloads.extend(r.workloads),
        }
    }
    let mut suite = suite.context("the scenario has no workload")?;
    suite.config.profile = sc.pool.into();
    Ok(SeedRun {
        seed,
        suite,
        prediction,
    })
}

/// `kvroute bench --mode sim --scenario NAME`: runs it for `--seeds` seeds from `--seed` and
/// writes the outputs the flags ask for.
pub fn run(name: &str, args: &BenchArgs) -> anyhow::Result<()> {
    let sc = Scenario::by_name(name, args.quick)?;
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let first = args.seed();
    let mut runs = Vec::new();
    for i in 0..args.seeds {
        let seed = first.wrapping_add(i);
        eprintln!(
            "scenario {} seed {seed} ({}/{})",
            sc.name,
            i + 1,
            args.seeds
        );
        runs.push(run_seed(&sc, seed, args)?);
    }
    let md = markdown(&sc, &runs);
    println!("{md}");
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&to_json(&sc, &runs))?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, &md).with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let (Some(dir), Some(head)) = (&args.svg_dir, runs.first()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        for (file, svg) in report::charts(&head.suite) {
            let path = dir.join(format!("{}-{file}", sc.name));
            std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
        }
    }
    Ok(())
}

fn workload<'a>(s: &'a SuiteResult, name: &str) -> Option<&'a WorkloadResult> {
    s.workloads.iter().find(|w| w.spec.kind.name() == name)
}

fn policy<'a>(s: &'a SuiteResult, w: &str, p: &str) -> Option<&'a PolicyResult> {
    workload(s, w)?.policies.iter().find(|x| x.policy == p)
}

/// Every policy's figure over the seeds: `(min, median, max, per seed)`.
fn spread(runs: &[SeedRun], w: &str, p: &str, fig: &str) -> (f64, f64, f64, Vec<f64>) {
    let v: Vec<f64> = runs
        .iter()
        .map(|r| policy(&r.suite, w, p).map_or(f64::NAN, |x| figure(x, fig)))
        .collect();
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, super::stats::quantile(&v, 0.5), max, v)
}

const SPREAD_FIGURES: [&str; 4] = ["ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "peak_goodput_rpm"];

/// Today's JSON (of the first seed) plus `scenario`, `published`, `prediction`, `seeds`.
pub fn to_json(sc: &Scenario, runs: &[SeedRun]) -> Value {
    let Some(head) = runs.first() else {
        return Value::Null;
    };
    let mut out = report::json(&head.suite);
    let published: Vec<Value> = PUBLISHED
        .iter()
        .map(|p| {
            let random = policy(&head.suite, p.workload, "random").map(|x| figure(x, p.figure));
            let kv = policy(&head.suite, p.workload, "kvroute").map(|x| figure(x, p.figure));
            json!({
                "workload": p.workload, "figure": p.figure,
                "published_random": p.random, "published_kinference": p.kinference,
                "random": random.map(num), "kvroute": kv.map(num),
                "random_over_published": random.map(|r| num(r / p.random)),
                "kvroute_over_kinference": kv.map(|k| num(k / p.kinference)),
                "applies": sc.published_applies,
            })
        })
        .collect();
    let mut seeds = serde_json::Map::new();
    for w in &sc.workloads {
        let name = w.spec.kind.name();
        let Some(wr) = workload(&head.suite, name) else {
            continue;
        };
        let mut per_policy = serde_json::Map::new();
        for p in &wr.policies {
            let mut figs = serde_json::Map::new();
            for fig in SPREAD_FIGURES {
                let (min, med, max, all) = spread(runs, name, &p.policy, fig);
                figs.insert(
                    fig.into(),
                    json!({"min": num(min), "median": num(med), "max": num(max),
                           "per_seed": all.into_iter().map(num).collect::<Vec<_>>()}),
                );
            }
            per_policy.insert(p.policy.clone(), Value::Object(figs));
        }
        seeds.insert(name.into(), Value::Object(per_policy));
    }
    let prediction: Vec<Value> = runs
        .iter()
        .map(|r| {
            json!({"seed": r.seed, "kvroute": r.prediction.iter().map(|(w, q)| {
                let mut v = report::prediction_json(q);
                if let Value::Object(m) = &mut v {
                    m.insert("workload".into(), json!(w));
                }
                v
            }).collect::<Vec<_>>()})
        })
        .collect();
    if let Value::Object(m) = &mut out {
        m.insert(
            "scenario".into(),
            json!({
                "name": sc.name, "pool": sc.pool, "workers": sc.workers,
                "workloads": sc.workloads,
                "router_prior": super::profiles::GENERIC_PRIOR,
                "seeds": runs.iter().map(|r| r.seed).collect::<Vec<_>>(),
            }),
        );
        m.insert("published".into(), Value::Array(published));
        m.insert("prediction".into(), Value::Array(prediction));
        m.insert("seeds".into(), Value::Object(seeds));
    }
    out
}

fn ratio_cell(x: f64, of: f64) -> String {
    if x.is_finite() && of.is_finite() && of != 0.0 {
        format!("{:.2}", x / of)
    } else {
        "-".into()
    }
}

/// The report: the scenario, the first seed's tables, the published comparison, prediction
/// quality and the spread over seeds.
pub fn markdown(sc: &Scenario, runs: &[SeedRun]) -> String {
    let mut s = String::new();
    let Some(head) = runs.first() else {
        return s;
    };
    let seeds: Vec<String> = runs.iter().map(|r| r.seed.to_string()).collect();
    let _ = writeln!(
        s,
        "## scenario {}: {} workers ({}), seeds {} (tables: seed {})\n",
        sc.name,
        sc.workers,
        sc.pool,
        seeds.join(", "),
        head.seed
    );
    let _ = writeln!(
        s,
        "| workload | sessions x turns | prefixes x prefix tokens | prompt tokens | output tokens | headline concurrency | sweep |\n|---|---|---|---:|---:|---:|---|"
    );
    for w in &sc.workloads {
        let spec = &w.spec;
        let first = if spec.kind == WorkloadKind::MultiTurn {
            format!(
                "{} first, then {}",
                spec.first_turn_tokens, spec.question_tokens
            )
        } else {
            spec.question_tokens.to_string()
        };
        let _ = writeln!(
            s,
            "| {} | {} x {} | {} | {} | {} | {} | {:?} |",
            spec.kind.name(),
            spec.sessions,
            if spec.kind == WorkloadKind::MultiTurn {
                spec.turns
            } else {
                1
            },
            if spec.kind == WorkloadKind::SharedPrefix {
                format!("{} x {}", spec.prefixes, spec.prefix_tokens)
            } else {
                "-".into()
            },
            first,
            spec.output_tokens,
            w.concurrency,
            w.sweep
        );
    }
    let _ = writeln!(s);
    s.push_str(&report::markdown(&head.suite));
    let _ = writeln!(
        s,
        "\n### against Buoyant's published figures (seed {})\n",
        head.seed
    );
    if !sc.published_applies {
        let _ = writeln!(
            s,
            "Buoyant published figures for three L40S only; on this pool they are shown for scale, not as a target.\n"
        );
    }
    let _ = writeln!(
        s,
        "| workload | figure | published random | random here | here / published | published Kinference | kvroute | kvroute / Kinference |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for p in PUBLISHED {
        let r = policy(&head.suite, p.workload, "random").map_or(f64::NAN, |x| figure(x, p.figure));
        let k =
            policy(&head.suite, p.workload, "kvroute").map_or(f64::NAN, |x| figure(x, p.figure));
        let within = (r / p.random - 1.0).abs() <= CALIBRATION_TOLERANCE;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {}{} | {} | {:.2} | {} |",
            p.workload,
            p.figure,
            p.random,
            r,
            ratio_cell(r, p.random),
            if within || !r.is_finite() {
                ""
            } else {
                " (outside ±15%)"
            },
            p.kinference,
            k,
            ratio_cell(k, p.kinference)
        );
    }
    let _ = writeln!(
        s,
        "\nFor TTFT and e2e a kvroute / Kinference ratio below 1 is better; for goodput above 1.\n"
    );
    if runs.iter().any(|r| !r.prediction.is_empty()) {
        let _ = writeln!(
            s,
            "### kvroute's TTFT predictions (headline runs, after warm-up)\n\nError: median |predicted - observed| / observed (target <= 10%). Bound: online p90 upper bound from the last {} ratios observed / predicted seen before each request arrived, at a level adapted to the misses seen so far (adaptive conformal inference, step {}; target coverage 90 ± 3%); next to it, the same at the fixed level 0.9 (split conformal).\n\n| seed | workload | requests | median error | error target met | p90 bound coverage | coverage target met | median bound / observed | split conformal coverage | median bias (obs - pred) / obs |\n|---|---|---:|---:|---|---:|---|---:|---:|---:|",
            BoundConfig::default().window,
            BoundConfig::default().gamma
        );
        for r in runs {
            for (w, q) in &r.prediction {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.1}% | {} | {:.1}% ({} bounded) | {} | {:.2} | {:.1}% | {:+.1}% |",
                    r.seed,
                    w,
                    q.requests,
                    q.median_rel_error * 100.0,
                    if q.median_rel_error <= 0.10 {
                        "yes"
                    } else {
                        "**no**"
                    },
                    q.p90_bound_coverage * 100.0,
                    q.bounded,
                    if (q.p90_bound_coverage - 0.9).abs() <= 0.03 {
                        "yes"
                    } else {
                        "**no**"
                    },
                    q.median_bound_ratio,
                    q.split_bound_coverage * 100.0,
                    q.median_rel_bias * 100.0
                );
            }
        }
        let _ = writeln!(s);
    }
    if runs.len() > 1 {
        let _ = writeln!(
            s,
            "### spread over {} seeds ({})\n\n| workload | policy | figure | min | median | max |\n|---|---|---|---:|---:|---:|",
            runs.len(),
            seeds.join(", ")
        );
        for w in &sc.workloads {
            let name = w.spec.kind.name();
            let Some(wr) = workload(&head.suite, name) else {
                continue;
            };
            for p in &wr.policies {
                for fig in SPREAD_FIGURES {
                    let (min, med, max, _) = spread(runs, name, &p.policy, fig);
                    let _ = writeln!(
                        s,
                        "| {name} | {} | {fig} | {min:.2} | {med:.2} | {max:.2} |",
                        p.policy
                    );
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::selection;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn scenarios_are_frozen_and_named() {
        let sc = Scenario::by_name("kinference", false).expect("scenario");
        assert_eq!(sc.workers, 3);
        assert_eq!(sc.pool, L40S_POOL);
        let kinds: Vec<&str> = sc.workloads.iter().map(|w| w.spec.kind.name()).collect();
        assert_eq!(kinds, ["shared-prefix", "multi-turn", "independent"]);
        // The second search's shape (bench/README.md, "The second search"): changing it
        // invalidates every published kinference figure, so it is pinned here.
        let shape: Vec<(usize, usize, usize, usize)> = sc
            .workloads
            .iter()
            .map(|w| {
                (
                    w.spec.prefix_tokens,
                    w.spec.first_turn_tokens,
                    w.spec.question_tokens,
                    w.concurrency,
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                (36_864, sc.workloads[0].spec.first_turn_tokens, 1_024, 8),
                (0, 10_240, 1_024, 8),
                (0, sc.workloads[2].spec.first_turn_tokens, 37_888, 6),
            ]
        );
        let het = Scenario::by_name("kinference-hetero", false).expect("scenario");
        assert_eq!(het.pool.split(',').count(), 3);
        assert!(!het.published_applies);
        assert!(Scenario::by_name("nope", false).is_err());
    }

    #[test]
    fn bench_args_reproduce_the_frozen_workload() {
        let sc = Scenario::by_name("kinference", false).expect("scenario");
        let args = Cli::parse_from(["bench", "--policies", "random,kvroute"]).args;
        for w in &sc.workloads {
            let a = sc.bench_args(w, 9, &args);
            let (specs, policies) = selection(&a).expect("valid");
            assert_eq!(policies, ["random", "kvroute"]);
            let got = serde_json::to_value(&specs[0]).expect("json");
            assert_eq!(got, serde_json::to_value(&w.spec).expect("json"));
            assert_eq!(a.seed(), 9);
            assert_eq!(a.concurrency, w.concurrency);
        }
    }

    #[test]
    fn quick_scenario_runs_and_reports_every_section() {
        let args = Cli::parse_from(["bench", "--quick", "--policies", "random,kvroute"]).args;
        let sc = Scenario::by_name("kinference", true).expect("scenario");
        let runs = vec![
            run_seed(&sc, 3, &args).expect("seed 3"),
            run_seed(&sc, 4, &args).expect("seed 4"),
        ];
        let v = to_json(&sc, &runs);
        for w in ["shared-prefix", "multi-turn", "independent"] {
            for p in ["random", "kvroute"] {
                for k in ["ttft_p50_s", "e2e_p50_s", "peak_goodput_rpm"] {
                    let x = v["workloads"][w][p][k].as_f64().unwrap_or(f64::NAN);
                    assert!(x.is_finite() && x >= 0.0, "{w}/{p}/{k}: {x}");
                }
                assert_eq!(
                    v["seeds"][w][p]["ttft_p50_s"]["per_seed"]
                        .as_array()
                        .map(Vec::len),
                    Some(2)
                );
            }
        }
        assert_eq!(v["published"].as_array().map(Vec::len), Some(5));
        assert_eq!(
            v["prediction"][0]["kvroute"].as_array().map(Vec::len),
            Some(3)
        );
        let md = markdown(&sc, &runs);
        assert!(md.contains("published Kinference") && md.contains("spread over 2 seeds"));
        // The suite's own report carries kvroute's prediction truth, and only kvroute's.
        let suite = report::json(&runs[0].suite);
        for w in ["shared-prefix", "multi-turn", "independent"] {
            let q = &suite["workloads"][w]["kvroute"]["prediction"];
            // --quick runs are all warm-up (fewer than 20 requests).
            assert!(q["warmup"].as_u64() > Some(0), "{w}: {q}");
            assert!(q["requests"].as_u64().is_some(), "{w}: {q}");
            assert!(suite["workloads"][w]["random"]["prediction"].is_null());
        }
        let table = report::markdown(&runs[0].suite);
        assert!(table.contains("### prediction truth"), "{table}");
        assert!(table.contains("| shared-prefix | kvroute |"), "{table}");
    }
}
