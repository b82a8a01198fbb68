//! Gateway errors and their two client-facing shapes (pure: no HTTP types).
//!
//! ```text
//! GatewayError --status()--------> 400 | 401 | 403 | 404 | 408 | 413 | 429 | 502 | 503 | 504
//!              --retry_after()----> seconds, for the refusals of admission control and limits
//!              --www_authenticate()-> the challenge of a 401
//!              --openai_body()----> {"error":{"message","type","param","code"}}
//!              --anthropic_body()-> {"type":"error","error":{"type","message"}}
//! ```
//!
//! Messages describe what the client did wrong or which side failed; they never carry upstream
//! addresses, internal error chains or panics. Variant names double as metric labels
//! ([`GatewayError::label`]).

use serde_json::{Value, json};

/// Everything that can end a gateway request before or instead of a worker's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// The body is not valid JSON (or not a JSON object).
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// A required field is absent.
    #[error("missing required field `{0}`")]
    MissingField(&'static str),
    /// A field is present but has the wrong shape.
    #[error("invalid field `{field}`: {reason}")]
    InvalidField {
        /// JSON path of the field.
        field: String,
        /// What was expected.
        reason: String,
    },
    /// No pool or alias serves this model name.
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// The body exceeds `--max-body-bytes`.
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The model is known but no worker for it is ready.
    #[error("no ready worker for model `{0}`")]
    NoReadyWorker(String),
    /// The model's tokenizer is still loading or failing to load; routing it without tokens
    /// would ignore every worker's cache, so its pool has to opt into that.
    #[error("the tokenizer of model `{model}` {}; retry later", tokenizer_not_ready_text(*.failed))]
    TokenizerNotReady {
        /// The client's model name.
        model: String,
        /// At least one load attempt failed (else it is still loading).
        failed: bool,
    },
    /// The worker could not be reached or broke the connection.
    #[error("the upstream worker failed: {0}")]
    Upstream(String),
    /// The worker did not answer in time.
    #[error("the upstream worker timed out")]
    UpstreamTimeout,
    /// The body did not arrive within `--request-body-timeout-s`.
    #[error("the request body did not arrive within {limit_s} seconds")]
    BodyTimeout {
        /// The configured deadline, seconds.
        limit_s: u64,
    },
    /// The router has `--max-concurrent-requests` in flight: it sheds the request.
    #[error("the router is at its limit of concurrent requests; retry later")]
    Overloaded,
    /// This client has `--max-concurrent-requests-per-client` in flight.
    #[error("too many concurrent requests from this client; retry later")]
    ClientOverloaded,
    /// Every thread of the routing decision pool is busy and its queue is full.
    #[error("the router is busy routing other requests; retry later")]
    DecisionPoolFull,
    /// A bug on our side (e.g. the routing decision panicked); details are only logged.
    #[error("internal error")]
    Internal,
    /// The caller is not authenticated (401) or may not name a tenant (403).
    #[error("{0}")]
    Auth(crate::tenant::AuthError),
    /// A tenant limit refuses the request (429).
    #[error("{0}")]
    TenantLimit(crate::tenant::LimitExceeded),
    /// An InferencePolicy rule refuses the request, with its status and message.
    #[error("{message}")]
    PolicyRejected {
        /// The rule's HTTP status (400-599).
        status: u16,
        /// The rule's message (written by the operator).
        message: String,
    },
    /// A sheddable request that every local worker is predicted to serve too late.
    #[error(
        "every local worker is predicted to miss this request's TTFT target of {target_ms} ms; retry later"
    )]
    SloShed {
        /// The TTFT target, milliseconds.
        target_ms: u64,
        /// Seconds before a retry.
        retry_after_s: u64,
    },
    /// A policy keeps the request local and no local worker can take it.
    #[error(
        "no local worker can take this request for model `{0}` now; it may not leave the cluster"
    )]
    NoLocalCapacity(String),
    /// The overflow provider failed, or refused the router's credentials (details logged,
    /// never the provider's URL or key).
    #[error("the overflow provider failed: {0}")]
    ProviderFailed(String),
    /// The overflow provider did not answer in time.
    #[error("the overflow provider did not answer in time")]
    ProviderTimeout,
    /// The overflow provider cannot take the request (not ready, overloaded, API kind).
    #[error("the overflow provider is unavailable: {0}")]
    ProviderUnavailable(String),
    /// A provider limit (its own 429, or its `spec.limits` in this router) is reached.
    #[error("the overflow provider is at its limit: {0}; retry later")]
    ProviderRateLimited(String),
}

