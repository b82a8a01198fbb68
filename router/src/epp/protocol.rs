//! The endpoint picker protocol of the Gateway API Inference Extension on top of Envoy's
//! ext_proc messages: what the data plane tells the picker (request headers, the subset hint,
//! the served endpoint) and what the picker answers (the destination, in a header and in
//! dynamic metadata, or an immediate response). Pure: no sockets, no router state.
//!
//! ```text
//! ProcessingRequest.metadata_context["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"]
//!     --subset()--> Subset::Only([ip:port, ..]) | Subset::Any
//! ProcessingRequest.request_headers --request_head()--> path, http::HeaderMap
//! destination [primary, fallback..] --destination_reply()-->
//!     header  x-gateway-destination-endpoint: "primary,fallback,.."   (overwritten, never appended)
//!     dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]: the same string
//! GatewayError --immediate()--> ImmediateResponse {status, the gateway's JSON body, Retry-After}
//! response phase: metadata_context["envoy.lb"]["x-gateway-destination-endpoint-served"]
//!     (or the response header of that name) --served()--> ip:port
//! ```
//!
//! Tolerant decoding: unknown metadata keys and fields are ignored; a subset entry that is not
//! a string is skipped (it cannot name an endpoint); header values that are not valid HTTP are
//! dropped (they cannot match a policy rule).

use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as EnvoyHeaderMap, HeaderValue, HeaderValueOption, Metadata,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, ProtocolConfiguration, StreamedBodyResponse, TrailersResponse,
    body_mutation, processing_response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use http::{HeaderMap, HeaderName, HeaderValue as HttpHeaderValue};

use crate::gateway::GatewayError;

/// The header (and dynamic-metadata key) carrying the picked endpoints, `ip:port,ip:port,..`.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The dynamic-metadata namespace of the destination and of the served endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The filter-metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset hint's endpoint list.
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The key (metadata) or header (response) naming the endpoint that served the request.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";

/// How the data plane sends a body (`ProtocolConfiguration`, sent with the first message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyMode {
    /// No body is sent.
    None,
    /// `FULL_DUPLEX_STREAMED` (GIE's mode; also assumed when the data plane does not say):
    /// the picker answers the request headers only after the body's last chunk, and sends
    /// the body back itself.
    FullDuplex,
    /// `BUFFERED` / `BUFFERED_PARTIAL` / `STREAMED`: every message gets its own answer at once;
    /// the destination rides on the answer to the body's last chunk.
    PerMessage,
}

impl BodyMode {
    /// The mode of an `ext_proc` `BodySendMode` value (unknown values: full duplex).
    pub fn of(mode: i32) -> Self {
        match BodySendMode::try_from(mode) {
            Ok(BodySendMode::None) => BodyMode::None,
            Ok(BodySendMode::Streamed | BodySendMode::Buffered | BodySendMode::BufferedPartial) => {
                BodyMode::PerMessage
            }
            Ok(BodySendMode::FullDuplexStreamed | BodySendMode::Grpc) | Err(_) => {
                BodyMode::FullDuplex
            }
        }
    }

    /// The (request, response) body modes a stream's first message announces; without a
    /// protocol configuration, full duplex both ways (what GIE configures).
    pub fn of_config(config: Option<&ProtocolConfiguration>) -> (Self, Self) {
        match config {
            Some(c) => (
                Self::of(c.request_body_mode),
                Self::of(c.response_body_mode),
            ),
            None => (BodyMode::FullDuplex, BodyMode::FullDuplex),
        }
    }
}

/// The endpoints a request may go to, per the data plane's subset hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subset {
    /// No hint: any endpoint of the pool.
    Any,
    /// Only these `ip:port` endpoints (an empty list admits none: 503).
    Only(Vec<String>),
}

impl Subset {
    /// Whether `address` is admitted.
    pub fn admits(&self, address: &str) -> bool {
        match self {
            Subset::Any => true,
            Subset::Only(list) => list.iter().any(|e| same_endpoint(e, address)),
        }
    }
}

