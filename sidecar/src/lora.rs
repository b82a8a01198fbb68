//! Which LoRA adapters the worker's vLLM serves: polled from vLLM's `/v1/models` (an entry
//! whose `parent` names a model is an adapter) and noted from the `lora_name` of its KV events
//! (an adapter loaded since the last poll shows up with its first cached block). The list
//! rides on every load sample (`LoadSample.lora_adapters`) so each router knows which workers
//! may take a request for an adapter (docs/lora.md).
//!
//! ```text
//! GET {vllm}/v1/models --parse_models--> [(name, base)] --LoraSet::replace--+
//! BlockStored.lora_name ----------------------------------LoraSet::note-----+--> LoadSample
//! ```
//!
//! [`parse_models`] and [`LoraSet`] are pure; [`Poller`] is the polling loop. Bounded: at most
//! [`MAX_ADAPTERS`] adapters of at most [`MAX_NAME_BYTES`] bytes each (vLLM serves a handful;
//! the rest are dropped and counted, never sent).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kvroute_proto::v1::{LoraAdapter, LoraAdapters};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::metrics::SidecarMetrics;

/// Most adapters reported per worker.
pub const MAX_ADAPTERS: usize = 256;
/// Longest adapter or base model name reported, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Why a `/v1/models` body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelsError {
    /// Not JSON.
    #[error("/v1/models is not JSON: {0}")]
    NotJson(String),
    /// JSON without a `data` array.
    #[error("/v1/models has no `data` array")]
    NoData,
}

impl ModelsError {
    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ModelsError::NotJson(_) => "not_json",
            ModelsError::NoData => "no_data",
        }
    }
}

/// The adapters of a vLLM `/v1/models` body, `(name, base model)` in listed order: every
/// entry with a string `id` and a string `parent` (base models have `parent: null`).
/// Entries of another shape are skipped.
pub fn parse_models(body: &[u8]) -> Result<Vec<(String, String)>, ModelsError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ModelsError::NotJson(e.to_string()))?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or(ModelsError::NoData)?;
    Ok(data
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?;
            let parent = m.get("parent")?.as_str()?;
            Some((id.to_string(), parent.to_string()))
        })
        .collect())
}

/// The worker's adapters: name -> base model (empty when only seen in events).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoraSet {
    adapters: BTreeMap<String, String>,
}

/// What a change to a [`LoraSet`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LoraChange {
    /// The set differs from before.
    pub changed: bool,
    /// Adapters left out: over [`MAX_ADAPTERS`], or a name over [`MAX_NAME_BYTES`] or empty.
    pub dropped: u64,
}

impl LoraSet {
    /// Replaces the set with a poll's result: adapters vLLM no longer lists are gone (an
    /// adapter only noted from events since the last poll goes too: the poll is the truth).
    pub fn replace(&mut self, polled: Vec<(String, String)>) -> LoraChange {
        let mut next = BTreeMap::new();
        let mut dropped = 0;
        for (name, base) in polled {
            if !fits(&name) || next.len() >= MAX_ADAPTERS && !next.contains_key(&name) {
                dropped += 1;
                continue;
            }
            let base = if base.len() > MAX_NAME_BYTES {
                String::new()
            } else {
                base
            };
            next.insert(name, base);
        }
        let changed = next != self.adapters;
        self.adapters = next;
        LoraChange { changed, dropped }
    }

    /// Notes an adapter a KV event names (`lora_name`); known ones change nothing.
    pub fn note(&mut self, name: &str) -> LoraChange {
        if self.adapters.contains_key(name) {
            return LoraChange::default();
        }
        if !fits(name) || self.adapters.len() >= MAX_ADAPTERS {
            return LoraChange {
                changed: false,
                dropped: 1,
            };
        }
        self.adapters.insert(name.to_string(), String::new());
        LoraChange {
            changed: true,
            dropped: 0,
        }
    }

    /// Number of adapters.
    pub fn len(&self) -> usize {
        self.adapters.len()
    }

    /// Whether no adapter is known.
    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    /// The list as it rides on a load sample (sorted by name).
    pub fn to_proto(&self) -> LoraAdapters {
        LoraAdapters {
            adapters: self
                .adapters
                .iter()
                .map(|(name, base)| LoraAdapter {
                    name: name.clone(),
                    base_model: base.clone(),
                })
                .collect(),
        }
    }
}