impl GatewayError {
    /// The gateway's error for a policy outcome of the decision path; `None` for other pick
    /// errors (mapped where the client's model name is at hand).
    pub fn from_policy(e: &crate::state::PickError) -> Option<Self> {
        use crate::state::PickError;
        match e {
            PickError::Rejected {
                status, message, ..
            } => Some(Self::PolicyRejected {
                status: *status,
                message: message.clone(),
            }),
            PickError::Shed {
                target_ms,
                retry_after_s,
                ..
            } => Some(Self::SloShed {
                target_ms: *target_ms,
                retry_after_s: *retry_after_s,
            }),
            PickError::NoLocalCapacity { model, .. } => Some(Self::NoLocalCapacity(model.clone())),
            _ => None,
        }
    }
}

impl GatewayError {
    /// The gateway's error for any pick error of the decision path, for a request that asked
    /// for `client_model` (every front door that answers in the gateway's shapes maps alike).
    pub fn from_pick(e: &crate::state::PickError, client_model: &str) -> Self {
        use crate::state::PickError;
        match e {
            PickError::UnknownModel(_) => Self::UnknownModel(client_model.to_string()),
            PickError::NoReadyWorker(_) => Self::NoReadyWorker(client_model.to_string()),
            PickError::TokenizerNotReady { failed, .. } => Self::TokenizerNotReady {
                model: client_model.to_string(),
                failed: *failed,
            },
            other => Self::from_policy(other).unwrap_or(Self::Internal),
        }
    }

