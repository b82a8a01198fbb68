//! `kvroute tokenize`: tokenize a chat request or a prompt exactly like vLLM and print the
//! token ids and kvroute block hashes as JSON, to compare with vLLM's `POST /tokenize` and
//! with what the router looks up.
//!
//! ```text
//! --chat body.json | --prompt TEXT --> kvroute-tokenization --> token ids
//!                                      kvroute-hash chain(model, lora, cache_salt, block size)
//!                                      --> {"token_ids", "num_tokens", "block_size", "block_hashes"}
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use kvroute_tokenization::{ChatRequest, PromptInput, Tokenizer};
use serde::Serialize;

use crate::routing::PromptHashes;

/// Flags of `kvroute tokenize`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenizeArgs {
    /// HuggingFace tokenizer directory (tokenizer.json, tokenizer_config.json).
    #[arg(long, env = "KVROUTE_TOKENIZE_TOKENIZER")]
    pub tokenizer: PathBuf,
    /// An OpenAI /v1/chat/completions body (JSON file; `-` reads stdin). Its `model` and
    /// `cache_salt` fields are used unless the flags below override them.
    #[arg(
        long,
        env = "KVROUTE_TOKENIZE_CHAT",
        conflicts_with = "prompt",
        required_unless_present = "prompt"
    )]
    pub chat: Option<PathBuf>,
    /// A completions prompt (text).
    #[arg(long, env = "KVROUTE_TOKENIZE_PROMPT")]
    pub prompt: Option<String>,
    /// Encode `--prompt` with the tokenizer's special tokens (vLLM's completions default).
    #[arg(long, env = "KVROUTE_TOKENIZE_ADD_SPECIAL_TOKENS", default_value_t = true, action = clap::ArgAction::Set)]
    pub add_special_tokens: bool,
    /// KV block size of the workers (tokens).
    #[arg(long, env = "KVROUTE_TOKENIZE_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,
    /// Served model name the workers report (seeds the hash chain). Default: the chat body's
    /// `model`, else the tokenizer directory's name.
    #[arg(long, env = "KVROUTE_TOKENIZE_MODEL")]
    pub model: Option<String>,
    /// LoRA adapter name (seeds the hash chain).
    #[arg(long, env = "KVROUTE_TOKENIZE_LORA")]
    pub lora: Option<String>,
    /// vLLM `cache_salt` (extra key of block 1). Default: the chat body's `cache_salt`.
    #[arg(long, env = "KVROUTE_TOKENIZE_CACHE_SALT")]
    pub cache_salt: Option<String>,
}

/// What `kvroute tokenize` prints.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TokenizeOutput {
    /// Model name the hashes are seeded with.
    pub model: String,
    /// LoRA adapter the hashes are seeded with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<String>,
    /// Cache salt of block 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// The rendered chat prompt (chat input only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Token ids (vLLM `/tokenize` `tokens`).
    pub token_ids: Vec<u32>,
    /// Number of tokens.
    pub num_tokens: usize,
    /// Block size of the hashes.
    pub block_size: usize,
    /// kvroute hashes of every full block (hash/SPEC.md).
    pub block_hashes: Vec<u64>,
}

/// The request to tokenize.
#[derive(Debug, Clone)]
pub enum TokenizeInput {
    /// A chat body (the `model` and `cache_salt` fields are read from it as well).
    Chat(serde_json::Value),
    /// A completions prompt.
    Prompt {
        /// The prompt text, encoded as is (no chat template).
        text: String,
        /// Whether the tokenizer adds its special tokens (BOS and the like), as vLLM's flag.
        add_special_tokens: bool,
    },
}

/// Hash seeds.
#[derive(Debug, Clone, Default)]
pub struct HashSeeds {
    /// Served model name; `None` takes the chat body's `model` or `fallback_model`.
    pub model: Option<String>,
    /// Used when neither `model` nor the body names one.
    pub fallback_model: String,
    /// LoRA adapter.
    pub lora: Option<String>,
    /// Cache salt; `None` takes the chat body's `cache_salt`.
    pub cache_salt: Option<String>,
}

/// Tokenizes and hashes. Chat templates that call `strftime_now` see the local clock.
pub fn tokenize(
    tok: &Tokenizer,
    input: &TokenizeInput,
    seeds: &HashSeeds,
    block_size: usize,
) -> anyhow::Result<TokenizeOutput> {
    anyhow::ensure!(block_size > 0, "--block-size must be at least 1");
    let body_str = |key: &str| match input {
        TokenizeInput::Chat(v) => v.get(key).and_then(|s| s.as_str()).map(str::to_owned),
        TokenizeInput::Prompt { .. } => None,
    };
    let model = seeds
        .model
        .clone()
        .or_else(|| body_str("model"))
        .unwrap_or_else(|| seeds.fallback_model.clone());
    let cache_salt = seeds.cache_salt.clone().or_else(|| body_str("cache_salt"));
    let (prompt, token_ids) = match input {
        TokenizeInput::Chat(body) => {
            let req: ChatRequest = serde_json::from_value(body.clone())
                .context("the chat body is not a chat completions request")?;
            let enc = tok
                .encode_chat(&req, kvroute_tokenization::local_now())
                .context("rendering or encoding the chat request")?;
            (Some(enc.prompt), enc.token_ids)
        }
        TokenizeInput::Prompt {
            text,
            add_special_tokens,
        } => {
            let ids = tok
                .encode_prompt(&PromptInput::Text(text.clone()), *add_special_tokens)
                .context("encoding the prompt")?;
            (None, ids)
        }
    };
    let block_hashes = PromptHashes::new(
        &token_ids,
        &model,
        seeds.lora.as_deref(),
        cache_salt.as_deref(),
    )
    .chain(block_size)
    .to_vec();
    Ok(TokenizeOutput {
        model,
        lora: seeds.lora.clone(),
        cache_salt,
        prompt,
        num_tokens: token_ids.len(),
        token_ids,
        block_size,
        block_hashes,
    })
}

fn read_body(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the chat body from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// Runs the command: prints one JSON object on stdout.
pub async fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let TokenizeArgs {
        tokenizer,
        chat,
        prompt,
        add_special_tokens,
        block_size,
        model,
        lora,
        cache_salt,
    } = args;
    let tok = Tokenizer::from_dir(&tokenizer)
        .with_context(|| format!("loading the tokenizer from {}", tokenizer.display()))?;
    let input = match (chat, prompt) {
        (Some(path), _) => TokenizeInput::Chat(read_body(&path)?),
        (None, Some(text)) => TokenizeInput::Prompt {
            text,
            add_special_tokens,
        },
        (None, None) => anyhow::bail!("give --chat FILE.json or --prompt TEXT"),
    };
    let fallback_model = tokenizer
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let seeds = HashSeeds {
        model,
        fallback_model,
        lora,
        cache_salt,
    };
    let out = tokenize(&tok, &input, &seeds, block_size)?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
