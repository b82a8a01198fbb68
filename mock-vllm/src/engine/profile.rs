//! Timing and capacity profiles of a simulated GPU worker, loaded from data files.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Built-in profiles: `(name, file contents)`.
const BUILTIN: &[(&str, &str)] = &[
    (
        "l40s-qwen3-32b-fp8",
        include_str!("../../profiles/l40s-qwen3-32b-fp8.json"),
    ),
    ("tiny", include_str!("../../profiles/tiny.json")),
    (
        "l40s-27b-fp8",
        include_str!("../../profiles/l40s-27b-fp8.json"),
    ),
    (
        "h100-27b-fp8",
        include_str!("../../profiles/h100-27b-fp8.json"),
    ),
];

/// The default profile: one NVIDIA L40S serving Qwen3-32B-FP8.
pub const DEFAULT_PROFILE: &str = "l40s-qwen3-32b-fp8";

/// How long a scheduler step takes and how much fits in the KV cache.
///
/// `step = max(weights_read_s + kv_read_s_per_token * kv_tokens_read,
///             prefill_s_per_token * prefill_tokens) + step_overhead_s
///         + per_decode_seq_s * decode_seqs` (all in simulated seconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Profile name (shown in logs and `/server_info`).
    pub name: String,
    /// Where the numbers come from.
    #[serde(default)]
    pub description: String,
    /// `a`: fixed cost of one forward pass (reading the weights), seconds.
    pub weights_read_s: f64,
    /// `b`: compute cost per prefill token, seconds.
    pub prefill_s_per_token: f64,
    /// `c`: cost per decoding sequence in the batch, seconds.
    pub per_decode_seq_s: f64,
    /// `d`: cost of reading one token of KV cache during attention, seconds.
    pub kv_read_s_per_token: f64,
    /// Scheduler and launch overhead per step, seconds.
    pub step_overhead_s: f64,
    /// Tokens that fit in the KV cache.
    pub kv_capacity_tokens: u64,
    /// Default tokens per KV block (vLLM `--block-size`).
    pub block_size: u32,
    /// Default token budget per step (vLLM `--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Default maximum running sequences (vLLM `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Default maximum prompt + output length (vLLM `--max-model-len`).
    pub max_model_len: u32,
}