    /// HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            Self::MalformedJson(_) | Self::MissingField(_) | Self::InvalidField { .. } => 400,
            Self::UnknownModel(_) => 404,
            Self::BodyTimeout { .. } => 408,
            Self::BodyTooLarge { .. } => 413,
            Self::ClientOverloaded | Self::TenantLimit(_) | Self::SloShed { .. } => 429,
            Self::Auth(e) => e.status(),
            Self::PolicyRejected { status, .. } => *status,
            Self::Upstream(_) => 502,
            Self::NoReadyWorker(_)
            | Self::TokenizerNotReady { .. }
            | Self::Overloaded
            | Self::DecisionPoolFull
            | Self::NoLocalCapacity(_) => 503,
            Self::UpstreamTimeout => 504,
            Self::Internal => 500,
            Self::ProviderFailed(_) => 502,
            Self::ProviderTimeout => 504,
            Self::ProviderUnavailable(_) => 503,
            Self::ProviderRateLimited(_) => 429,
        }
    }

    /// Stable, bounded label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed_json",
            Self::MissingField(_) => "missing_field",
            Self::InvalidField { .. } => "invalid_field",
            Self::UnknownModel(_) => "unknown_model",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::NoReadyWorker(_) => "no_ready_worker",
            Self::TokenizerNotReady { .. } => "tokenizer_not_ready",
            Self::Upstream(_) => "upstream_error",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::Overloaded => "overloaded",
            Self::ClientOverloaded => "client_overloaded",
            Self::DecisionPoolFull => "decision_pool_full",
            Self::Internal => "internal",
            Self::ProviderFailed(_) => "provider_failed",
            Self::ProviderTimeout => "provider_timeout",
            Self::ProviderUnavailable(_) => "provider_unavailable",
            Self::ProviderRateLimited(_) => "provider_rate_limited",
            Self::PolicyRejected { .. } => "policy_rejected",
            Self::SloShed { .. } => "slo_shed",
            Self::NoLocalCapacity(_) => "no_local_capacity",
            Self::Auth(e) if e.status() == 403 => "forbidden",
            Self::Auth(_) => "unauthenticated",
            Self::TenantLimit(_) => "tenant_limit",
        }
    }

    /// The `WWW-Authenticate` challenge of a 401.
    pub fn www_authenticate(&self) -> Option<&'static str> {
        match self {
            Self::Auth(crate::tenant::AuthError::InvalidToken(_)) => {
                Some(r#"Bearer realm="kvroute", error="invalid_token""#)
            }
            Self::Auth(e) if e.status() == 401 => Some(r#"Bearer realm="kvroute""#),
            _ => None,
        }
    }

    /// Seconds a client should wait before retrying (`Retry-After`), for load shedding.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Overloaded
            | Self::ClientOverloaded
            | Self::DecisionPoolFull
            | Self::ProviderRateLimited(_) => Some(1),
            Self::TenantLimit(e) => Some(e.retry_after.as_secs().max(1)),
            Self::SloShed { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    fn param(&self) -> Value {
        match self {
            Self::MissingField(f) => Value::from(*f),
            Self::InvalidField { field, .. } => Value::from(field.as_str()),
            Self::UnknownModel(_) | Self::TokenizerNotReady { .. } => Value::from("model"),
            _ => Value::Null,
        }
    }

    fn openai_type(&self) -> &'static str {
        match self.status() {
            400 | 401 | 404 | 408 | 413 => "invalid_request_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            _ => "server_error",
        }
    }

    fn openai_code(&self) -> Value {
        match self {
            Self::UnknownModel(_) => Value::from("model_not_found"),
            Self::BodyTooLarge { .. } => Value::from("request_too_large"),
            Self::NoReadyWorker(_) => Value::from("no_ready_worker"),
            Self::TokenizerNotReady { .. } => Value::from("tokenizer_not_ready"),
            Self::MalformedJson(_) => Value::from("invalid_json"),
            Self::MissingField(_) => Value::from("missing_required_parameter"),
            Self::InvalidField { .. } => Value::from("invalid_value"),
            Self::Upstream(_) => Value::from("upstream_error"),
            Self::UpstreamTimeout => Value::from("upstream_timeout"),
            Self::BodyTimeout { .. } => Value::from("request_timeout"),
            Self::Overloaded | Self::DecisionPoolFull => Value::from("overloaded"),
            Self::ClientOverloaded => Value::from("rate_limit_exceeded"),
            Self::Internal => Value::from("internal_error"),
            Self::Auth(e) => Value::from(e.code()),
            Self::TenantLimit(_) => Value::from("rate_limit_exceeded"),
            Self::PolicyRejected { .. } => Value::from("policy_rejected"),
            Self::SloShed { .. } => Value::from("slo_shed"),
            Self::ProviderFailed(_) => Value::from("provider_error"),
            Self::ProviderTimeout => Value::from("provider_timeout"),
            Self::ProviderUnavailable(_) => Value::from("provider_unavailable"),
            Self::ProviderRateLimited(_) => Value::from("rate_limit_exceeded"),
            Self::NoLocalCapacity(_) => Value::from("no_local_capacity"),
        }
    }

    /// `{"error": {"message", "type", "param", "code"}}`, as OpenAI clients expect.
    pub fn openai_body(&self) -> Value {
        json!({"error": {
            "message": self.to_string(),
            "type": self.openai_type(),
            "param": self.param(),
            "code": self.openai_code(),
        }})
    }

    /// `{"type": "error", "error": {"type", "message"}}`, as Anthropic clients expect.
    pub fn anthropic_body(&self) -> Value {
        json!({"type": "error", "error": {"type": anthropic_error_type(self.status()), "message": self.to_string()}})
    }
}

/// The Anthropic error type for an HTTP status (also used for worker errors passed through).
pub fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        400 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Turns a worker's non-success answer (OpenAI-shaped or not) into an Anthropic error body,
/// keeping the worker's message when it has one.
pub fn anthropic_from_upstream(status: u16, body: &[u8]) -> Value {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            let e = v.get("error")?;
            e.get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| e.as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| format!("the upstream worker answered with status {status}"));
    json!({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})
}

