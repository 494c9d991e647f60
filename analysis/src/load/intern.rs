//! Strings of a trace interned to dense `u32` ids (names repeat millions of times), keyed
//! by their raw (still escaped) bytes, so a name seen again costs one hash lookup.

use rustc_hash::FxHashMap;

use super::json::unescape;

/// Raw (still escaped) string bytes to a dense id, and ids back to decoded strings.
#[derive(Default)]
pub(crate) struct Interner {
    ids: FxHashMap<Box<[u8]>, u32>,
    pub strings: Vec<String>,
}

impl Interner {
    #[inline]
    pub fn intern(&mut self, raw: &[u8], escaped: bool) -> u32 {
        if let Some(&id) = self.ids.get(raw) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(if escaped {
            unescape(raw)
        } else {
            String::from_utf8_lossy(raw).into_owned()
        });
        self.ids.insert(raw.into(), id);
        id
    }

    pub fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s.as_bytes()).copied()
    }

    /// The id of `raw`, storing `decoded` as its text when it is new; for merging.
    fn intern_decoded(&mut self, raw: &[u8], decoded: &str) -> u32 {
        if let Some(&id) = self.ids.get(raw) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(decoded.to_string());
        self.ids.insert(raw.into(), id);
        id
    }

    /// For each id of `other`, its id here (interning what is new).
    pub fn absorb(&mut self, other: &Interner) -> Vec<u32> {
        let mut by_id: Vec<&[u8]> = vec![&[]; other.strings.len()];
        for (raw, &id) in &other.ids {
            by_id[id as usize] = raw;
        }
        // In id order, so new strings get ids in the order the file showed them.
        by_id
            .iter()
            .zip(&other.strings)
            .map(|(raw, text)| self.intern_decoded(raw, text))
            .collect()
    }
}
