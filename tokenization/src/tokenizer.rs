//! [`Tokenizer`]: one loaded tokenizer directory, compiled once, shared by every request.

use crate::bpe::FastBpe;
use crate::chat::{self, ChatRequest};
use crate::config::{self, SpecialTokens, TokenizerFiles};
use crate::pipeline;
use crate::segments::{SegmentCacheStats, SegmentEncoder};
use crate::template::{self, ContentFormat, NOW_VAR, TemplateTraits};
use crate::{PromptInput, TokenizeError};
use chrono::{DateTime, FixedOffset};
use minijinja::Environment;
use serde_json::{Map, Value};
use std::path::Path;
use std::sync::Arc;

/// Tag transformers appends to the final message for `continue_final_message`.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// A HuggingFace tokenizer plus its chat templates, ready to turn requests into the token ids
/// vLLM 0.33 would compute. Cheap to share (`Arc<Tokenizer>`): it is `Send + Sync` and every
/// method takes `&self`; templates are compiled once, at load.
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    special: SpecialTokens,
    env: Environment<'static>,
    templates: Vec<LoadedTemplate>,
    /// Index into `templates` of the template used when the request names none.
    default_template: Option<usize>,
    /// Index of the `tool_use` template (used when tools are present).
    tool_use_template: Option<usize>,
    named_templates: bool,
    eos_token_ids: Vec<u32>,
    bos_token_id: Option<u32>,
    max_token_id: u32,
    segments: SegmentEncoder,
    /// Our BPE for tokenizers of the shapes it implements (byte-level: Qwen2/Qwen3, Llama 3,
    /// gpt-oss, Mistral Nemo, DeepSeek-V3; SentencePiece-style: Gemma 3).
    fast: Option<Arc<FastBpe>>,
    /// The post-processor never adds ids (none, or ByteLevel): piecewise encoding is exact
    /// with `add_special_tokens = true` too.
    post_processor_adds_nothing: bool,
}

/// Default size of the per-tokenizer segment cache (ids of recently seen messages, and of
/// chunks of long texts; see `segments.rs`).
pub const DEFAULT_SEGMENT_CACHE_BYTES: usize = 32 << 20;

struct LoadedTemplate {
    /// Name in `env` (the declared name, or `"default"` for a single template).
    name: String,
    traits: TemplateTraits,
    /// Set when the template does not compile; reported on use, so completions still work.
    compile_error: Option<String>,
}

