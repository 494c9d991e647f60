//! The `ph` of an event, and what the phases we use carry: metadata names
//! ([`MetaName`]) and flow directions ([`FlowDir`]).

/// Every phase letter of the Chrome trace event format; a reader rejects others.
pub const KNOWN_PHASES: &[u8] = b"BEXiIbneSTpFstfPCMNODRcVv()";

/// An event's `ph`, as far as the format gives it a meaning here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// `X`: a span with `ts` and `dur`.
    Complete,
    /// `C`: counter samples, one per numeric arg.
    Counter,
    /// `M`: process and thread names and sort indices.
    Metadata,
    /// `s`, `t`, `f`: flow events (Kineto's launch-to-kernel arrows).
    FlowStart,
    FlowStep,
    FlowEnd,
    /// Any other phase of the Chrome format (instant events, async spans, ...).
    Other(u8),
}

impl Phase {
    /// The phase of a `ph` byte; `None` for a letter the Chrome format does not know.
    pub fn from_byte(b: u8) -> Option<Phase> {
        Some(match b {
            b'X' => Phase::Complete,
            b'C' => Phase::Counter,
            b'M' => Phase::Metadata,
            b's' => Phase::FlowStart,
            b't' => Phase::FlowStep,
            b'f' => Phase::FlowEnd,
            other if KNOWN_PHASES.contains(&other) => Phase::Other(other),
            _ => return None,
        })
    }

    pub const fn byte(self) -> u8 {
        match self {
            Phase::Complete => b'X',
            Phase::Counter => b'C',
            Phase::Metadata => b'M',
            Phase::FlowStart => b's',
            Phase::FlowStep => b't',
            Phase::FlowEnd => b'f',
            Phase::Other(b) => b,
        }
    }

    /// The flow end a flow event is: its start and steps leave, its end arrives.
    pub const fn flow_dir(self) -> Option<FlowDir> {
        match self {
            Phase::FlowStart | Phase::FlowStep => Some(FlowDir::Out),
            Phase::FlowEnd => Some(FlowDir::In),
            _ => None,
        }
    }
}

/// Which end of a flow an event is: the source (`flow_out`, `s`) or the destination
/// (`flow_in`, `f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FlowDir {
    Out,
    In,
}

impl FlowDir {
    pub const ALL: [FlowDir; 2] = [FlowDir::Out, FlowDir::In];

    pub const fn as_str(self) -> &'static str {
        match self {
            FlowDir::Out => "out",
            FlowDir::In => "in",
        }
    }
}

/// The `name` of an `M` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaName {
    ProcessName,
    ThreadName,
    ProcessSortIndex,
    ThreadSortIndex,
}

impl MetaName {
    pub const ALL: [MetaName; 4] = [
        MetaName::ProcessName,
        MetaName::ThreadName,
        MetaName::ProcessSortIndex,
        MetaName::ThreadSortIndex,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            MetaName::ProcessName => "process_name",
            MetaName::ThreadName => "thread_name",
            MetaName::ProcessSortIndex => "process_sort_index",
            MetaName::ThreadSortIndex => "thread_sort_index",
        }
    }

    pub fn parse(name: &[u8]) -> Option<MetaName> {
        MetaName::ALL
            .into_iter()
            .find(|m| m.as_str().as_bytes() == name)
    }

    /// The `args` key that holds its value: `name` or `sort_index`.
    pub const fn arg(self) -> &'static str {
        match self {
            MetaName::ProcessName | MetaName::ThreadName => NAME_ARG,
            MetaName::ProcessSortIndex | MetaName::ThreadSortIndex => SORT_INDEX_ARG,
        }
    }
}

/// The `args` key of a name in `process_name` / `thread_name` events.
pub const NAME_ARG: &str = "name";
/// The `args` key of a position in `*_sort_index` events.
pub const SORT_INDEX_ARG: &str = "sort_index";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_and_unknown_letters_are_refused() {
        for &b in KNOWN_PHASES {
            assert_eq!(Phase::from_byte(b).map(Phase::byte), Some(b));
        }
        for b in [b'x', b'Q', b'{', 0] {
            assert_eq!(Phase::from_byte(b), None);
        }
        assert_eq!(Phase::from_byte(b'i'), Some(Phase::Other(b'i')));
        let dirs: Vec<_> = b"stfX"
            .iter()
            .map(|&b| Phase::from_byte(b).and_then(Phase::flow_dir))
            .collect();
        assert_eq!(
            dirs,
            [
                Some(FlowDir::Out),
                Some(FlowDir::Out),
                Some(FlowDir::In),
                None
            ]
        );
    }

    #[test]
    fn meta_names_parse() {
        for m in MetaName::ALL {
            assert_eq!(MetaName::parse(m.as_str().as_bytes()), Some(m));
        }
        assert_eq!(MetaName::parse(b"process_labels"), None);
        assert_eq!(MetaName::ThreadSortIndex.arg(), "sort_index");
    }
}
