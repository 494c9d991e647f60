//! The few JSON primitives the writer needs, written by hand so that formatting one event
//! is a handful of `push_str`s into a reused `String`: string escaping (any `&str`, so any
//! name, key or thread name, becomes a valid JSON string), and nanoseconds written as
//! microseconds with exactly three decimals.
use std::fmt::Write as _;
use std::sync::Arc;

/// Appends `s` as a JSON string literal (with quotes). Escapes `"`, `\` and every control
/// character; other Unicode is valid in JSON as UTF-8 and is copied as is.
pub fn escape_into(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0x08 => Some("\\b"),
            0x0c => Some("\\f"),
            0x00..=0x1f | 0x7f => None,
            _ => continue,
        };
        // `b` is ASCII here, so `i` is a char boundary.
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// `s` as a JSON string literal.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    escape_into(&mut out, s);
    out
}

/// Appends nanoseconds as microseconds with three decimals (`1523125` -> `1523.125`),
/// exact, without going through a float.
pub fn push_us(out: &mut String, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1000, ns % 1000);
}

/// A string escaped once as a JSON string literal (quotes included), to be written many
/// times as is: an interned span name. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Quoted(Arc<str>);

impl Quoted {
    pub fn new(s: &str) -> Quoted {
        Quoted(Arc::from(quoted(s)))
    }

    /// The JSON literal, quotes included.
    pub fn as_json(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_round_trip_through_serde_json() {
        let nasty = [
            "plain",
            "quote\" backslash\\ slash/",
            "nl\n cr\r tab\t bs\u{8} ff\u{c} nul\u{0} esc\u{1b} del\u{7f}",
            "unicode é 中文 😀 \u{2028}",
            "",
        ];
        for s in nasty {
            let q = quoted(s);
            let back: String = serde_json::from_str(&q).expect("valid JSON string");
            assert_eq!(back, s, "{q}");
            assert_eq!(Quoted::new(s).as_json(), q);
        }
    }

    #[test]
    fn microseconds_have_three_decimals() {
        let mut s = String::new();
        push_us(&mut s, 1_523_125);
        s.push(' ');
        push_us(&mut s, 7);
        s.push(' ');
        push_us(&mut s, 0);
        assert_eq!(s, "1523.125 0.007 0.000");
    }
}