/// How a tokenizer that is not loaded is described to clients: still loading, or failing.
pub fn tokenizer_not_ready_text(failed: bool) -> &'static str {
    if failed {
        "failed to load; the router keeps retrying"
    } else {
        "is still loading"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        let cases = [
            (GatewayError::MalformedJson("x".into()), 400),
            (GatewayError::MissingField("model"), 400),
            (
                GatewayError::InvalidField {
                    field: "messages".into(),
                    reason: "must be an array".into(),
                },
                400,
            ),
            (GatewayError::UnknownModel("m".into()), 404),
            (GatewayError::BodyTooLarge { limit: 10 }, 413),
            (GatewayError::Upstream("reset".into()), 502),
            (GatewayError::NoReadyWorker("m".into()), 503),
            (
                GatewayError::TokenizerNotReady {
                    model: "m".into(),
                    failed: true,
                },
                503,
            ),
            (GatewayError::UpstreamTimeout, 504),
            (GatewayError::Internal, 500),
            (GatewayError::BodyTimeout { limit_s: 30 }, 408),
            (GatewayError::ClientOverloaded, 429),
            (GatewayError::Overloaded, 503),
            (GatewayError::DecisionPoolFull, 503),
            (GatewayError::ProviderFailed("x".into()), 502),
            (GatewayError::ProviderTimeout, 504),
            (GatewayError::ProviderUnavailable("x".into()), 503),
            (GatewayError::ProviderRateLimited("x".into()), 429),
            (GatewayError::NoLocalCapacity("x".into()), 503),
        ];
        for (e, status) in cases {
            assert_eq!(e.status(), status, "{e:?}");
        }
    }

    #[test]
    fn tokenizer_not_ready_says_loading_or_failing() {
        let body = |failed| {
            GatewayError::TokenizerNotReady {
                model: "llama".into(),
                failed,
            }
            .openai_body()
        };
        let loading = body(false);
        assert_eq!(loading["error"]["code"], "tokenizer_not_ready");
        assert_eq!(loading["error"]["type"], "service_unavailable_error");
        assert_eq!(loading["error"]["param"], "model");
        assert_eq!(
            loading["error"]["message"],
            "the tokenizer of model `llama` is still loading; retry later"
        );
        assert_eq!(
            body(true)["error"]["message"],
            "the tokenizer of model `llama` failed to load; the router keeps retrying; retry later"
        );
    }

    #[test]
    fn openai_shape() {
        let body = GatewayError::UnknownModel("gpt-x".into()).openai_body();
        assert_eq!(
            body,
            json!({"error": {"message": "the model `gpt-x` does not exist", "type": "invalid_request_error",
                "param": "model", "code": "model_not_found"}})
        );
        let body = GatewayError::NoReadyWorker("m".into()).openai_body();
        assert_eq!(body["error"]["param"], Value::Null);
        assert_eq!(body["error"]["type"], "service_unavailable_error");
    }

    #[test]
    fn anthropic_shape() {
        assert_eq!(
            GatewayError::MissingField("max_tokens").anthropic_body(),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "missing required field `max_tokens`"}})
        );
        assert_eq!(
            GatewayError::BodyTooLarge { limit: 1 }.anthropic_body()["error"]["type"],
            "request_too_large"
        );
        assert_eq!(
            GatewayError::NoReadyWorker("m".into()).anthropic_body()["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(
            GatewayError::Upstream("x".into()).anthropic_body()["error"]["type"],
            "api_error"
        );
    }

    #[test]
    fn shedding_says_when_to_retry_in_both_shapes() {
        for e in [
            GatewayError::Overloaded,
            GatewayError::ClientOverloaded,
            GatewayError::DecisionPoolFull,
        ] {
            assert_eq!(e.retry_after(), Some(1), "{e:?}");
        }
        assert_eq!(GatewayError::NoReadyWorker("m".into()).retry_after(), None);
        assert_eq!(
            GatewayError::ClientOverloaded.openai_body(),
            json!({"error": {"message": "too many concurrent requests from this client; retry later",
                "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}})
        );
        assert_eq!(
            GatewayError::ClientOverloaded.anthropic_body()["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(
            GatewayError::Overloaded.openai_body()["error"]["code"],
            "overloaded"
        );
        assert_eq!(
            GatewayError::Overloaded.anthropic_body()["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(
            GatewayError::BodyTimeout { limit_s: 30 }.anthropic_body()["error"]["type"],
            "invalid_request_error"
        );
    }

    #[test]
    fn tenant_refusals_in_both_shapes() {
        use crate::tenant::{AuthError, LimitExceeded, LimitKind};
        let missing = GatewayError::Auth(AuthError::MissingCredentials);
        assert_eq!(missing.status(), 401);
        assert_eq!(
            missing.www_authenticate(),
            Some(r#"Bearer realm="kvroute""#)
        );
        assert_eq!(
            missing.openai_body(),
            json!({"error": {"message": "authentication required: send an API key (Authorization: Bearer or x-api-key) or a bearer token",
                "type": "invalid_request_error", "param": null, "code": "missing_api_key"}})
        );
        assert_eq!(
            missing.anthropic_body()["error"]["type"],
            "authentication_error"
        );
        let token = GatewayError::Auth(AuthError::InvalidToken(
            crate::tenant::jwt::JwtError::WrongAudience,
        ));
        // The detail (audience) is a metric label, not the client's business.
        assert_eq!(
            token.openai_body()["error"]["message"],
            "the bearer token is not valid or has expired"
        );
        assert!(
            token
                .www_authenticate()
                .is_some_and(|c| c.contains("invalid_token"))
        );
        let header = GatewayError::Auth(AuthError::UntrustedTenantHeader);
        assert_eq!((header.status(), header.www_authenticate()), (403, None));
        assert_eq!(header.openai_body()["error"]["type"], "permission_error");
        assert_eq!(header.anthropic_body()["error"]["type"], "permission_error");
        let limit = GatewayError::TenantLimit(LimitExceeded {
            limit: LimitKind::TokensPerMinute,
            retry_after: std::time::Duration::from_secs(7),
        });
        assert_eq!((limit.status(), limit.retry_after()), (429, Some(7)));
        assert_eq!(
            limit.openai_body(),
            json!({"error": {"message": "tenant limit reached: tokens_per_minute; retry after 7 s",
                "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}})
        );
        assert_eq!(limit.anthropic_body()["error"]["type"], "rate_limit_error");
    }

    #[test]
    fn policy_outcomes_in_both_shapes() {
        let rejected = GatewayError::PolicyRejected {
            status: 451,
            message: "not here".into(),
        };
        assert_eq!(rejected.status(), 451);
        assert_eq!(
            rejected.openai_body(),
            json!({"error": {"message": "not here", "type": "server_error", "param": null, "code": "policy_rejected"}})
        );
        let forbidden = GatewayError::PolicyRejected {
            status: 403,
            message: "no".into(),
        };
        assert_eq!(forbidden.openai_body()["error"]["type"], "permission_error");
        assert_eq!(
            forbidden.anthropic_body(),
            json!({"type": "error", "error": {"type": "permission_error", "message": "no"}})
        );
        let shed = GatewayError::SloShed {
            target_ms: 500,
            retry_after_s: 2,
        };
        assert_eq!((shed.status(), shed.retry_after()), (429, Some(2)));
        assert_eq!(shed.anthropic_body()["error"]["type"], "rate_limit_error");
        assert_eq!(shed.openai_body()["error"]["code"], "slo_shed");
        let local = GatewayError::NoLocalCapacity("m".into());
        assert_eq!((local.status(), local.retry_after()), (503, None));
        assert_eq!(local.anthropic_body()["error"]["type"], "overloaded_error");
    }

    #[test]
    fn upstream_errors_keep_the_workers_message() {
        let body =
            br#"{"error":{"message":"max_tokens too large","type":"BadRequestError","code":400}}"#;
        assert_eq!(
            anthropic_from_upstream(400, body),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens too large"}})
        );
        assert_eq!(
            anthropic_from_upstream(500, b"<html>")["error"]["type"],
            "api_error"
        );
    }
}
