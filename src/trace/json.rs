//! The few JSON primitives the writer needs, written by hand so that formatting one event
//! is a handful of `push_str`s into a reused `String`: string escaping (any `&str`, so any
//! name, key or thread name, becomes a valid JSON string), ns timestamps as microseconds
//! with exactly three decimals, and argument values.
use std::fmt::Write as _;

use super::event::ArgValue;

/// Appends `s` as a JSON string literal (with quotes). Escapes `"`, `\` and every control
/// character; other Unicode is valid in JSON as UTF-8 and is copied as is.
pub(crate) fn escape_into(out: &mut String, s: &str) {
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
pub(crate) fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    escape_into(&mut out, s);
    out
}

/// Appends nanoseconds as microseconds with three decimals (`1523125` -> `1523.125`),
/// exact, without going through a float.
pub(crate) fn push_us(out: &mut String, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1000, ns % 1000);
}

/// Appends an argument value. Non-finite floats have no JSON form and become `null`.
pub(crate) fn push_value(out: &mut String, v: ArgValue) {
    let _ = match v {
        ArgValue::I64(x) => write!(out, "{x}"),
        ArgValue::U64(x) => write!(out, "{x}"),
        ArgValue::F64(x) if x.is_finite() => {
            // Display of f64 never uses an exponent and always round-trips; whole numbers
            // print without a dot, which JSON reads as the same number.
            write!(out, "{x}")
        }
        ArgValue::F64(_) => {
            out.push_str("null");
            Ok(())
        }
    };
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

    #[test]
    fn values() {
        let mut s = String::new();
        for v in [
            ArgValue::I64(-3),
            ArgValue::U64(u64::MAX),
            ArgValue::F64(0.25),
            ArgValue::F64(1e-7),
            ArgValue::F64(f64::NAN),
        ] {
            push_value(&mut s, v);
            s.push(',');
        }
        assert_eq!(s, "-3,18446744073709551615,0.25,0.0000001,null,");
    }
}
