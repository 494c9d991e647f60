//! Events the loader does not use, counted by reason. A real trace holds rows no reader
//! expects (Kineto's CUPTI overhead records, instant events with scopes, hand-edited
//! values); the loader never rejects a file over one of them. It skips the event, counts
//! it here with the first example (event index, byte offset, what was wrong), and goes
//! on, as Perfetto's importer does. Only a file that is not a trace at all fails a load.

use std::collections::BTreeMap;
use std::fmt;

/// Why an event was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// An element of `traceEvents` that is not a JSON object.
    NotAnObject,
    /// No `ph`.
    NoPhase,
    /// A `ph` the Chrome trace format does not define.
    UnknownPhase,
    /// No `ts`, or one out of range.
    BadTimestamp,
    /// A complete event without `dur`, or with a negative or huge one.
    BadDuration,
    /// A complete event or counter without `name`.
    NoName,
    /// A `pid` or `tid` that is neither an integer nor a string.
    BadId,
    /// A flow event without a usable `id`/`bind_id`.
    BadFlowId,
    /// A phase the format defines but the analysis does not use (instant `i`, async
    /// `b`/`e`, object snapshots...). Not a problem with the file.
    UnusedPhase,
}

impl SkipReason {
    /// Whether the event is at fault (shown by default), rather than merely unused.
    pub fn is_problem(self) -> bool {
        self != SkipReason::UnusedPhase
    }

    /// A short plural phrase for the summary line.
    pub fn phrase(self) -> &'static str {
        match self {
            SkipReason::NotAnObject => "not objects",
            SkipReason::NoPhase => "without `ph`",
            SkipReason::UnknownPhase => "with an unknown `ph`",
            SkipReason::BadTimestamp => "without a usable `ts`",
            SkipReason::BadDuration => "without a usable `dur`",
            SkipReason::NoName => "without `name`",
            SkipReason::BadId => "with an unusable `pid`/`tid`",
            SkipReason::BadFlowId => "flows without a usable id",
            SkipReason::UnusedPhase => "of phases the analysis does not use",
        }
    }
}

/// The events skipped for one reason.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Skipped {
    pub reason: SkipReason,
    pub count: u64,
    /// Index in `traceEvents` of the first one.
    pub first_event: u64,
    /// Byte offset of the first one (in the decompressed JSON for `.gz`).
    pub first_offset: u64,
    /// What was wrong with the first one.
    pub example: String,
    /// The file of the first one, when a run directory was read in several segments
    /// (`first_event` and `first_offset` are in that file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} event{} {} (first: ",
            self.count,
            if self.count == 1 { "" } else { "s" },
            self.reason.phrase(),
        )?;
        if let Some(file) = &self.file {
            write!(f, "{file} ")?;
        }
        write!(
            f,
            "event {}, byte {}: {})",
            self.first_event, self.first_offset, self.example
        )
    }
}

/// Skips of one part of a file, or of the whole file once parts are joined.
#[derive(Debug, Clone, Default)]
pub struct Skips {
    by: BTreeMap<SkipReason, Skipped>,
}

impl Skips {
    /// Counts one skipped event; the message is built only for the first of its reason.
    pub fn add(
        &mut self,
        reason: SkipReason,
        event: u64,
        offset: u64,
        what: impl FnOnce() -> String,
    ) {
        self.by
            .entry(reason)
            .and_modify(|s| s.count += 1)
            .or_insert_with(|| Skipped {
                reason,
                count: 1,
                first_event: event,
                first_offset: offset,
                example: what(),
                file: None,
            });
    }

    /// Takes a later part's skips; its event indices start `events_before` further on.
    pub fn absorb(&mut self, later: Skips, events_before: u64) {
        for (reason, mut s) in later.by {
            match self.by.get_mut(&reason) {
                Some(mine) => mine.count += s.count,
                None => {
                    s.first_event += events_before;
                    self.by.insert(reason, s);
                }
            }
        }
    }