/// Two `ip:port` strings name the same endpoint (compared as socket addresses when both
/// parse, so `[::1]:80` and `[0:0::1]:80` agree; else as trimmed strings).
pub fn same_endpoint(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    match (
        a.parse::<std::net::SocketAddr>(),
        b.parse::<std::net::SocketAddr>(),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

fn string_of(v: &Value) -> Option<&str> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// The subset hint in a request's `metadata_context`.
pub fn subset(metadata: Option<&Metadata>) -> Subset {
    let Some(list) = metadata
        .and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE))
        .and_then(|s| s.fields.get(SUBSET))
    else {
        return Subset::Any;
    };
    let entries = match &list.kind {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(string_of)
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        // A single string (some data planes send one endpoint, or a comma-joined list).
        Some(Kind::StringValue(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    };
    Subset::Only(entries)
}

/// The endpoint that served a request: `metadata_context["envoy.lb"][served]`, else the
/// response header of that name. The first entry when it lists several.
pub fn served(metadata: Option<&Metadata>, headers: &HeaderMap) -> Option<String> {
    let from_metadata = metadata
        .and_then(|m| m.filter_metadata.get(LB_NAMESPACE))
        .and_then(|s| s.fields.get(SERVED))
        .and_then(string_of)
        .map(str::to_string);
    let raw = from_metadata.or_else(|| {
        headers
            .get(SERVED)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    })?;
    raw.split(',')
        .map(str::trim)
        .find(|s| !s.is_empty())
        .map(str::to_string)
}

/// A request's (or response's) header block as Envoy sends it: the `:path` and `:status`
/// pseudo-headers, and the rest as an HTTP header map.
#[derive(Clone, Debug, Default)]
pub struct Head {
    /// `:path` (empty when absent).
    pub path: String,
    /// `:status` of a response (0 when absent or not a number).
    pub status: u16,
    /// The regular headers.
    pub headers: HeaderMap,
}

/// Decodes Envoy's header map (a value may come in `value` or, raw, in `raw_value`).
pub fn head(map: Option<&EnvoyHeaderMap>) -> Head {
    let mut out = Head::default();
    for h in map.map(|m| m.headers.as_slice()).unwrap_or_default() {
        let value: &[u8] = if h.raw_value.is_empty() {
            h.value.as_bytes()
        } else {
            &h.raw_value
        };
        let key = h.key.to_ascii_lowercase();
        match key.as_str() {
            ":path" => out.path = String::from_utf8_lossy(value).into_owned(),
            ":status" => {
                out.status = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
            }
            k if k.starts_with(':') => {}
            k => {
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HttpHeaderValue::from_bytes(value),
                ) {
                    out.headers.append(n, v);
                }
            }
        }
    }
    out
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// `envoy.lb` dynamic metadata naming the destination.
fn destination_metadata(value: &str) -> Struct {
    let mut lb = Struct::default();
    lb.fields.insert(
        DESTINATION.to_string(),
        Value {
            kind: Some(Kind::StringValue(value.to_string())),
        },
    );
    let mut root = Struct::default();
    root.fields.insert(
        LB_NAMESPACE.to_string(),
        Value {
            kind: Some(Kind::StructValue(lb)),
        },
    );
    root
}

/// The destination value: the endpoints, comma-separated, primary first.
pub fn destination_value(endpoints: &[String]) -> String {
    endpoints.join(",")
}

/// The header mutation that routes a request: the destination header, overwritten (a client
/// cannot smuggle its own), and `content-length` when the body was rewritten.
fn routing_mutation(destination: &str, body_len: Option<usize>) -> HeaderMutation {
    let mut set = vec![set_header(DESTINATION, destination)];
    if let Some(n) = body_len {
        set.push(set_header("content-length", &n.to_string()));
    }
    HeaderMutation {
        set_headers: set,
        remove_headers: Vec::new(),
    }
}

/// The answers that route a request to `endpoints` (primary first) in `mode`, the body
/// (`body`, rewritten or as received) going on to the worker.
///
/// Full duplex: the request-headers answer (destination header, dynamic metadata), then the
/// body, streamed back whole. Per message: one answer to the body's last chunk carrying the
/// header mutation, the metadata and, when `rewritten`, the new body.
pub fn destination_replies(
    mode: BodyMode,
    endpoints: &[String],
    body: &[u8],
    rewritten: bool,
) -> Vec<ProcessingResponse> {
    let value = destination_value(endpoints);
    let len = rewritten.then_some(body.len());
    match mode {
        BodyMode::FullDuplex => vec![
            ProcessingResponse {
                dynamic_metadata: Some(destination_metadata(&value)),
                response: Some(processing_response::Response::RequestHeaders(
                    HeadersResponse {
                        response: Some(CommonResponse {
                            header_mutation: Some(routing_mutation(&value, len)),
                            clear_route_cache: true,
                            ..Default::default()
                        }),
                    },
                )),
                ..Default::default()
            },
            ProcessingResponse {
                response: Some(processing_response::Response::RequestBody(BodyResponse {
                    response: Some(CommonResponse {
                        body_mutation: Some(BodyMutation {
                            mutation: Some(body_mutation::Mutation::StreamedResponse(
                                StreamedBodyResponse {
                                    body: body.to_vec(),
                                    end_of_stream: true,
                                    ..Default::default()
                                },
                            )),
                        }),
                        ..Default::default()
                    }),
                })),
                ..Default::default()
            },
        ],
        BodyMode::PerMessage | BodyMode::None => vec![ProcessingResponse {
            dynamic_metadata: Some(destination_metadata(&value)),
            response: Some(processing_response::Response::RequestBody(BodyResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(routing_mutation(&value, len)),
                    body_mutation: rewritten.then(|| BodyMutation {
                        mutation: Some(body_mutation::Mutation::Body(body.to_vec())),
                    }),
                    clear_route_cache: true,
                    ..Default::default()
                }),
            })),
            ..Default::default()
        }],
    }
}