/// Why a profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No built-in profile has this name.
    #[error(
        "unknown built-in profile {0:?} (known: l40s-qwen3-32b-fp8, tiny, l40s-27b-fp8, h100-27b-fp8)"
    )]
    UnknownBuiltin(String),
    /// The profile file could not be read.
    #[error("cannot read profile {path}: {source}")]
    Read {
        /// The file's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid profile document (syntax, unknown or missing fields).
    #[error("invalid profile {path}: {message}")]
    Parse {
        /// The file's path.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// The profile parsed but its values are out of range.
    #[error("invalid profile {path}: {message}")]
    Invalid {
        /// The file's path.
        path: String,
        /// Which value is wrong and why.
        message: String,
    },
}

impl Profile {
    /// A profile shipped with the crate (`l40s-qwen3-32b-fp8`, `tiny`, `l40s-27b-fp8`,
    /// `h100-27b-fp8`).
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        let (_, text) = BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| ProfileError::UnknownBuiltin(name.to_string()))?;
        Self::parse(text, name)
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }

    /// Loads a profile from a JSON or YAML file.
    pub fn from_file(path: &Path) -> Result<Self, ProfileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// A built-in name or else a file path.
    pub fn load(name_or_path: &str) -> Result<Self, ProfileError> {
        if BUILTIN.iter().any(|(n, _)| *n == name_or_path) {
            Self::builtin(name_or_path)
        } else {
            Self::from_file(Path::new(name_or_path))
        }
    }

    /// Parses JSON (or YAML, when the text does not start with `{`) and validates it.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let parsed: Result<Self, String> = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            serde_saphyr::from_str(text).map_err(|e| e.to_string())
        };
        let profile = parsed.map_err(|message| ProfileError::Parse {
            path: origin.to_string(),
            message,
        })?;
        profile
            .validate()
            .map_err(|message| ProfileError::Invalid {
                path: origin.to_string(),
                message,
            })?;
        Ok(profile)
    }

    fn validate(&self) -> Result<(), String> {
        let times = [
            ("weights_read_s", self.weights_read_s),
            ("prefill_s_per_token", self.prefill_s_per_token),
            ("per_decode_seq_s", self.per_decode_seq_s),
            ("kv_read_s_per_token", self.kv_read_s_per_token),
            ("step_overhead_s", self.step_overhead_s),
        ];
        for (name, v) in times {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{name} must be a finite number >= 0"));
            }
        }
        if self.weights_read_s + self.step_overhead_s <= 0.0 {
            return Err("a step must take some time (weights_read_s + step_overhead_s > 0)".into());
        }
        if self.block_size == 0 || self.max_num_batched_tokens == 0 || self.max_num_seqs == 0 {
            return Err("block_size, max_num_batched_tokens and max_num_seqs must be > 0".into());
        }
        if self.kv_capacity_tokens < u64::from(self.block_size) {
            return Err("kv_capacity_tokens must hold at least one block".into());
        }
        if self.max_model_len == 0 {
            return Err("max_model_len must be > 0".into());
        }
        Ok(())
    }

    /// Duration of one step, seconds.
    pub fn step_time(
        &self,
        prefill_tokens: usize,
        decode_seqs: usize,
        kv_tokens_read: usize,
    ) -> f64 {
        let memory = self.weights_read_s + self.kv_read_s_per_token * kv_tokens_read as f64;
        let compute = self.prefill_s_per_token * prefill_tokens as f64;
        memory.max(compute) + self.step_overhead_s + self.per_decode_seq_s * decode_seqs as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_match_the_l40s_calibration() {
        for name in Profile::builtin_names() {
            Profile::builtin(name).unwrap();
        }
        let p = Profile::builtin(DEFAULT_PROFILE).unwrap();
        assert_eq!(p.kv_capacity_tokens, 26_000);
        assert_eq!(p.max_num_batched_tokens, 2048);
        // Batch-1 decode with a 1k context: ~53 ms.
        let decode = p.step_time(0, 1, 1024);
        assert!((decode - (0.050 + 0.00000038 * 1024.0 + 0.003 + 0.0002)).abs() < 1e-12);
        // A 2,048-token prefill chunk is compute bound.
        assert!((p.step_time(2048, 0, 0) - (0.00021 * 2048.0 + 0.003)).abs() < 1e-12);
    }

    #[test]
    fn the_27b_profiles_differ_where_the_gpus_do() {
        let l40s = Profile::builtin("l40s-27b-fp8").unwrap();
        let h100 = Profile::builtin("h100-27b-fp8").unwrap();
        // ~5,900 vs ~20,600 prefill tokens/s: the H100 prefills 3.5x faster.
        let ratio = l40s.prefill_s_per_token / h100.prefill_s_per_token;
        assert!((3.4..3.6).contains(&ratio), "{ratio}");
        assert!(h100.kv_capacity_tokens > 2 * l40s.kv_capacity_tokens);
        assert!(h100.step_time(0, 1, 1024) < l40s.step_time(0, 1, 1024));
    }

    #[test]
    fn yaml_profiles_and_bad_values() {
        let yaml = "name: y\nweights_read_s: 0.01\nprefill_s_per_token: 0.0001\nper_decode_seq_s: 0\n\
                    kv_read_s_per_token: 0\nstep_overhead_s: 0\nkv_capacity_tokens: 1600\nblock_size: 16\n\
                    max_num_batched_tokens: 256\nmax_num_seqs: 4\nmax_model_len: 512\n";
        assert_eq!(Profile::parse(yaml, "t").unwrap().name, "y");
        let bad = yaml.replace("weights_read_s: 0.01", "weights_read_s: -1");
        assert!(matches!(
            Profile::parse(&bad, "t"),
            Err(ProfileError::Invalid { .. })
        ));
        assert!(matches!(
            Profile::parse("{", "t"),
            Err(ProfileError::Parse { .. })
        ));
        assert!(Profile::builtin("nope").is_err());
    }
}