/// A rendered and encoded chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatEncoding {
    /// The prompt text the chat template produced (what vLLM's `/v1/chat/completions/render`
    /// shows).
    pub prompt: String,
    /// Its token ids (what vLLM's `POST /tokenize` with `messages` returns).
    pub token_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("max_token_id", &self.max_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .field(
                "templates",
                &self.templates.iter().map(|t| &t.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, TokenizeError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizeError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

impl Tokenizer {
    /// Loads a HuggingFace tokenizer directory: `tokenizer.json` (required),
    /// `tokenizer_config.json`, `special_tokens_map.json`, `chat_template.jinja`,
    /// `generation_config.json` (all optional).
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizeError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_json =
            std::fs::read(&tokenizer_path).map_err(|source| TokenizeError::Io {
                path: tokenizer_path,
                source,
            })?;
        let chat_template_jinja = match read_optional(&dir.join("chat_template.jinja"))? {
            Some(bytes) => Some(
                String::from_utf8(bytes)
                    .map_err(|_| TokenizeError::Load("chat_template.jinja is not UTF-8".into()))?,
            ),
            None => None,
        };
        Self::from_files(TokenizerFiles {
            tokenizer_json,
            tokenizer_config_json: read_optional(&dir.join("tokenizer_config.json"))?,
            special_tokens_map_json: read_optional(&dir.join("special_tokens_map.json"))?,
            chat_template_jinja,
            generation_config_json: read_optional(&dir.join("generation_config.json"))?,
        })
    }

    /// Builds a tokenizer from file contents already in memory (no I/O).
    pub fn from_files(files: TokenizerFiles) -> Result<Self, TokenizeError> {
        let hf = tokenizers::Tokenizer::from_bytes(&files.tokenizer_json)
            .map_err(|e| TokenizeError::Load(format!("tokenizer.json: {e}")))?;
        // A tokenizer of another shape simply keeps the `tokenizers` pipeline.
        let fast = FastBpe::from_json(&files.tokenizer_json).ok().map(Arc::new);
        Self::assemble(hf, fast, &files)
    }

    /// This tokenizer's vocabulary and pipeline with other configuration files: the
    /// tokenizer_config.json, special_tokens_map.json, chat template and generation_config.json
    /// of `files` replace this tokenizer's (its `tokenizer_json` is not read). The result is
    /// what [`Self::from_files`] builds from this tokenizer's tokenizer.json and those files,
    /// without parsing tokenizer.json again (the configs are a few kilobytes, tokenizer.json
    /// megabytes); the segment cache starts empty, at the default size.
    pub fn with_config_files(&self, files: &TokenizerFiles) -> Result<Self, TokenizeError> {
        Self::assemble(self.hf.clone(), self.fast.clone(), files)
    }

    fn assemble(
        hf: tokenizers::Tokenizer,
        fast: Option<Arc<FastBpe>>,
        files: &TokenizerFiles,
    ) -> Result<Self, TokenizeError> {
        let cfg = config::parse_dir_config(files)?;

        let mut env = template::new_environment();
        let mut templates = Vec::new();
        let mut add = |name: String, source: &str| {
            let traits = TemplateTraits::of(source);
            let compile_error = env
                .add_template_owned(name.clone(), template::strip_generation_tags(source))
                .err()
                .map(|e| format!("{e:#}"));
            templates.push(LoadedTemplate {
                name,
                traits,
                compile_error,
            });
            templates.len() - 1
        };
        let mut default_template = None;
        let mut tool_use_template = None;
        for (name, source) in &cfg.templates.named {
            let i = add(name.clone(), source);
            match name.as_str() {
                "default" => default_template = Some(i),
                "tool_use" => tool_use_template = Some(i),
                _ => {}
            }
        }
        if let Some(source) = &cfg.templates.single {
            default_template = Some(add("default".into(), source));
        }
        let named_templates = !cfg.templates.named.is_empty();

        let max_token_id = hf.get_vocab(true).values().copied().max().unwrap_or(0);
        let mut eos_token_ids: Vec<u32> = Vec::new();
        if let Some(id) = cfg
            .special
            .eos_token
            .as_deref()
            .and_then(|t| hf.token_to_id(t))
        {
            eos_token_ids.push(id);
        }
        for id in cfg.generation_eos_ids {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let bos_token_id = cfg
            .special
            .bos_token
            .as_deref()
            .and_then(|t| hf.token_to_id(t));
        let segments = SegmentEncoder::new(&hf, DEFAULT_SEGMENT_CACHE_BYTES, fast.clone());
        let post_processor_adds_nothing = matches!(
            hf.get_post_processor(),
            None | Some(tokenizers::PostProcessorWrapper::ByteLevel(_))
        );
        Ok(Tokenizer {
            hf,
            special: cfg.special,
            env,
            templates,
            default_template,
            tool_use_template,
            named_templates,
            eos_token_ids,
            bos_token_id,
            max_token_id,
            segments,
            fast,
            post_processor_adds_nothing,
        })
    }

    /// Resizes the segment cache (0 disables it). Encoding is exact either way; the cache
    /// only makes re-encoding text seen before (system prompts, chat history) cheap. Also
    /// starts a fresh word cache for the fast path.
    pub fn with_segment_cache_bytes(mut self, bytes: usize) -> Self {
        self.segments = SegmentEncoder::new(&self.hf, bytes, self.fast.clone());
        self
    }

    /// Whether [`Self::encode_text`] uses kvroute's own BPE (tokenizers shaped like
    /// Qwen2/Qwen3, Llama 3, gpt-oss, Mistral Nemo or DeepSeek-V3: NFC or no normaliser, their split
    /// regexes, byte-level BPE; or like Gemma 3: SentencePiece-style BPE with byte fallback)
    /// instead of the
    /// `tokenizers` pipeline. Both give the same ids; ours is several times faster on text
    /// not seen before.
    pub fn fast_path(&self) -> bool {
        self.segments.fast_path()
    }

    /// Hits, misses and size of the segment cache.
    pub fn segment_cache_stats(&self) -> SegmentCacheStats {
        self.segments.stats()
    }

    /// Stop ids: the config's `eos_token` first, then `generation_config.json`'s extra ids.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// The id of `bos_token`, if the tokenizer declares one (Qwen3 does not).
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// The named special tokens (bos/eos/unk/sep/pad/cls/mask) as strings.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Highest token id the tokenizer knows (added tokens included).
    pub fn max_token_id(&self) -> u32 {
        self.max_token_id
    }

    /// `max_token_id() + 1`: the tokenizer's vocabulary size, added tokens included
    /// (151,669 for Qwen3; the model's embedding table may be larger).
    pub fn vocab_size(&self) -> u32 {
        self.max_token_id.saturating_add(1)
    }

    /// Whether the tokenizer declares a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.default_template.is_some() || !self.templates.is_empty()
    }

    /// The id of a token string (special tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    /// The token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.hf.id_to_token(id)
    }

    /// Renders a chat request with the chat template, exactly as vLLM 0.33 does (see
    /// [`ChatRequest`] for the rules). `now` feeds the templates' `strftime_now` (pass the
    /// server's local time at the edge; tests pass a fixed instant).
    pub fn render_chat(
        &self,
        req: &ChatRequest,
        now: DateTime<FixedOffset>,
    ) -> Result<String, TokenizeError> {
        let inputs = chat::template_inputs(req)?;
        let selected =
            self.select_template(req.chat_template.as_deref(), inputs.tools.is_some())?;
        let (traits, inline_source) = match &selected {
            Selected::Loaded(t) => (t.traits.clone(), None),
            Selected::Inline(src) => (
                TemplateTraits::of(src),
                Some(template::strip_generation_tags(src)),
            ),
        };
        let mut conversation = chat::build_conversation(
            &req.messages,
            traits.content_format,
            traits.supports_developer,
        )?;

        let final_message = if inputs.continue_final_message {
            Some(tag_final_message(&mut conversation, &traits)?)
        } else {
            None
        };

        let mut ctx = Map::new();
        for (name, token) in self.special.iter() {
            ctx.insert(name.into(), Value::String(token.into()));
        }
        ctx.extend(inputs.extra_vars);
        ctx.insert("messages".into(), Value::Array(conversation));
        ctx.insert("tools".into(), inputs.tools.unwrap_or(Value::Null));
        ctx.insert("documents".into(), inputs.documents.unwrap_or(Value::Null));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(inputs.add_generation_prompt),
        );
        ctx.insert(NOW_VAR.into(), Value::String(now.to_rfc3339()));
        let ctx = minijinja::Value::from(minijinja::value::Serde(&ctx));

        let rendered = match (&selected, &inline_source) {
            (Selected::Loaded(t), _) => {
                if let Some(err) = &t.compile_error {
                    return Err(TokenizeError::TemplateSyntax(err.clone()));
                }
                self.env
                    .get_template(&t.name)
                    .and_then(|tpl| tpl.render(ctx))
                    .map_err(|e| template::render_error(&e))?
            }
            (Selected::Inline(_), Some(src)) => {
                let env = template::new_environment();
                let tpl = env
                    .template_from_str(src)
                    .map_err(|e| TokenizeError::TemplateSyntax(format!("{e:#}")))?;
                tpl.render(ctx).map_err(|e| template::render_error(&e))?
            }
            (Selected::Inline(_), None) => return Err(TokenizeError::TemplateMissing),
        };

        match final_message {
            Some(final_message) => cut_at_continue_tag(rendered, &final_message),
            None => Ok(rendered),
        }
    }

    /// Renders and encodes a chat request: the ids vLLM's `POST /tokenize` (with `messages`)
    /// and `/v1/chat/completions` compute. Encoded with `add_special_tokens =
    /// req.add_special_tokens` (false by default: the template emits them).
    pub fn encode_chat(
        &self,
        req: &ChatRequest,
        now: DateTime<FixedOffset>,
    ) -> Result<ChatEncoding, TokenizeError> {
        let prompt = self.render_chat(req, now)?;
        let token_ids = self.encode_text(&prompt, req.add_special_tokens)?;
        Ok(ChatEncoding { prompt, token_ids })
    }

    /// Encodes a completions prompt. vLLM's default is `add_special_tokens = true` for
    /// `/v1/completions` and `/tokenize` with `prompt`, false for chat. Whether that adds
    /// anything depends on the tokenizer's post-processor: Qwen3's and the capture's tiny
    /// tokenizer add nothing; Llama-style `TemplateProcessing` adds BOS.
    ///
    /// Uses the segment cache when that is exact (see [`Self::with_segment_cache_bytes`]).
    pub fn encode_text(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        if self.segments.enabled() && (!add_special_tokens || self.post_processor_adds_nothing) {
            return self.segments.encode(&self.hf, text);
        }
        self.encode_text_uncached(text, add_special_tokens)
    }

    /// [`Self::encode_text`] straight through the HuggingFace tokenizer, never the segment
    /// cache (the reference the cached path is tested against).
    pub fn encode_text_uncached(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        pipeline::encode(&self.hf, text, add_special_tokens)
    }

    /// A completions `prompt` as ids: text is encoded, ids are checked against the vocabulary
    /// and passed through unchanged (vLLM never adds special tokens to given ids).
    pub fn encode_prompt(
        &self,
        prompt: &PromptInput,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        match prompt {
            PromptInput::Text(text) => self.encode_text(text, add_special_tokens),
            PromptInput::TokenIds(ids) => self.validate_token_ids(ids, None),
        }
    }

    /// Checks client-given ids like vLLM: each must be in `0..=max(max_token_id,
    /// model_vocab_size - 1)`. Returns them as `u32`.
    pub fn validate_token_ids(
        &self,
        ids: &[i64],
        model_vocab_size: Option<u32>,
    ) -> Result<Vec<u32>, TokenizeError> {
        let limit = model_vocab_size
            .map(|v| v.saturating_sub(1).max(self.max_token_id))
            .unwrap_or(self.max_token_id);
        ids.iter()
            .map(|&id| match u32::try_from(id) {
                Ok(v) if v <= limit => Ok(v),
                // vLLM reports the smallest negative id or the largest too-large one; we report
                // the first bad one.
                _ => Err(TokenizeError::TokenOutOfVocab { id }),
            })
            .collect()
    }

    /// Decodes ids to text (`skip_special_tokens`: vLLM's default for outputs is true).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        if let Some(&bad) = ids.iter().find(|&&id| id > self.max_token_id) {
            return Err(TokenizeError::TokenOutOfVocab { id: i64::from(bad) });
        }
        self.hf
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizeError::Decode(e.to_string()))
    }

    /// The content format vLLM would use with the default template.
    pub fn content_format(&self) -> ContentFormat {
        self.default_template
            .and_then(|i| self.templates.get(i))
            .map(|t| t.traits.content_format)
            .unwrap_or(ContentFormat::String)
    }

    /// transformers' `get_chat_template`: a request template that names one of the tokenizer's
    /// named templates selects it, any other request template is Jinja source; otherwise
    /// `tool_use` when tools are present and it exists, else the default.
    fn select_template<'a>(
        &'a self,
        requested: Option<&'a str>,
        has_tools: bool,
    ) -> Result<Selected<'a>, TokenizeError> {
        if let Some(req) = requested {
            if self.named_templates
                && let Some(t) = self.templates.iter().find(|t| t.name == req)
            {
                return Ok(Selected::Loaded(t));
            }
            return Ok(Selected::Inline(req));
        }
        let index = if has_tools {
            self.tool_use_template.or(self.default_template)
        } else {
            self.default_template
        };
        match index.and_then(|i| self.templates.get(i)) {
            Some(t) => Ok(Selected::Loaded(t)),
            None if self.named_templates => Err(TokenizeError::InvalidRequest(
                "This model has multiple chat templates with no default specified!".into(),
            )),
            None => Err(TokenizeError::TemplateMissing),
        }
    }
}

