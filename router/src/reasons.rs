//! The reason strings the router shows an operator, gathered where the code keeps them:
//! why a decision was degraded (`kvroute_router_degraded_decisions_total{reason}`, the
//! decision record's `degraded_reason`), why a worker was chosen (`explain`'s `reason`),
//! why a request was refused (the error body's `code`, `..._errors_total{kind}`), why a caller
//! was not authenticated and which tenant limit refused it. docs/troubleshooting.md has a
//! heading for each; the tests below fail when one is added without one.
//!
//! ```text
//! tokens_for --Degraded::label--> DEGRADED_OWN + TokenizeError::LABELS
//! choose --Reason::as_str--> explain / requests_total{reason}
//! GatewayError::label, AuthError::label, LimitKind::label --> error bodies and metrics
//! ```

use kvroute_tokenization::TokenizeError;

/// Degraded: the model has no tokenizer (none configured, or still loading in a pool that
/// allows load-only routing).
pub const NO_TOKENIZER: &str = "no_tokenizer";
/// Degraded: the request carried no prompt the router can read (the Pick API without one).
pub const NO_PROMPT: &str = "no_prompt";
/// Degraded: a completion request's `prompt` is not a string, list of strings or token ids.
pub const INVALID_PROMPT: &str = "invalid_prompt";
/// Degraded: a chat request the tokenizer cannot read (also a [`TokenizeError`] label).
pub const INVALID_REQUEST: &str = "invalid_request";
/// Degraded: a client-given token id is negative or too large (also a [`TokenizeError`]
/// label).
pub const TOKEN_OUT_OF_VOCAB: &str = "token_out_of_vocab";

/// The degraded reasons the router sets itself; the rest are [`TokenizeError::LABELS`].
pub const DEGRADED_OWN: &[&str] = &[NO_TOKENIZER, NO_PROMPT, INVALID_PROMPT];

