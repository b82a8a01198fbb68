//! vLLM argument lists: the operator passes a real vLLM command line to `engine: mock`, so
//! flags the mock does not know (`--gpu-memory-utilization 0.9`, `--enforce-eager`) must be
//! dropped without losing the known flags that follow them. clap stops at the first unknown
//! flag (the rest lands in `Args::ignored`), so the full command line is filtered here and
//! parsed again. Pure.

/// Splits `tokens` (the arguments after the program / subcommand name) into the ones to parse
/// (known flags with their values) and the ones to ignore. A leading bare word is vLLM's
/// positional model (`vllm serve MODEL`) and becomes `--model MODEL`.
pub fn filter_known(tokens: &[String], known_longs: &[String]) -> (Vec<String>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    let mut i = 0;
    if let Some(first) = tokens.first()
        && !first.starts_with('-')
    {
        kept.push("--model".to_string());
        kept.push(first.clone());
        i = 1;
    }
    let mut keeping = true;
    while i < tokens.len() {
        let t = &tokens[i];
        if let Some(name) = t.strip_prefix("--") {
            let name = name.split('=').next().unwrap_or("");
            keeping = known_longs.iter().any(|k| k == name);
        } else if t.starts_with('-') && t.len() > 1 && t.parse::<f64>().is_err() {
            keeping = false;
        }
        if keeping {
            kept.push(t.clone());
        } else {
            dropped.push(t.clone());
        }
        i += 1;
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn unknown_flags_and_their_values_are_dropped() {
        let known = s(&["port", "served-model-name", "enforce"]);
        let (kept, dropped) = filter_known(
            &s(&[
                "/models/qwen",
                "--gpu-memory-utilization",
                "0.9",
                "--port=8001",
                "--enforce-eager",
                "--served-model-name",
                "a",
                "b",
                "-tp",
                "2",
            ]),
            &known,
        );
        assert_eq!(
            kept,
            s(&[
                "--model",
                "/models/qwen",
                "--port=8001",
                "--served-model-name",
                "a",
                "b"
            ])
        );
        assert_eq!(
            dropped,
            s(&[
                "--gpu-memory-utilization",
                "0.9",
                "--enforce-eager",
                "-tp",
                "2"
            ])
        );
    }
}
