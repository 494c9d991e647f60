//! A small JSON scanner over one in-memory slice, made for trace events.
//!
//! The loader hands it a slice of its read buffer that starts at an event. The scanner
//! never allocates on the fast path: strings come back as byte ranges of the slice, and
//! values of keys nobody asked for are skipped without being decoded. When the slice ends
//! in the middle of a value it answers [`ScanError::Incomplete`], and the loader refills
//! its buffer and scans the event again from its start (so scanning must be free of side
//! effects until an event is complete).
//!
//! Why a hand-written scanner rather than a maintained parser (`serde_json`, `simd-json`,
//! `sonic-rs`): the loader streams files larger than memory through a fixed buffer,
//! starts parts in the middle of the file at guessed event boundaries and checks the
//! guess by where the previous part stops, resumes an event cut by the buffer's end, and
//! keeps every complete event of a truncated file with the byte offset of the cut. It
//! decodes only the dozen keys it uses and keeps strings as byte ranges for interning.
//! `simd-json` and `sonic-rs` parse a complete document held in memory (`simd-json`
//! rewrites its input), so using them would mean finding each event's end first (most
//! of what this scanner does) and then parsing the event again into their own values.
//! The comparison in the load bench was not made: neither crate is in the lock file, and
//! a fair one needs that framing written first. Until a parser is shown to match this
//! one's speed on `scripts/bench-analyze.sh`, the scanner stays.

use memchr::memchr2;

/// Why a scan stopped. One word, so that a `Scan` of a number or a [`Str`] comes back in
/// registers: the scanner's results are on the hottest path of loading.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ScanError {
    /// The slice ended inside a value; more input may complete it.
    Incomplete,
    /// The input is not JSON (or not the JSON we accept).
    Syntax(Box<SyntaxError>),
}

/// Where and why the input is not JSON: at byte `at` of the slice.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub at: usize,
    pub what: String,
}

impl ScanError {
    pub fn syntax(at: usize, what: impl Into<String>) -> ScanError {
        ScanError::Syntax(Box::new(SyntaxError {
            at,
            what: what.into(),
        }))
    }
}

pub(crate) type Scan<T> = Result<T, ScanError>;

/// A string as a byte range of the scanned slice, without its quotes, and whether its raw
/// bytes hold a backslash escape. Packed in 8 bytes (the flag is the top bit of the end)
/// so that a `Scan<Str>` comes back in registers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Str {
    start: u32,
    end: u32,
}

const ESCAPED: u32 = 1 << 31;

impl Str {
    #[inline]
    pub fn new(start: usize, end: usize, escaped: bool) -> Str {
        Str {
            start: start as u32,
            end: end as u32 | if escaped { ESCAPED } else { 0 },
        }
    }

    #[inline]
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.end & !ESCAPED) as usize
    }

    /// The raw bytes hold at least one backslash escape.
    #[inline]
    pub fn escaped(self) -> bool {
        self.end & ESCAPED != 0
    }
}

/// What kind of JSON value starts at a position; used for "wrong type" messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum JsonType {
    String,
    Number,
    Object,
    Array,
    Bool,
    Null,
}

impl JsonType {
    pub fn of(b: u8) -> Option<JsonType> {
        Some(match b {
            b'"' => JsonType::String,
            b'-' | b'0'..=b'9' => JsonType::Number,
            b'{' => JsonType::Object,
            b'[' => JsonType::Array,
            b't' | b'f' => JsonType::Bool,
            b'n' => JsonType::Null,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            JsonType::String => "a string",
            JsonType::Number => "a number",
            JsonType::Object => "an object",
            JsonType::Array => "an array",
            JsonType::Bool => "a boolean",
            JsonType::Null => "null",
        }
    }
}

pub(crate) struct Cursor<'a> {
    pub s: &'a [u8],
    pub i: usize,
}

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

impl<'a> Cursor<'a> {
    pub fn new(s: &'a [u8]) -> Self {
        Cursor { s, i: 0 }
    }

    pub fn syntax<T>(&self, what: impl Into<String>) -> Scan<T> {
        Err(ScanError::syntax(self.i, what))
    }