enum Selected<'a> {
    Loaded(&'a LoadedTemplate),
    Inline(&'a str),
}

/// transformers 5.x `continue_final_message`: append a tag to the final message's content (the
/// last text part for list content) and return the original text.
fn tag_final_message(
    conversation: &mut [Value],
    traits: &TemplateTraits,
) -> Result<String, TokenizeError> {
    let last = conversation
        .last_mut()
        .and_then(Value::as_object_mut)
        .ok_or_else(|| {
            TokenizeError::InvalidRequest(
                "continue_final_message is set but the conversation is empty!".into(),
            )
        })?;
    if !traits.mentions_content {
        return Err(TokenizeError::InvalidRequest(
            "continue_final_message is set to \"content\" but this is not an accepted field in the chat_template".into(),
        ));
    }
    match last.get_mut("content") {
        Some(Value::String(s)) => {
            let original = s.clone();
            s.push_str(CONTINUE_TAG);
            Ok(original)
        }
        Some(Value::Array(parts)) => {
            for part in parts.iter_mut().rev() {
                if let Some(Value::String(text)) = part.get_mut("text") {
                    let original = text.clone();
                    text.push_str(CONTINUE_TAG);
                    return Ok(original);
                }
            }
            Err(TokenizeError::InvalidRequest(
                "continue_final_message is set but we could not find any text to continue in the final message!".into(),
            ))
        }
        _ => Err(TokenizeError::InvalidRequest(
            "continue_final_message is set but the final message has no \"content\" to continue!"
                .into(),
        )),
    }
}

fn cut_at_continue_tag(rendered: String, final_message: &str) -> Result<String, TokenizeError> {
    let tag = CONTINUE_TAG.trim();
    let Some(loc) = rendered
        .rfind(tag)
        .filter(|_| rendered.contains(final_message.trim()))
    else {
        return Err(TokenizeError::InvalidRequest(
            "continue_final_message is set but the final message does not appear in the chat after \
             applying the chat template!"
                .into(),
        ));
    };
    if rendered[loc..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..loc].to_string())
    } else {
        Ok(rendered[..loc].trim_end().to_string())
    }
}
