//! The Jinja side of chat rendering: a minijinja environment configured like transformers'
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols)` with HF's
//! globals and filters, plus the static checks vLLM runs on a template's source.

use crate::pyjson;
use chrono::{DateTime, FixedOffset};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};
use std::fmt::Write as _;

/// Name of the hidden context variable that carries the render's "now" to `strftime_now`.
pub(crate) const NOW_VAR: &str = "__kvroute_now";

/// How vLLM hands message content to a template (`--chat-template-content-format`, detected
/// from the template's source when "auto", which is the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Content is a string; multi-part text is joined with `"\n"`.
    String,
    /// Content is a list of `{"type": "text", "text": ...}` / `{"type": "image"}` parts, for
    /// templates that loop over `message.content`.
    OpenAi,
}

/// What vLLM derives from a template's source before rendering it.
#[derive(Debug, Clone)]
pub(crate) struct TemplateTraits {
    pub content_format: ContentFormat,
    /// vLLM: `'"developer"' in template or "'developer'" in template`.
    pub supports_developer: bool,
    /// transformers: `continue_final_message` needs the word `content` in the template.
    pub mentions_content: bool,
}

impl TemplateTraits {
    pub(crate) fn of(source: &str) -> Self {
        TemplateTraits {
            content_format: detect_content_format(source),
            supports_developer: source.contains("\"developer\"") || source.contains("'developer'"),
            mentions_content: source.contains("content"),
        }
    }
}

/// A fresh environment with HF's chat-template settings. Templates are added by the caller.
pub(crate) fn new_environment<'a>() -> Environment<'a> {
    let mut env = Environment::new();
    // The builder only fails on bad custom delimiters; we keep the defaults.
    if let Ok(syntax) = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjson::tojson_filter);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// Marker error source so a render failure caused by `raise_exception` can be told apart.
#[derive(Debug)]
pub(crate) struct Raised(pub String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let text = match message.as_str() {
        Some(s) => s.to_string(),
        None => message.to_string(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

/// `strftime_now(fmt)`: the render's injected "now" (never the clock), formatted like Python's
/// `datetime.now().strftime(fmt)`.
fn strftime_now(state: &State<'_, '_>, format: String) -> Result<Value, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| v.as_str().map(str::to_string))
        .and_then(|s| DateTime::<FixedOffset>::parse_from_rfc3339(&s).ok())
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "strftime_now: no time given"))?;
    let mut out = String::new();
    write!(out, "{}", now.format(&format))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now: bad format"))?;
    Ok(Value::from(out))
}

/// Jinja2's `length`: `len(x)`; an undefined value has length 0 (Jinja2's `Undefined`), and so
/// does `none` here (Python raises; we prefer a prompt to an error).
fn length(value: &Value) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => Ok(Value::from(0)),
        _ => value.len().map(Value::from).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("object of type {} has no len()", value.kind()),
            )
        }),
    }
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (transformers' AssistantTracker tags,
/// which render their body unchanged) into `{% if true %}` / `{% endif %}`, keeping the
/// whitespace-control markers so trimming stays identical.
pub(crate) fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner = &tag[2..tag.len() - 2];
        let (lead, body) = split_ws_marker_front(inner);
        let (body, trail) = split_ws_marker_back(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        out.push_str(&rest[..start]);
        match replacement {
            Some(r) => {
                let _ = write!(out, "{{%{lead} {r} {trail}%}}");
            }
            None => out.push_str(tag),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

fn split_ws_marker_front(s: &str) -> (&str, &str) {
    match s.as_bytes().first() {
        Some(b'-') | Some(b'+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

fn split_ws_marker_back(s: &str) -> (&str, &str) {
    match s.as_bytes().last() {
        Some(b'-') | Some(b'+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
        _ => (s, ""),
    }
}

/// vLLM parses the template and calls the content format "openai" when some `for` loop
/// iterates over a message's content. This is the same test on the source text: a
/// `{% for x in <name>.content %}` / `<name>['content']` / `content` loop.
fn detect_content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let inner = rest[start + 2..start + len]
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        rest = &rest[start + len + 2..];
        let Some(head) = inner.strip_prefix("for ") else {
            continue;
        };
        let Some((_, iter)) = head.split_once(" in ") else {
            continue;
        };
        let iter = iter.trim_start();
        let end = iter
            .find(|c: char| c.is_whitespace() || c == '|' || c == ')')
            .unwrap_or(iter.len());
        let expr = &iter[..end];
        if expr == "content"
            || expr.ends_with(".content")
            || expr.ends_with("['content']")
            || expr.ends_with("[\"content\"]")
        {
            return ContentFormat::OpenAi;
        }
    }
    ContentFormat::String
}

/// Turns a minijinja render error into ours, recognising `raise_exception`.
pub(crate) fn render_error(err: &Error) -> crate::TokenizeError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return crate::TokenizeError::TemplateRaised(raised.0.clone());
        }
        source = e.source();
    }
    crate::TokenizeError::Render(format!("{err:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_noop_blocks() {
        let src = "a{%- generation -%}b{% endgeneration %}c{% if x %}d{% endif %}";
        assert_eq!(
            strip_generation_tags(src),
            "a{%- if true -%}b{% endif %}c{% if x %}d{% endif %}"
        );
    }

    #[test]
    fn detects_openai_content_loops() {
        assert_eq!(
            detect_content_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(
            detect_content_format("{%- for part in message['content'] if part.type == 'text' -%}"),
            ContentFormat::OpenAi
        );
        assert_eq!(
            detect_content_format("{% for c in m.content %}"),
            ContentFormat::OpenAi
        );
    }

    #[test]
    fn strftime_uses_injected_now() {
        let mut env = new_environment();
        env.add_template("t", "{{ strftime_now('%d %b %Y') }}")
            .unwrap_or_else(|e| panic!("{e}"));
        let out = env
            .get_template("t")
            .and_then(|t| {
                t.render(minijinja::context! { __kvroute_now => "2026-11-30T15:00:00+00:00" })
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, "30 Nov 2026");
    }

    #[test]
    fn raise_exception_is_recognised() {
        let mut env = new_environment();
        env.add_template("t", "{{ raise_exception('no system role') }}")
            .unwrap_or_else(|e| panic!("{e}"));
        let err = env.get_template("t").and_then(|t| t.render(())).err();
        let err = err.map(|e| render_error(&e));
        assert!(
            matches!(err, Some(crate::TokenizeError::TemplateRaised(m)) if m == "no system role")
        );
    }
}