    #[inline]
    pub fn ws(&mut self) {
        while let Some(&b) = self.s.get(self.i) {
            if b == b' ' || b == b'\n' || b == b'\r' || b == b'\t' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    /// The next non-blank byte, not consumed.
    #[inline]
    pub fn peek(&mut self) -> Scan<u8> {
        self.ws();
        self.s.get(self.i).copied().ok_or(ScanError::Incomplete)
    }

    #[inline]
    pub fn eat(&mut self, b: u8) -> Scan<()> {
        let got = self.peek()?;
        if got == b {
            self.i += 1;
            Ok(())
        } else {
            self.syntax(format!(
                "expected `{}`, found {}",
                b as char,
                describe_byte(got)
            ))
        }
    }

    pub fn bytes(&self, s: Str) -> &'a [u8] {
        &self.s[s.range()]
    }

    /// A string; the cursor must be at its opening quote (after blanks).
    #[inline(always)]
    pub fn string(&mut self) -> Scan<Str> {
        // Callers have usually looked at the next byte already: no second blank skip.
        if self.s.get(self.i) == Some(&b'"') {
            self.i += 1;
        } else {
            self.eat(b'"')?;
        }
        let start = self.i;
        // Most strings of a trace are short: look at them byte by byte before paying for
        // a vectorised search.
        let s = self.s;
        let short = s.len().min(start + 24);
        let mut j = start;
        while j < short {
            match s[j] {
                b'"' => {
                    self.i = j + 1;
                    return Ok(Str::new(start, j, false));
                }
                b'\\' => break,
                _ => j += 1,
            }
        }
        self.string_rest(start, j)
    }

    /// The rest of a string that starts at `start`, from `j` on: long or escaped ones.
    #[inline(never)]
    fn string_rest(&mut self, start: usize, mut j: usize) -> Scan<Str> {
        let mut escaped = false;
        loop {
            match memchr2(b'"', b'\\', &self.s[j..]) {
                None => return Err(ScanError::Incomplete),
                Some(k) => {
                    let at = j + k;
                    if self.s[at] == b'"' {
                        self.i = at + 1;
                        return Ok(Str::new(start, at, escaped));
                    }
                    escaped = true;
                    // Skip the escaped byte; `\u` digits contain no quote or backslash.
                    if at + 1 >= self.s.len() {
                        return Err(ScanError::Incomplete);
                    }
                    j = at + 2;
                }
            }
        }
    }

    /// A number. NaN and Infinity are named in the error because Python's json module
    /// writes them.
    #[inline(always)]
    pub fn number(&mut self) -> Scan<f64> {
        self.ws();
        let start = self.i;
        let s = self.s;
        let mut i = self.i;
        let neg = s.get(i) == Some(&b'-');
        if neg {
            i += 1;
        }
        let mut mant: u64 = 0;
        let mut digits = 0u32;
        let int_start = i;
        while let Some(&b) = s.get(i) {
            let d = b.wrapping_sub(b'0');
            if d >= 10 {
                break;
            }
            if digits < 19 {
                mant = mant * 10 + d as u64;
            }
            digits += 1;
            i += 1;
        }
        if i == int_start {
            return match s.get(i) {
                None => Err(ScanError::Incomplete),
                Some(b'N') | Some(b'I') => {
                    self.i = start;
                    self.syntax("NaN and Infinity are not JSON numbers")
                }
                Some(&b) => {
                    self.i = i;
                    self.syntax(format!("expected a number, found {}", describe_byte(b)))
                }
            };
        }
        let mut frac = 0u32;
        let mut simple = digits <= 19;
        if s.get(i) == Some(&b'.') {
            i += 1;
            let f0 = i;
            while let Some(&b) = s.get(i) {
                let d = b.wrapping_sub(b'0');
                if d >= 10 {
                    break;
                }
                if digits < 19 {
                    mant = mant * 10 + d as u64;
                    frac += 1;
                } else {
                    simple = false;
                }
                digits += 1;
                i += 1;
            }
            if i == f0 {
                if i >= s.len() {
                    return Err(ScanError::Incomplete);
                }
                self.i = i;
                return self.syntax("expected a digit after the decimal point");
            }
        }
        if matches!(s.get(i), Some(b'e') | Some(b'E')) {
            simple = false;
            i += 1;
            if matches!(s.get(i), Some(b'+') | Some(b'-')) {
                i += 1;
            }
            let e0 = i;
            while s.get(i).is_some_and(|b| b.is_ascii_digit()) {
                i += 1;
            }
            if i == e0 {
                if i >= s.len() {
                    return Err(ScanError::Incomplete);
                }
                self.i = i;
                return self.syntax("expected a digit in the exponent");
            }
        }
        if i >= s.len() {
            // The number may go on in the next read.
            return Err(ScanError::Incomplete);
        }
        self.i = i;
        // Clinger's fast path: an exact integer mantissa below 2^53 divided by an exact
        // power of ten is correctly rounded by IEEE division.
        if simple && mant < (1u64 << 53) && (frac as usize) < POW10.len() {
            // Integers (ids, steps) need no division.
            let v = if frac == 0 {
                mant as f64
            } else {
                mant as f64 / POW10[frac as usize]
            };
            return Ok(if neg { -v } else { v });
        }
        let text = std::str::from_utf8(&s[start..i])
            .map_err(|_| ScanError::syntax(start, "invalid number"))?;
        text.parse::<f64>()
            .map_err(|_| ScanError::syntax(start, format!("invalid number `{text}`")))
    }

    /// `true` or `false`.
    pub fn boolean(&mut self) -> Scan<bool> {
        let b = self.peek()?;
        let (word, v): (&[u8], bool) = if b == b't' {
            (b"true", true)
        } else {
            (b"false", false)
        };
        self.literal(word)?;
        Ok(v)
    }

    fn literal(&mut self, word: &[u8]) -> Scan<()> {
        let end = self.i + word.len();
        if end > self.s.len() {
            if word.starts_with(&self.s[self.i..]) {
                return Err(ScanError::Incomplete);
            }
        } else if &self.s[self.i..end] == word {
            self.i = end;
            return Ok(());
        }
        self.syntax(format!(
            "expected `{}`",
            std::str::from_utf8(word).unwrap_or("?")
        ))
    }

    /// Skips one value of any type without decoding it.
    pub fn skip_value(&mut self) -> Scan<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => self.skip_nested(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => {
                if self.non_finite()?.is_some() {
                    return Ok(());
                }
                self.number().map(|_| ())
            }
        }
    }

