//! `kvroute explain --router URL [-H NAME:VALUE]... FILE.json`: asks a running router where
//! it would send a request, and why, without sending it (POST /debug/explain on the admin
//! address, with the given headers as the client's: service class, TTFT target, request id,
//! headers that policy rules match), then prints the decision record as a table, the
//! InferencePolicy rule that matched included (`--json` prints it raw). A request a policy
//! refuses prints the refusal with its policy and rule. A router that is not on
//! loopback answers `/debug/*` only with its admin token (`--admin-token-file`, or
//! `KVROUTE_ADMIN_TOKEN`), sent as `Authorization: Bearer`.
//!
//! ```text
//! FILE.json --POST URL/debug/explain--> decision record --render--> table on stdout
//! ```

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::Value;

/// Arguments of `kvroute explain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// Admin base URL of the router, e.g. http://127.0.0.1:9090.
    #[arg(
        long,
        env = "KVROUTE_EXPLAIN_ROUTER",
        default_value = "http://127.0.0.1:9090"
    )]
    pub router: String,
    /// Print the raw JSON decision record instead of a table.
    #[arg(long, env = "KVROUTE_EXPLAIN_JSON")]
    pub json: bool,
    /// File holding the router's admin token (its `--admin-token-file`), needed unless the
    /// router is reached on loopback (e.g. through `kubectl port-forward`).
    #[arg(
        long,
        env = "KVROUTE_EXPLAIN_ADMIN_TOKEN_FILE",
        conflicts_with = "admin_token"
    )]
    pub admin_token_file: Option<PathBuf>,
    /// The admin token itself (prefer the file or the environment: a flag shows in `ps`).
    #[arg(long, env = "KVROUTE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A request header as the client would send it (`NAME:VALUE`; repeatable), e.g.
    /// `x-kvroute-service-class:batch`.
    #[arg(long = "header", short = 'H', value_name = "NAME:VALUE")]
    pub headers: Vec<String>,
    /// An OpenAI chat/completions or completions request body (JSON file; `-` for stdin).
    pub file: PathBuf,
}

/// Runs the command.
pub async fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let ExplainArgs {
        router,
        json,
        admin_token_file,
        admin_token,
        headers,
        file,
    } = args;
    let token = match (admin_token_file, admin_token) {
        (Some(path), _) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?
                .trim()
                .to_string(),
        ),
        (None, token) => token.map(|t| t.trim().to_string()),
    }
    .filter(|t| !t.is_empty());
    let body = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("read stdin")?;
        s
    } else {
        std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?
    };
    let _: Value =
        serde_json::from_str(&body).with_context(|| format!("{} is not JSON", file.display()))?;
    let url = format!("{}/debug/explain", router.trim_end_matches('/'));
    let mut req = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = &token {
        req = req.bearer_auth(t);
    }
    for h in &headers {
        let Some((name, value)) = h.split_once(':') else {
            bail!("--header {h:?}: expected NAME:VALUE");
        };
        req = req.header(name.trim(), value.trim());
    }
    let resp = req.send().await.with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let text = resp.text().await.context("read the router's answer")?;
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "router answered 401: /debug/explain needs loopback or the admin token (--admin-token-file or KVROUTE_ADMIN_TOKEN)"
        );
    }
    if !status.is_success() {
        if let Ok(v) = serde_json::from_str::<Value>(&text)
            && let Some(verdict) = v.get("verdict")
        {
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            bail!(
                "refused by policy {} rule {} ({status}): {message}",
                verdict.get("policy").and_then(Value::as_str).unwrap_or("-"),
                verdict.get("rule").and_then(Value::as_str).unwrap_or("-")
            );
        }
        bail!("router answered {status}: {text}");
    }
    let record: Value = serde_json::from_str(&text).context("router answer is not JSON")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!("{}", render(&record));
    }
    Ok(())
}

