//! Python's `json.dumps`, as the HuggingFace chat-template `tojson` filter calls it.
//!
//! transformers overrides Jinja's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
//! no HTML escaping, keys in insertion order, `", "` / `": "` separators (`","` between items
//! when `indent` is given), Python's float repr (`1e+16`, `1e-05`). Tool schemas are rendered
//! through it, so every byte here changes the prompt's token ids.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write as _;

/// Options of `json.dumps` that chat templates use.
#[derive(Debug, Clone)]
pub(crate) struct DumpOptions {
    /// `None`: one line; `Some(s)`: newline + `s` per nesting level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// The `tojson` filter: `value | tojson`, `value | tojson(indent=2)`, keyword arguments
/// `ensure_ascii`, `indent`, `separators`, `sort_keys`; positionally HF's order
/// `tojson(ensure_ascii, indent)` (later positionals are never used by real templates).
pub(crate) fn tojson_filter(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = pick(ensure_ascii, &kwargs, "ensure_ascii")?;
    let indent = pick(indent, &kwargs, "indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let mut opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..DumpOptions::default()
    };
    match indent {
        None => {}
        Some(v) if v.is_none() || v.is_undefined() => {}
        Some(v) if v.kind() == ValueKind::String => {
            opts.indent = Some(v.as_str().unwrap_or_default().to_string());
            opts.item_separator = ",".into();
        }
        Some(v) => {
            let n = i64::try_from(v).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or a string",
                )
            })?;
            // Python: ' ' * n, empty for n <= 0 (still one item per line).
            opts.indent = Some(" ".repeat(usize::try_from(n.clamp(0, 64)).unwrap_or(0)));
            opts.item_separator = ",".into();
        }
    }
    if let Some(seps) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let item = seps
            .get_item_by_index(0)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string));
        let key = seps
            .get_item_by_index(1)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string));
        match (item, key) {
            (Some(i), Some(k)) => {
                opts.item_separator = i;
                opts.key_separator = k;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ));
            }
        }
    }
    let mut out = String::new();
    dump(value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn pick(positional: Option<Value>, kwargs: &Kwargs, name: &str) -> Result<Option<Value>, Error> {
    let named: Option<Value> = kwargs.get(name)?;
    Ok(named.or(positional))
}

/// Serialises `value` like Python's `json.dumps` with `opts`.
pub(crate) fn dump(
    value: &Value,
    opts: &DumpOptions,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    if level > 256 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match value.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "Object of type Undefined is not JSON serializable",
            ));
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float_repr(f));
            }
        }
        ValueKind::String => {
            write_string(value.as_str().unwrap_or_default(), opts.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, opts, level, '[', ']', items.len(), |i, out| {
                dump(&items[i], opts, level + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((map_key(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, opts, level, '{', '}', entries.len(), |i, out| {
                let (k, v) = &entries[i];
                write_string(k, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                dump(v, opts, level + 1, out)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {} is not JSON serializable", value.kind()),
            ));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    opts: &DumpOptions,
    level: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..=level {
                out.push_str(ind);
            }
        }
        item(i, out)?;
    }
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
    out.push(close);
    Ok(())
}

/// Python converts str/int/float/bool/None keys to strings; anything else is a TypeError.
fn map_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number if key.is_integer() => Ok(key.to_string()),
        ValueKind::Number => Ok(python_float_repr(
            f64::try_from(key.clone()).unwrap_or(f64::NAN),
        )),
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

/// JSON string escaping as Python's encoder does it.
pub(crate) fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7f => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `float.__repr__`: shortest round-trip digits, exponent form below 1e-4 and from
/// 1e16 on, with a sign and at least two exponent digits.
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's Debug uses the same shortest digits and the same thresholds as Python's repr.
    let s = format!("{f:?}");
    match s.split_once('e') {
        None => s,
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let mantissa = mantissa.strip_suffix(".0").unwrap_or(mantissa);
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: serde_json::Value, opts: &DumpOptions) -> String {
        let mut out = String::new();
        dump(&Value::from(minijinja::value::Serde(&v)), opts, 0, &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        out
    }

    #[test]
    fn matches_python_defaults() {
        let v =
            serde_json::json!({"name": "get_weather", "b": [1, 2.5, true, null], "a": {}, "c": []});
        assert_eq!(
            dumps(v, &DumpOptions::default()),
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "a": {}, "c": []}"#
        );
    }

    #[test]
    fn no_html_escaping_and_unicode_kept() {
        let v = serde_json::json!("<b>&'é\u{1}\n\"</b>");
        assert_eq!(
            dumps(v, &DumpOptions::default()),
            "\"<b>&'é\\u0001\\n\\\"</b>\""
        );
    }

    #[test]
    fn ensure_ascii_uses_surrogates() {
        let opts = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(serde_json::json!("é😀"), &opts),
            r#""\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn indent_like_python() {
        let opts = DumpOptions {
            indent: Some("  ".into()),
            item_separator: ",".into(),
            ..DumpOptions::default()
        };
        let v = serde_json::json!({"a": [1, {"b": 2}], "e": []});
        assert_eq!(
            dumps(v, &opts),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ],\n  \"e\": []\n}"
        );
    }

    #[test]
    fn float_repr() {
        assert_eq!(python_float_repr(1.0), "1.0");
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(1.5e300), "1.5e+300");
        assert_eq!(python_float_repr(1e-5), "1e-05");
        assert_eq!(python_float_repr(0.0001), "0.0001");
        assert_eq!(python_float_repr(123456789012345.6), "123456789012345.6");
        assert_eq!(python_float_repr(-0.0), "-0.0");
    }
}
