//! The fixed-size record a span leaves in its thread's ring: plain `Copy` data (an
//! interned name, raw clock ticks, up to [`MAX_ARGS`] inline arguments, an optional pair
//! of GPU events), so recording one is a copy into a preallocated slot, never an
//! allocation.
use chrome_trace_format::ArgValue;

use crate::names::Name;

/// Arguments a span can carry; further [`Span::arg`](crate::Span::arg) calls are ignored.
pub const MAX_ARGS: usize = 4;

/// A span argument as the ring holds it: its key lives as long as the program.
pub(crate) type Arg = chrome_trace_format::Arg<'static>;

pub(crate) const NO_ARG: Arg = Arg {
    key: "",
    value: ArgValue::I64(0),
};

/// What an event is; decides its `ph` and `cat` (see `writer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cat:"cpu"` (plain and GPU-timed spans alike; the GPU half goes elsewhere).
    Cpu,
    Queue,
    /// `ProfilerStep#<aux>`.
    Step,
    /// A `C` event: `args[0]` holds the key and value, `start` the time.
    Counter,
}

/// The GPU half of a GPU-timed span: two backend events recorded on the launching
/// thread's current stream, resolved later by the writer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GpuPart {
    /// The begin and end events (0: none yet), and their entries in the recording
    /// thread's event table (see `holds::Holds`).
    pub begin: u64,
    pub end: u64,
    pub begin_slot: u32,
    pub end_slot: u32,
    pub stream: u64,
    pub device: u32,
    /// The device's calibration epoch when the tree's root began.
    pub epoch: u32,
    /// Spans of one thread nested under one outermost GPU span share a tree id; the
    /// writer places a whole tree with one clock mapping so that it stays nested.
    pub tree: u32,
    pub root: bool,
    /// The recorder generation the events belong to (see `holds::LastRecord`).
    pub gen: u32,
}

/// One slot of a thread's ring. A span takes one [`Head`] slot, followed (written and
/// published together) by `nargs` [`Slot::Arg`]s and a [`Slot::Gpu`] when `gpu`, so a
/// plain span copies under one cache line.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slot {
    Head(Head),
    Arg(Arg),
    Gpu(GpuPart),
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Head {
    pub start: u64,
    pub end: u64,
    pub flow: u64,
    pub aux: u64,
    pub name: Name,
    /// Spans opened after this one that were still open when it ended (its guard was
    /// dropped out of order); the writer cuts them at its end.
    pub outlived: u32,
    pub kind: Kind,
    pub flow_in: bool,
    pub flow_out: bool,
    pub nargs: u8,
    pub gpu: bool,
}

impl Head {
    #[inline]
    pub(crate) const fn new(name: Name, kind: Kind) -> Self {
        Head {
            start: 0,
            end: 0,
            flow: 0,
            aux: 0,
            name,
            outlived: 0,
            kind,
            flow_in: false,
            flow_out: false,
            nargs: 0,
            gpu: false,
        }
    }
}

/// A whole event, as the writer rebuilds it from a head and its continuation slots.
/// `head.aux` is the step number for [`Kind::Step`]; for other spans the thread's current
/// step + 1 (0: none), which GPU spans carry as `args.step`. `head.nargs` counts `args`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawEvent {
    pub head: Head,
    pub args: [Arg; MAX_ARGS],
    pub gpu: Option<GpuPart>,
}

impl RawEvent {
    pub(crate) fn from_head(h: &Head) -> Self {
        RawEvent {
            head: Head { nargs: 0, ..*h },
            args: [NO_ARG; MAX_ARGS],
            gpu: None,
        }
    }

    pub(crate) fn args(&self) -> &[Arg] {
        &self.args[..self.head.nargs as usize]
    }

    /// Sets `key`, replacing an earlier value of the same key (JSON objects must not
    /// repeat keys). Returns false when the inline array is full.
    #[inline]
    pub(crate) fn set_arg(&mut self, key: &'static str, value: ArgValue) -> bool {
        let n = self.head.nargs as usize;
        for a in &mut self.args[..n] {
            if a.key == key {
                a.value = value;
                return true;
            }
        }
        if n == MAX_ARGS {
            return false;
        }
        self.args[n] = Arg { key, value };
        self.head.nargs += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_replace_and_cap() {
        let mut e = RawEvent::from_head(&Head::new(Name(0), Kind::Cpu));
        assert!(e.set_arg("a", 1i64.into()));
        assert!(e.set_arg("a", 2u32.into()));
        assert_eq!(e.args().len(), 1);
        assert_eq!(e.args()[0].value, ArgValue::U64(2));
        for k in ["b", "c", "d"] {
            assert!(e.set_arg(k, 0.5f64.into()));
        }
        assert!(!e.set_arg("e", 1i64.into()));
        assert_eq!(e.args().len(), MAX_ARGS);
    }

    #[test]
    fn a_slot_fits_a_cache_line() {
        assert!(
            std::mem::size_of::<Slot>() <= 64,
            "{}",
            std::mem::size_of::<Slot>()
        );
    }
}
