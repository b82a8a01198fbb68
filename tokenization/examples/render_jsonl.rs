//! Renders and encodes chat requests in bulk, for comparing with vLLM or transformers.
//!
//! `cargo run -p kvroute-tokenization --example render_jsonl -- TOKENIZER_DIR REQUESTS.jsonl [NOW_RFC3339]`
//!
//! Each input line is a chat request body (or `{"prompt": ...}` for completions); each output
//! line is `{"prompt": "...", "token_ids": [...]}` or `{"error": "..."}`.

use kvroute_tokenization::{ChatRequest, PromptInput, Tokenizer};
use serde_json::{Value, json};
use std::io::{BufRead, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(input)) = (args.get(1), args.get(2)) else {
        return Err("usage: render_jsonl TOKENIZER_DIR REQUESTS.jsonl [NOW_RFC3339]".into());
    };
    let now = match args.get(3) {
        Some(s) => chrono::DateTime::parse_from_rfc3339(s)?,
        None => kvroute_tokenization::local_now(),
    };
    let tokenizer = Tokenizer::from_dir(std::path::Path::new(dir))?;
    let reader = std::io::BufReader::new(std::fs::File::open(input)?);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let body: Value = serde_json::from_str(&line)?;
        let result = if body.get("messages").is_some() {
            serde_json::from_value::<ChatRequest>(body)
                .map_err(|e| e.to_string())
                .and_then(|req| tokenizer.encode_chat(&req, now).map_err(|e| e.to_string()))
                .map(|enc| json!({"prompt": enc.prompt, "token_ids": enc.token_ids}))
        } else {
            let add = body
                .get("add_special_tokens")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            serde_json::from_value::<PromptInput>(
                body.get("prompt").cloned().unwrap_or(Value::Null),
            )
            .map_err(|e| e.to_string())
            .and_then(|p| tokenizer.encode_prompt(&p, add).map_err(|e| e.to_string()))
            .map(|ids| json!({"token_ids": ids}))
        };
        let line = match result {
            Ok(v) => v,
            Err(e) => json!({"error": e}),
        };
        writeln!(out, "{line}")?;
    }
    Ok(())
}