fn fits(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_BYTES
}

/// Polls vLLM's `/v1/models` and hands the adapters to the hub.
pub struct Poller {
    /// vLLM's base URL.
    pub url: String,
    /// Time between polls (adapters loaded at runtime appear within it, or sooner through
    /// their first KV event).
    pub interval: Duration,
    /// vLLM's `--api-key`, when it has one (`/v1/*` then needs it).
    pub api_key: Option<String>,
    /// Receives the adapter list.
    pub hub: Arc<Hub>,
    /// Poll outcomes and dropped adapters are counted here.
    pub metrics: SidecarMetrics,
}

impl Poller {
    /// Polls every `interval` until `shutdown`. A failed poll keeps the last list.
    pub async fn run(self, shutdown: CancellationToken) {
        let client = match reqwest::Client::builder()
            .timeout(
                self.interval
                    .clamp(Duration::from_secs(1), Duration::from_secs(10)),
            )
            .build()
        {
            Ok(c) => c,
            Err(error) => {
                tracing::error!(%error, "cannot build HTTP client; adapter polling disabled");
                return;
            }
        };
        let url = format!("{}/v1/models", self.url.trim_end_matches('/'));
        let mut tick = tokio::time::interval(self.interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut req = client.get(&url);
            if let Some(key) = &self.api_key {
                req = req.bearer_auth(key);
            }
            let fetched = async { req.send().await?.error_for_status()?.bytes().await }.await;
            let outcome = match fetched {
                Ok(body) => match parse_models(&body) {
                    Ok(polled) => {
                        let change = self.hub.set_adapters(polled);
                        self.metrics.lora_dropped.inc_by(change.dropped);
                        if change.changed {
                            tracing::info!(adapters = ?self.hub.adapters().to_proto().adapters.iter().map(|a| &a.name).collect::<Vec<_>>(), "LoRA adapters changed");
                        }
                        "ok"
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "vLLM /v1/models unreadable");
                        e.reason()
                    }
                },
                Err(error) => {
                    tracing::debug!(%error, "vLLM /v1/models poll failed");
                    "error"
                }
            };
            self.metrics.lora_polls.with_label_values(&[outcome]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_are_the_entries_with_a_parent() {
        let body = br#"{"object":"list","data":[
            {"id":"qwen","object":"model","root":"/m","parent":null,"max_model_len":4096},
            {"id":"sql","object":"model","root":"/a/sql","parent":"qwen"},
            {"id":"odd","parent":7},
            {"parent":"qwen"}
        ]}"#;
        assert_eq!(
            parse_models(body).unwrap(),
            vec![("sql".to_string(), "qwen".to_string())]
        );
        assert_eq!(parse_models(b"{}"), Err(ModelsError::NoData));
        assert!(matches!(
            parse_models(b"<html>"),
            Err(ModelsError::NotJson(_))
        ));
    }

    #[test]
    fn polls_replace_events_add_and_everything_is_bounded() {
        let mut set = LoraSet::default();
        assert!(set.note("from-event").changed);
        assert!(!set.note("from-event").changed);
        let c = set.replace(vec![("sql".into(), "qwen".into())]);
        assert!(c.changed);
        let names: Vec<String> = set
            .to_proto()
            .adapters
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(names, ["sql"], "the poll is the truth");
        assert!(!set.replace(vec![("sql".into(), "qwen".into())]).changed);

        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(set.note(&long).dropped, 1);
        assert_eq!(set.note("").dropped, 1);
        let many: Vec<(String, String)> = (0..MAX_ADAPTERS + 5)
            .map(|i| (format!("a{i:04}"), "qwen".into()))
            .collect();
        assert_eq!(set.replace(many).dropped, 5);
        assert_eq!(set.len(), MAX_ADAPTERS);
        assert_eq!(set.note("one-more").dropped, 1);
        let base_too_long = set.replace(vec![("a".into(), long)]);
        assert_eq!(base_too_long.dropped, 0);
        assert_eq!(set.to_proto().adapters[0].base_model, "");
    }
}