/// The destination a routing answer carries: (header value, metadata value), when present.
pub fn destination_of(reply: &ProcessingResponse) -> (Option<String>, Option<String>) {
    let common = match &reply.response {
        Some(processing_response::Response::RequestHeaders(h)) => h.response.as_ref(),
        Some(processing_response::Response::RequestBody(b)) => b.response.as_ref(),
        _ => None,
    };
    let header = common
        .and_then(|c| c.header_mutation.as_ref())
        .and_then(|m| {
            m.set_headers
                .iter()
                .filter_map(|o| o.header.as_ref())
                .find(|h| h.key.eq_ignore_ascii_case(DESTINATION))
        })
        .map(|h| {
            if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            }
        });
    let metadata = reply
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get(LB_NAMESPACE))
        .and_then(|v| match &v.kind {
            Some(Kind::StructValue(s)) => s.fields.get(DESTINATION),
            _ => None,
        })
        .and_then(string_of)
        .map(str::to_string);
    (header, metadata)
}

/// A "go on unchanged" answer of a phase.
pub fn continue_reply(phase: Phase) -> ProcessingResponse {
    let common = Some(CommonResponse::default());
    let response = match phase {
        Phase::RequestHeaders => {
            processing_response::Response::RequestHeaders(HeadersResponse { response: common })
        }
        Phase::RequestBody => {
            processing_response::Response::RequestBody(BodyResponse { response: common })
        }
        Phase::RequestTrailers => {
            processing_response::Response::RequestTrailers(TrailersResponse::default())
        }
        Phase::ResponseHeaders => {
            processing_response::Response::ResponseHeaders(HeadersResponse { response: common })
        }
        Phase::ResponseBody => {
            processing_response::Response::ResponseBody(BodyResponse { response: common })
        }
        Phase::ResponseTrailers => {
            processing_response::Response::ResponseTrailers(TrailersResponse::default())
        }
    };
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// A response body chunk passed back unchanged in full-duplex mode (the picker owns the
/// body there: it must send every chunk on).
pub fn response_body_reply(chunk: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse {
            response: Some(CommonResponse {
                body_mutation: Some(BodyMutation {
                    mutation: Some(body_mutation::Mutation::StreamedResponse(
                        StreamedBodyResponse {
                            body: chunk,
                            end_of_stream,
                            ..Default::default()
                        },
                    )),
                }),
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

/// The phases of an ext_proc stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Request headers.
    RequestHeaders,
    /// A request body chunk.
    RequestBody,
    /// Request trailers.
    RequestTrailers,
    /// Response headers.
    ResponseHeaders,
    /// A response body chunk.
    ResponseBody,
    /// Response trailers.
    ResponseTrailers,
}

/// The immediate response for a refusal: its status, the gateway's OpenAI-shaped error body
/// (Anthropic-shaped for `/v1/messages`), `content-type`, and `Retry-After` /
/// `WWW-Authenticate` when the gateway would send them.
pub fn immediate(e: &GatewayError, anthropic: bool) -> ProcessingResponse {
    let body = if anthropic {
        e.anthropic_body()
    } else {
        e.openai_body()
    };
    let mut set = vec![set_header("content-type", "application/json")];
    if let Some(s) = e.retry_after() {
        set.push(set_header("retry-after", &s.to_string()));
    }
    if let Some(c) = e.www_authenticate() {
        set.push(set_header("www-authenticate", c));
    }
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(e.status()),
                }),
                headers: Some(HeaderMutation {
                    set_headers: set,
                    remove_headers: Vec::new(),
                }),
                body: body.to_string().into_bytes(),
                grpc_status: None,
                details: e.label().to_string(),
            },
        )),
        ..Default::default()
    }
}

