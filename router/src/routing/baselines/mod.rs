//! Re-implementations of the routing rules of the systems kvroute is compared with, each
//! following one named upstream release (read from its source; facts and default numbers
//! only, no code taken). They choose from the same [`ChoiceContext`] as kvroute's own rule,
//! so a benchmark compares rules on identical inputs, not implementations of the plumbing.
//!
//! ```text
//! ChoiceContext (+ prompt tokens) --> SglangCacheAware  sglang-router 0.3.2, cache_aware + tree
//!                                 --> DynamoCost        dynamo-kv-router 1.6.1, default selector
//!                                 --> LlmdDefault       llm-d-inference-scheduler v0.8.0, precise profile
//!                                 --> LlmdSticky        llm-d-router v0.10.0, affinity filter + token load
//! ```
//!
//! Where the routers' inputs differ from what a kvroute router sees, each type's doc says
//! what stands in for what (e.g. tokens for SGLang's characters).
//!
//! [`ChoiceContext`]: super::ChoiceContext

mod dynamo;
mod llmd;
mod sglang;
mod sglang_tree;

pub use dynamo::{DynamoCost, DynamoCostConfig};
pub use llmd::{LlmdDefault, LlmdDefaultWeights, LlmdSticky, LlmdStickyConfig};
pub use sglang::{SglangCacheAware, SglangCacheAwareConfig};
pub use sglang_tree::ApproxTree;
