//! Span names, interned once into small ids so that a hot-path event carries a `u32`
//! instead of a string. The interner also keeps each name pre-escaped as a JSON string
//! (and its category, the part before the first `.`), so the writer never escapes a span
//! name twice.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use chrome_trace_format::{names, Quoted};

/// An interned span or counter name. Cheap to copy; get one with [`intern`] or the
/// [`trace_name!`](crate::trace_name) macro.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(pub(crate) u32);

impl Name {
    /// The interned text.
    pub fn text(self) -> Arc<str> {
        interner()
            .entries
            .get(self.0 as usize)
            .map(|e| e.text.clone())
            .unwrap_or_else(|| Arc::from("?"))
    }
}

/// What the writer needs of a name, computed once at interning time.
#[derive(Clone, Debug)]
pub(crate) struct NameEntry {
    pub text: Arc<str>,
    /// The name as a JSON string literal, quotes included.
    pub json: Quoted,
    /// The first `.`-separated component as a JSON string literal (the counter category).
    pub first_json: Quoted,
}

#[derive(Default)]
struct Interner {
    ids: HashMap<Arc<str>, u32>,
    entries: Vec<NameEntry>,
}

fn interner() -> MutexGuard<'static, Interner> {
    static INTERNER: OnceLock<Mutex<Interner>> = OnceLock::new();
    // A panic while holding this lock cannot leave the map half-updated in a way that
    // matters (entries are pushed after the id is chosen), so poisoning is ignored.
    INTERNER
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Interns `text` and returns its id; the same text always gives the same [`Name`].
/// Takes a lock and may allocate: call it once per name (at construction, or through
/// [`trace_name!`](crate::trace_name)), never per span.
pub fn intern(text: &str) -> Name {
    let mut g = interner();
    if let Some(&id) = g.ids.get(text) {
        return Name(id);
    }
    let id = g.entries.len() as u32;
    let text: Arc<str> = Arc::from(text);
    let first = text.split('.').next().unwrap_or(&text);
    let entry = NameEntry {
        json: Quoted::new(&text),
        first_json: Quoted::new(first),
        text: text.clone(),
    };
    g.entries.push(entry);
    g.ids.insert(text, id);
    Name(id)
}

/// The interned name of step spans (`ProfilerStep`; the writer appends `#N`).
pub(crate) fn step_name() -> Name {
    static N: OnceLock<Name> = OnceLock::new();
    *N.get_or_init(|| intern(names::STEP))
}

/// Copies the entries from `out.len()` on into `out`, so a reader (the writer thread)
/// keeps its own lock-free table and only comes back when it meets a newer id.
pub(crate) fn sync_entries(out: &mut Vec<NameEntry>) {
    let g = interner();
    if out.len() < g.entries.len() {
        out.extend_from_slice(&g.entries[out.len()..]);
    }
}

/// Returns a static [`Name`](crate::Name) for a literal (or a `&'static str` constant),
/// interned the first time this call site runs (a `static OnceLock` per call site) and
/// read with one atomic load afterwards.
///
/// ```
/// let fc = trace_recorder::trace_name!("drafter.fc");
/// let _s = trace_recorder::span(fc);
/// ```
#[macro_export]
macro_rules! trace_name {
    ($name:expr) => {{
        static NAME: ::std::sync::OnceLock<$crate::Name> = ::std::sync::OnceLock::new();
        *NAME.get_or_init(|| $crate::intern($name))
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_same_id_and_escaped_once() {
        let a = intern("names.test.a\"b");
        let b = intern("names.test.a\"b");
        assert_eq!(a, b);
        assert_ne!(a, intern("names.test.other"));
        let mut table = Vec::new();
        sync_entries(&mut table);
        let e = &table[a.0 as usize];
        assert_eq!(e.json.as_json(), "\"names.test.a\\\"b\"");
        assert_eq!(e.first_json.as_json(), "\"names\"");
        assert_eq!(&*a.text(), "names.test.a\"b");
    }

    #[test]
    fn macro_interns_per_call_site() {
        let f = || crate::trace_name!("names.macro");
        assert_eq!(f(), f());
        assert_eq!(f(), intern("names.macro"));
    }
}