/// The status of an immediate response, if `reply` is one.
pub fn immediate_status(reply: &ProcessingResponse) -> Option<u16> {
    match &reply.response {
        Some(processing_response::Response::ImmediateResponse(i)) => {
            i.status.as_ref().and_then(|s| u16::try_from(s.code).ok())
        }
        _ => None,
    }
}

/// Filter metadata carrying a subset hint of `endpoints` (what a data plane sends; for
/// clients and tests).
pub fn subset_metadata(endpoints: &[&str]) -> Metadata {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: endpoints
                .iter()
                .map(|e| Value {
                    kind: Some(Kind::StringValue((*e).to_string())),
                })
                .collect(),
        })),
    };
    let mut hint = Struct::default();
    hint.fields.insert(SUBSET.to_string(), list);
    let mut m = Metadata::default();
    m.filter_metadata.insert(SUBSET_NAMESPACE.to_string(), hint);
    m
}

/// Filter metadata naming the endpoint that served a request (what a data plane sends with
/// the response phases; for clients and tests).
pub fn served_metadata(endpoint: &str) -> Metadata {
    let mut lb = Struct::default();
    lb.fields.insert(
        SERVED.to_string(),
        Value {
            kind: Some(Kind::StringValue(endpoint.to_string())),
        },
    );
    let mut m = Metadata::default();
    m.filter_metadata.insert(LB_NAMESPACE.to_string(), lb);
    m
}