/// Every degraded-decision reason.
pub fn degraded() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = DEGRADED_OWN.to_vec();
    out.extend(TokenizeError::LABELS.iter().copied());
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::gateway::error::GatewayError;
    use crate::routing::Reason;
    use crate::state::PickError;
    use crate::tenant::jwt::JwtError;
    use crate::tenant::{AuthError, LimitExceeded, LimitKind};

    const DOC: &str = include_str!("../../docs/troubleshooting.md");

    /// True when a markdown heading of the page names `word` in backticks.
    fn has_heading(word: &str) -> bool {
        let needle = format!("`{word}`");
        DOC.lines()
            .any(|l| l.starts_with('#') && l.contains(&needle))
    }

    fn missing(words: impl IntoIterator<Item = &'static str>) -> Vec<&'static str> {
        words.into_iter().filter(|w| !has_heading(w)).collect()
    }

    /// One decision reason of each variant: a new variant fails to compile here.
    fn decision_reasons() -> Vec<Reason> {
        let all = vec![
            Reason::OnlyCandidate,
            Reason::LowestPredictedTtft,
            Reason::TieBreak,
            Reason::DegradedLoadOnly,
            Reason::Random,
            Reason::RoundRobin,
            Reason::LeastLoaded,
            Reason::MaxPrefix,
            Reason::DynamoCost,
            Reason::CacheMatch,
            Reason::SmallestCache,
            Reason::ShortestQueue,
            Reason::LowMatch,
            Reason::LlmdScore,
            Reason::StickyWarm,
            Reason::StickyReleased,
            Reason::HotPrefixCopy,
        ];
        for r in &all {
            match r {
                Reason::OnlyCandidate
                | Reason::LowestPredictedTtft
                | Reason::TieBreak
                | Reason::DegradedLoadOnly
                | Reason::Random
                | Reason::RoundRobin
                | Reason::LeastLoaded
                | Reason::MaxPrefix
                | Reason::DynamoCost
                | Reason::CacheMatch
                | Reason::SmallestCache
                | Reason::ShortestQueue
                | Reason::LowMatch
                | Reason::LlmdScore
                | Reason::StickyWarm
                | Reason::StickyReleased
                | Reason::HotPrefixCopy => {}
            }
        }
        all
    }

    fn jwt_errors() -> Vec<JwtError> {
        let all = vec![
            JwtError::Malformed,
            JwtError::UnsupportedAlg,
            JwtError::UnknownKid,
            JwtError::BadSignature,
            JwtError::Expired,
            JwtError::NotYetValid,
            JwtError::WrongIssuer,
            JwtError::WrongAudience,
            JwtError::BadTenant,
        ];
        for e in &all {
            match e {
                JwtError::Malformed
                | JwtError::UnsupportedAlg
                | JwtError::UnknownKid
                | JwtError::BadSignature
                | JwtError::Expired
                | JwtError::NotYetValid
                | JwtError::WrongIssuer
                | JwtError::WrongAudience
                | JwtError::BadTenant => {}
            }
        }
        all
    }

    fn auth_errors() -> Vec<AuthError> {
        let mut all = vec![
            AuthError::MissingCredentials,
            AuthError::InvalidApiKey,
            AuthError::KeysUnavailable,
            AuthError::UntrustedTenantHeader,
            AuthError::InvalidTenantHeader,
        ];
        all.extend(jwt_errors().into_iter().map(AuthError::InvalidToken));
        for e in &all {
            match e {
                AuthError::MissingCredentials
                | AuthError::InvalidApiKey
                | AuthError::InvalidToken(_)
                | AuthError::KeysUnavailable
                | AuthError::UntrustedTenantHeader
                | AuthError::InvalidTenantHeader => {}
            }
        }
        all
    }

    fn limit_kinds() -> Vec<LimitKind> {
        let all = vec![
            LimitKind::RequestsPerMinute,
            LimitKind::TokensPerMinute,
            LimitKind::Concurrency,
        ];
        for k in &all {
            match k {
                LimitKind::RequestsPerMinute
                | LimitKind::TokensPerMinute
                | LimitKind::Concurrency => {}
            }
        }
        all
    }

    fn gateway_errors() -> Vec<GatewayError> {
        let s = String::new;
        let mut all = vec![
            GatewayError::MalformedJson(s()),
            GatewayError::MissingField("model"),
            GatewayError::InvalidField {
                field: s(),
                reason: s(),
            },
            GatewayError::UnknownModel(s()),
            GatewayError::BodyTooLarge { limit: 1 },
            GatewayError::NoReadyWorker(s()),
            GatewayError::TokenizerNotReady {
                model: s(),
                failed: false,
            },
            GatewayError::Upstream(s()),
            GatewayError::UpstreamTimeout,
            GatewayError::BodyTimeout { limit_s: 1 },
            GatewayError::Overloaded,
            GatewayError::ClientOverloaded,
            GatewayError::DecisionPoolFull,
            GatewayError::Internal,
            GatewayError::PolicyRejected {
                status: 403,
                message: s(),
            },
            GatewayError::SloShed {
                target_ms: 1,
                retry_after_s: 1,
            },
            GatewayError::NoLocalCapacity(s()),
            GatewayError::ProviderFailed(s()),
            GatewayError::ProviderTimeout,
            GatewayError::ProviderUnavailable(s()),
            GatewayError::ProviderRateLimited(s()),
        ];
        all.extend(auth_errors().into_iter().map(GatewayError::Auth));
        all.extend(limit_kinds().into_iter().map(|limit| {
            GatewayError::TenantLimit(LimitExceeded {
                limit,
                retry_after: Duration::from_secs(1),
            })
        }));
        for e in &all {
            match e {
                GatewayError::MalformedJson(_)
                | GatewayError::MissingField(_)
                | GatewayError::InvalidField { .. }
                | GatewayError::UnknownModel(_)
                | GatewayError::BodyTooLarge { .. }
                | GatewayError::NoReadyWorker(_)
                | GatewayError::TokenizerNotReady { .. }
                | GatewayError::Upstream(_)
                | GatewayError::UpstreamTimeout
                | GatewayError::BodyTimeout { .. }
                | GatewayError::Overloaded
                | GatewayError::ClientOverloaded
                | GatewayError::DecisionPoolFull
                | GatewayError::Internal
                | GatewayError::Auth(_)
                | GatewayError::TenantLimit(_)
                | GatewayError::PolicyRejected { .. }
                | GatewayError::SloShed { .. }
                | GatewayError::NoLocalCapacity(_)
                | GatewayError::ProviderFailed(_)
                | GatewayError::ProviderTimeout
                | GatewayError::ProviderUnavailable(_)
                | GatewayError::ProviderRateLimited(_) => {}
            }
        }
        all
    }

    fn pick_errors() -> Vec<PickError> {
        let s = String::new;
        let all = vec![
            PickError::UnknownModel(s()),
            PickError::NoReadyWorker(s()),
            PickError::TokenizerNotReady {
                model: s(),
                failed: true,
            },
            PickError::Rejected {
                status: 403,
                message: s(),
                policy: s(),
                rule: s(),
            },
            PickError::Shed {
                target_ms: 1,
                retry_after_s: 1,
                rule: s(),
            },
            PickError::NoLocalCapacity {
                model: s(),
                rule: s(),
            },
        ];
        for e in &all {
            match e {
                PickError::UnknownModel(_)
                | PickError::NoReadyWorker(_)
                | PickError::TokenizerNotReady { .. }
                | PickError::Rejected { .. }
                | PickError::Shed { .. }
                | PickError::NoLocalCapacity { .. } => {}
            }
        }
        all
    }

    #[test]
    fn the_degraded_reasons_the_router_spells_itself_are_tokenize_labels_or_its_own() {
        for r in [INVALID_REQUEST, TOKEN_OUT_OF_VOCAB] {
            assert!(TokenizeError::LABELS.contains(&r), "{r}");
        }
        assert_eq!(
            degraded().len(),
            DEGRADED_OWN.len() + TokenizeError::LABELS.len()
        );
    }

    #[test]
    fn every_degraded_reason_has_a_troubleshooting_heading() {
        assert_eq!(missing(degraded()), Vec::<&str>::new());
    }

    #[test]
    fn every_decision_reason_has_a_troubleshooting_heading() {
        assert_eq!(
            missing(decision_reasons().into_iter().map(Reason::as_str)),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn every_error_code_and_label_has_a_troubleshooting_heading() {
        let errors = gateway_errors();
        assert_eq!(
            missing(errors.iter().map(GatewayError::label)),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing(pick_errors().iter().map(PickError::label)),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing(auth_errors().iter().map(AuthError::label)),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing(limit_kinds().into_iter().map(LimitKind::label)),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn every_refusal_status_is_one_the_page_explains() {
        // 401/403/429/503 (and the rest) each appear next to a label's heading.
        for e in gateway_errors() {
            let status = e.status().to_string();
            let label = format!("`{}`", e.label());
            assert!(
                DOC.lines()
                    .any(|l| l.starts_with('#') && l.contains(&label) && l.contains(&status)),
                "no heading names {label} with its status {status}"
            );
        }
    }
}