/// Renders a decision record readably. Tolerant: missing fields print as `-`.
pub fn render(rec: &Value) -> String {
    let s = |v: &Value, k: &str| match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    };
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let ms = |x: Option<f64>| {
        x.filter(|x| x.is_finite())
            .map_or("-".into(), |x| format!("{:.1}", x * 1e3))
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model:      {} -> {}",
        s(rec, "model"),
        s(rec, "backend_model")
    );
    let _ = writeln!(out, "policy:     {}", s(rec, "policy"));
    let _ = writeln!(
        out,
        "chosen:     {} ({})",
        s(rec, "chosen"),
        s(rec, "address")
    );
    let _ = writeln!(out, "reason:     {}", s(rec, "reason"));
    let _ = writeln!(
        out,
        "predicted:  {} ms TTFT (p90 bound {} ms)",
        ms(f(rec, "predicted_ttft_s")),
        ms(f(rec, "ttft_p90_bound_s"))
    );
    let _ = writeln!(out, "prompt:     {} tokens", s(rec, "prompt_tokens"));
    if let Some(a) = rec.get("alias").filter(|a| !a.is_null()) {
        let _ = writeln!(
            out,
            "alias:      {} -> {} ({}% share)",
            s(a, "alias"),
            s(a, "model"),
            s(a, "percent")
        );
    }
    if let Some(l) = rec.get("lora").filter(|l| !l.is_null()) {
        let _ = writeln!(
            out,
            "lora:       {} on {} (only workers serving it; cache within it)",
            s(l, "adapter"),
            s(l, "base_model")
        );
    }
    if let Some(labels) = rec.get("labels").and_then(Value::as_array)
        && !labels.is_empty()
    {
        let names: Vec<&str> = labels.iter().filter_map(Value::as_str).collect();
        let _ = writeln!(out, "labels:     {}", names.join(", "));
    }
    if let Some(v) = rec.get("verdict") {
        if v.get("rule").is_none_or(Value::is_null) {
            let _ = writeln!(out, "rule:       - (no InferencePolicy rule matched)");
        } else {
            let actions: Vec<&str> = v
                .get("actions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let _ = writeln!(
                out,
                "rule:       {} / {} ({})",
                s(v, "policy"),
                s(v, "rule"),
                actions.join(", ")
            );
        }
        if let Some(t) = v.get("targets").and_then(Value::as_array)
            && !t.is_empty()
        {
            let names: Vec<&str> = t.iter().filter_map(Value::as_str).collect();
            let _ = writeln!(out, "targets:    {}", names.join(", "));
        }
        if let Some(sw) = v.get("model_switch").filter(|x| !x.is_null()) {
            let ttft = |k: &str| {
                sw.get(k)
                    .and_then(Value::as_f64)
                    .map_or_else(|| "-".to_string(), |t| format!("{:.0} ms", t * 1000.0))
            };
            let detail = sw
                .get("detail")
                .and_then(Value::as_str)
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "model:      {} -> {} {}{} (best predicted TTFT {}, {} where cached, vs {})",
                s(sw, "requested"),
                s(sw, "alternative"),
                s(sw, "outcome"),
                detail,
                ttft("requested_best_ttft_s"),
                ttft("requested_cached_best_ttft_s"),
                ttft("alternative_best_ttft_s"),
            );
        }
        if !v.get("service_class").is_none_or(Value::is_null)
            || !v.get("ttft_target_ms").is_none_or(Value::is_null)
        {
            let _ = writeln!(
                out,
                "class:      {} (TTFT target {} ms{})",
                s(v, "service_class"),
                s(v, "ttft_target_ms"),
                if v.get("sheddable").and_then(Value::as_bool) == Some(true) {
                    ", sheddable"
                } else {
                    ""
                }
            );
        }
    }
    if rec.get("degraded").and_then(Value::as_bool) == Some(true) {
        let _ = writeln!(
            out,
            "DEGRADED:   scored on load only ({})",
            s(rec, "degraded_reason")
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  {:<28} {:>8} {:>9} {:>7} {:>7} {:>8} {:>9} {:>10} {:>9} {:>6}",
        "worker",
        "cached",
        "of blocks",
        "waiting",
        "running",
        "inflight",
        "queue tok",
        "pred ms",
        "score",
        "stale"
    );
    let chosen = s(rec, "chosen");
    for c in rec
        .get("candidates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mark = if s(c, "worker") == chosen { "*" } else { " " };
        let _ = writeln!(
            out,
            "{mark} {:<28} {:>8} {:>9} {:>7} {:>7} {:>8} {:>9.0} {:>10} {:>9.4} {:>6}",
            s(c, "worker"),
            s(c, "cached_blocks"),
            s(c, "prompt_blocks"),
            s(c, "waiting"),
            s(c, "running"),
            s(c, "inflight"),
            f(c, "queue_tokens").unwrap_or(0.0),
            ms(f(c, "predicted_ttft")),
            f(c, "score").unwrap_or(f64::NAN),
            s(c, "stale"),
        );
    }
    let load_only: Vec<String> = rec
        .get("candidates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c.get("load_only").and_then(Value::as_bool) == Some(true))
        .map(|c| s(c, "worker"))
        .collect();
    if !load_only.is_empty() {
        let _ = writeln!(
            out,
            "LOAD-ONLY:  {} (no kvroute sidecar: a GIE InferencePool pod, scored on this \
             router's in-flight requests alone, no cache view)",
            load_only.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_record_and_marks_the_choice() {
        let rec = serde_json::json!({
            "model": "chat", "backend_model": "qwen3", "policy": "kvroute", "chosen": "ns/a",
            "address": "10.0.0.1:8000", "reason": "lowest_predicted_ttft", "degraded": false,
            "prompt_tokens": 512, "predicted_ttft_s": 0.0123, "ttft_p90_bound_s": 0.0201,
            "candidates": [
                {"worker": "ns/a", "cached_blocks": 32, "prompt_blocks": 32, "waiting": 0, "running": 1,
                 "inflight": 0, "queue_tokens": 0.0, "predicted_ttft": 0.0123, "score": 0.0123, "stale": false},
                {"worker": "ns/b", "cached_blocks": 0, "prompt_blocks": 32, "waiting": 2, "running": 1,
                 "inflight": 1, "queue_tokens": 900.0, "predicted_ttft": 0.3, "score": 0.3, "stale": true}
            ]
        });
        let text = render(&rec);
        assert!(text.contains("chosen:     ns/a (10.0.0.1:8000)"), "{text}");
        assert!(
            text.contains("predicted:  12.3 ms TTFT (p90 bound 20.1 ms)"),
            "{text}"
        );
        let row = |w: &str| {
            text.lines()
                .find(|l| l.trim_start_matches(['*', ' ']).starts_with(w))
                .map(str::to_owned)
        };
        let a = row("ns/a").expect("row a");
        assert!(a.starts_with('*'), "{a}");
        let b = row("ns/b").expect("row b");
        assert!(b.starts_with(' ') && b.contains("true"), "{b}");
        assert!(!text.contains("DEGRADED"));
        assert!(!text.contains("LOAD-ONLY"));
    }

    #[test]
    fn says_which_candidates_have_no_cache_view() {
        let rec = serde_json::json!({
            "model": "llama", "chosen": "ml/gie-0",
            "candidates": [
                {"worker": "ml/gie-0", "load_only": true, "stale": true},
                {"worker": "ml/ws-0", "stale": false}
            ]
        });
        let text = render(&rec);
        let line = text
            .lines()
            .find(|l| l.starts_with("LOAD-ONLY:"))
            .unwrap_or_default();
        assert!(
            line.contains("ml/gie-0") && !line.contains("ml/ws-0"),
            "{text}"
        );
        assert!(line.contains("no cache view"), "{text}");
    }

    #[test]
    fn renders_the_policy_verdict_alias_and_labels() {
        let rec = serde_json::json!({
            "model": "chat", "backend_model": "tiny-v2", "chosen": "ns/a",
            "labels": ["pii", "pii:email"],
            "alias": {"alias": "chat", "model": "tiny-v2", "percent": 20, "seed": 1},
            "lora": {"adapter": "sql", "base_model": "tiny"},
            "verdict": {"policy": "ml/rules", "rule": "pii-local", "actions": ["route", "local_only"],
                        "targets": ["fast"], "service_class": "batch", "ttft_target_ms": 800,
                        "sheddable": true,
                        "model_switch": {"requested": "big", "alternative": "small",
                                         "outcome": "kept-cached", "requested_best_ttft_s": 0.05,
                                         "requested_cached_best_ttft_s": 0.05,
                                         "alternative_best_ttft_s": 0.12}}
        });
        let text = render(&rec);
        for want in [
            "alias:      chat -> tiny-v2 (20% share)",
            "labels:     pii, pii:email",
            "lora:       sql on tiny (only workers serving it; cache within it)",
            "rule:       ml/rules / pii-local (route, local_only)",
            "targets:    fast",
            "class:      batch (TTFT target 800 ms, sheddable)",
            "model:      big -> small kept-cached (best predicted TTFT 50 ms, 50 ms where cached, vs 120 ms)",
        ] {
            assert!(text.contains(want), "{want:?} missing in\n{text}");
        }
        let none = render(&serde_json::json!({"verdict": {"rule": null}}));
        assert!(none.contains("no InferencePolicy rule matched"), "{none}");
    }

    #[test]
    fn tolerates_missing_fields() {
        let text = render(&serde_json::json!({"degraded": true}));
        assert!(text.contains("DEGRADED"), "{text}");
        assert!(text.contains("chosen:     - (-)"), "{text}");
    }
}