    /// Skips a balanced object or array. Checks bracket pairs, not full grammar: the
    /// values inside are ones we do not read.
    fn skip_nested(&mut self) -> Scan<()> {
        let mut stack: Vec<u8> = Vec::new();
        let s = self.s;
        let mut i = self.i;
        while i < s.len() {
            let b = s[i];
            match b {
                b'"' => {
                    self.i = i;
                    self.string()?;
                    i = self.i;
                    continue;
                }
                b'{' => stack.push(b'}'),
                b'[' => stack.push(b']'),
                b'}' | b']' => {
                    if stack.pop() != Some(b) {
                        self.i = i;
                        return self.syntax(format!("unbalanced `{}`", b as char));
                    }
                    if stack.is_empty() {
                        self.i = i + 1;
                        return Ok(());
                    }
                }
                // NaN and Infinity inside a skipped value are skipped with it.
                _ => {}
            }
            i += 1;
        }
        Err(ScanError::Incomplete)
    }

    /// The type of the next value, for messages; `None` when the next byte starts none.
    pub fn next_type(&mut self) -> Scan<Option<JsonType>> {
        Ok(JsonType::of(self.peek()?))
    }

    /// `NaN`, `Infinity` or `-Infinity` at the cursor (Python's json module writes them,
    /// though JSON has no such numbers): consumed and returned; `None` (nothing consumed)
    /// for anything else.
    pub fn non_finite(&mut self) -> Scan<Option<f64>> {
        self.ws();
        let rest = &self.s[self.i..];
        for (word, v) in [
            (&b"NaN"[..], f64::NAN),
            (b"Infinity", f64::INFINITY),
            (b"-Infinity", f64::NEG_INFINITY),
        ] {
            if rest.starts_with(word) {
                self.i += word.len();
                return Ok(Some(v));
            }
            if rest.len() < word.len() && word.starts_with(rest) && !rest.is_empty() {
                return Err(ScanError::Incomplete);
            }
        }
        Ok(None)
    }
}

/// A byte as a message shows it.
pub(crate) fn describe_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

/// Decodes the escapes of a JSON string's raw bytes. Invalid escapes are kept as written:
/// names are for display, and a bad escape in a name is not worth failing a load for.
pub(crate) fn unescape(raw: &[u8]) -> String {
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' || i + 1 >= raw.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let e = raw[i + 1];
        i += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'u' => {
                let hex = |s: &[u8]| -> Option<u32> {
                    std::str::from_utf8(s)
                        .ok()
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                };
                let Some(hi) = raw.get(i..i + 4).and_then(hex) else {
                    out.extend_from_slice(b"\\u");
                    continue;
                };
                i += 4;
                let mut cp = hi;
                if (0xD800..0xDC00).contains(&hi) && raw.get(i..i + 2) == Some(b"\\u") {
                    if let Some(lo) = raw.get(i + 2..i + 6).and_then(hex) {
                        if (0xDC00..0xE000).contains(&lo) {
                            cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                            i += 6;
                        }
                    }
                }
                let c = char::from_u32(cp).unwrap_or('\u{fffd}');
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
            other => out.push(other),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Scan<f64> {
        // A trailing delimiter, as inside an event.
        let text = format!("{s},");
        let mut c = Cursor::new(text.as_bytes());
        c.number()
    }

    #[test]
    fn numbers_match_std() {
        for s in [
            "0",
            "-0",
            "1523.125",
            "35.250",
            "1764750000123456789",
            "1.5e3",
            "-2.5E-3",
            "123456789012345678901234",
            "0.1",
            "1698187258413178.250",
        ] {
            assert_eq!(num(s).unwrap(), s.parse::<f64>().unwrap(), "{s}");
        }
    }

    #[test]
    fn number_at_end_is_incomplete() {
        let mut c = Cursor::new(b"12.5");
        assert_eq!(c.number(), Err(ScanError::Incomplete));
    }

    #[test]
    fn nan_is_named() {
        match num("NaN") {
            Err(ScanError::Syntax(e)) => assert!(e.what.contains("NaN")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn strings_and_escapes() {
        let text = br#""a\"b\u00e9\n" "#;
        let mut c = Cursor::new(text);
        let s = c.string().unwrap();
        assert!(s.escaped());
        assert_eq!(unescape(c.bytes(s)), "a\"b\u{e9}\n");
    }

    #[test]
    fn skip_nested_values() {
        let text = br#"{"a":[1,{"b":"]}"}],"c":null} x"#;
        let mut c = Cursor::new(text);
        c.skip_value().unwrap();
        assert_eq!(c.peek().unwrap(), b'x');
        let mut c = Cursor::new(br#"{"a":[1,2"#);
        assert_eq!(c.skip_value(), Err(ScanError::Incomplete));
    }
}