    /// Every reason, in a fixed order.
    pub fn into_list(self) -> Vec<Skipped> {
        self.by.into_values().collect()
    }
}

/// The skips of several files (the segments of a run directory, in order) as one list:
/// counts summed by reason, the first example kept with the file it came from.
pub fn join_files(files: Vec<(String, Vec<Skipped>)>) -> Vec<Skipped> {
    let mut by: BTreeMap<SkipReason, Skipped> = BTreeMap::new();
    for (file, list) in files {
        for s in list {
            by.entry(s.reason)
                .and_modify(|mine| mine.count += s.count)
                .or_insert_with(|| Skipped {
                    file: Some(file.clone()),
                    ..s
                });
        }
    }
    by.into_values().collect()
}

/// The one-line summary of the problem skips, `None` when there are none.
pub fn summary(list: &[Skipped]) -> Option<String> {
    let problems: Vec<&Skipped> = list.iter().filter(|s| s.reason.is_problem()).collect();
    if problems.is_empty() {
        return None;
    }
    let total: u64 = problems.iter().map(|s| s.count).sum();
    let parts: Vec<String> = problems
        .iter()
        .map(|s| format!("{} {}", s.count, s.reason.phrase()))
        .collect();
    Some(format!(
        "skipped {total} event{} it cannot use: {} (--verbose lists the first of each)",
        if total == 1 { "" } else { "s" },
        parts.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason_and_keeps_the_first_example_across_parts() {
        let mut a = Skips::default();
        a.add(SkipReason::BadId, 3, 100, || "pid 1.5".into());
        a.add(SkipReason::BadId, 7, 300, || {
            unreachable!("built only once")
        });
        let mut b = Skips::default();
        b.add(SkipReason::BadId, 0, 900, || "later".into());
        b.add(SkipReason::NoName, 2, 950, || "no name".into());
        a.absorb(b, 10);
        let list = a.into_list();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].reason, SkipReason::NoName);
        assert_eq!((list[0].count, list[0].first_event), (1, 12));
        assert_eq!(list[1].reason, SkipReason::BadId);
        assert_eq!(
            (list[1].count, list[1].first_event, list[1].first_offset),
            (3, 3, 100)
        );
        assert_eq!(list[1].example, "pid 1.5");
        let line = summary(&list).unwrap();
        assert!(
            line.starts_with(
                "skipped 4 events it cannot use: 1 without `name`, 3 with an unusable `pid`/`tid`"
            ),
            "{line}"
        );
    }

    #[test]
    fn files_join_by_reason_and_name_the_file_of_the_first_example() {
        let mut a = Skips::default();
        a.add(SkipReason::BadId, 3, 100, || "pid 1.5".into());
        let mut b = Skips::default();
        b.add(SkipReason::BadId, 0, 900, || "later".into());
        b.add(SkipReason::NoName, 2, 950, || "no name".into());
        b.add(SkipReason::NoName, 4, 990, || "again".into());
        let list = join_files(vec![
            ("trace.json".into(), a.into_list()),
            ("trace.1.json".into(), b.into_list()),
        ]);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].reason, SkipReason::NoName);
        assert_eq!((list[0].count, list[0].first_event), (2, 2));
        assert_eq!(list[0].file.as_deref(), Some("trace.1.json"));
        assert_eq!(list[1].reason, SkipReason::BadId);
        assert_eq!((list[1].count, list[1].first_offset), (2, 100));
        assert_eq!(
            list[1].to_string(),
            "2 events with an unusable `pid`/`tid` (first: trace.json event 3, byte 100: pid 1.5)"
        );
    }

    #[test]
    fn unused_phases_are_not_problems() {
        let mut a = Skips::default();
        a.add(SkipReason::UnusedPhase, 0, 0, || "`i`".into());
        assert_eq!(summary(&a.into_list()), None);
    }
}