/// Envoy's header map of `(name, value)` pairs (for clients and tests).
pub fn envoy_headers(pairs: &[(&str, &str)]) -> EnvoyHeaderMap {
    EnvoyHeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_hint_is_read_tolerantly() {
        assert_eq!(subset(None), Subset::Any);
        assert_eq!(subset(Some(&Metadata::default())), Subset::Any);
        let m = subset_metadata(&["10.0.0.1:8000", " 10.0.0.2:8000 "]);
        let s = subset(Some(&m));
        assert_eq!(
            s,
            Subset::Only(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
        );
        assert!(s.admits("10.0.0.2:8000"));
        assert!(!s.admits("10.0.0.3:8000"));
        // An empty list admits nothing; entries that are not strings are skipped.
        let mut m = subset_metadata(&[]);
        let hint = m
            .filter_metadata
            .get_mut(SUBSET_NAMESPACE)
            .expect("namespace");
        if let Some(Value {
            kind: Some(Kind::ListValue(l)),
        }) = hint.fields.get_mut(SUBSET)
        {
            l.values.push(Value {
                kind: Some(Kind::NumberValue(1.0)),
            });
        }
        assert_eq!(subset(Some(&m)), Subset::Only(Vec::new()));
        assert!(!Subset::Only(Vec::new()).admits("10.0.0.1:8000"));
        // IPv6 spellings compare as addresses.
        assert!(same_endpoint("[::1]:80", "[0:0::1]:80"));
        assert!(!same_endpoint("[::1]:80", "[::1]:81"));
    }

    #[test]
    fn served_endpoint_from_metadata_or_header() {
        let mut h = HeaderMap::new();
        assert_eq!(served(None, &h), None);
        h.insert(SERVED, HttpHeaderValue::from_static("10.0.0.9:80"));
        assert_eq!(served(None, &h).as_deref(), Some("10.0.0.9:80"));
        let m = served_metadata("10.0.0.1:80,10.0.0.2:80");
        assert_eq!(served(Some(&m), &h).as_deref(), Some("10.0.0.1:80"));
    }

    #[test]
    fn head_reads_pseudo_headers_and_drops_invalid_ones() {
        let mut map = envoy_headers(&[
            (":path", "/v1/chat/completions"),
            (":method", "POST"),
            ("X-Kvroute-Tenant", "acme"),
            ("bad header", "x"),
        ]);
        map.headers.push(HeaderValue {
            key: ":status".into(),
            value: "429".into(),
            raw_value: Vec::new(),
        });
        let h = head(Some(&map));
        assert_eq!(h.path, "/v1/chat/completions");
        assert_eq!(h.status, 429);
        assert_eq!(h.headers.len(), 1);
        assert_eq!(
            h.headers
                .get("x-kvroute-tenant")
                .and_then(|v| v.to_str().ok()),
            Some("acme")
        );
    }

    #[test]
    fn destination_header_and_metadata_agree_in_both_modes() {
        let eps = vec!["10.0.0.1:8000".to_string(), "10.0.0.2:8000".to_string()];
        let full = destination_replies(BodyMode::FullDuplex, &eps, b"{}", false);
        assert_eq!(full.len(), 2);
        let (h, m) = destination_of(&full[0]);
        assert_eq!(h.as_deref(), Some("10.0.0.1:8000,10.0.0.2:8000"));
        assert_eq!(h, m);
        match &full[1].response {
            Some(processing_response::Response::RequestBody(b)) => {
                let Some(BodyMutation {
                    mutation: Some(body_mutation::Mutation::StreamedResponse(s)),
                }) = b.response.as_ref().and_then(|c| c.body_mutation.clone())
                else {
                    panic!("streamed body expected");
                };
                assert_eq!(s.body, b"{}");
                assert!(s.end_of_stream);
            }
            other => panic!("body answer expected, got {other:?}"),
        }
        let per = destination_replies(BodyMode::PerMessage, &eps[..1], b"{\"a\":1}", true);
        assert_eq!(per.len(), 1);
        let (h, m) = destination_of(&per[0]);
        assert_eq!(h.as_deref(), Some("10.0.0.1:8000"));
        assert_eq!(h, m);
    }

    #[test]
    fn immediate_response_carries_the_gateway_error() {
        let r = immediate(&GatewayError::NoReadyWorker("m".into()), false);
        assert_eq!(immediate_status(&r), Some(503));
        let Some(processing_response::Response::ImmediateResponse(i)) = &r.response else {
            panic!("immediate");
        };
        let body: serde_json::Value = serde_json::from_slice(&i.body).expect("json");
        assert_eq!(body["error"]["code"], "no_ready_worker");
        let r = immediate(
            &GatewayError::SloShed {
                target_ms: 100,
                retry_after_s: 3,
            },
            true,
        );
        assert_eq!(immediate_status(&r), Some(429));
        let Some(processing_response::Response::ImmediateResponse(i)) = &r.response else {
            panic!("immediate");
        };
        let body: serde_json::Value = serde_json::from_slice(&i.body).expect("json");
        assert_eq!(body["type"], "error");
        let retry = i
            .headers
            .as_ref()
            .and_then(|h| h.set_headers.iter().find_map(|o| o.header.clone()))
            .filter(|h| h.key == "content-type");
        assert!(retry.is_some());
    }

    #[test]
    fn body_modes() {
        assert_eq!(BodyMode::of(BodySendMode::None as i32), BodyMode::None);
        assert_eq!(
            BodyMode::of(BodySendMode::Buffered as i32),
            BodyMode::PerMessage
        );
        assert_eq!(
            BodyMode::of(BodySendMode::FullDuplexStreamed as i32),
            BodyMode::FullDuplex
        );
        assert_eq!(BodyMode::of(99), BodyMode::FullDuplex);
        assert_eq!(
            BodyMode::of_config(None),
            (BodyMode::FullDuplex, BodyMode::FullDuplex)
        );
    }
}
