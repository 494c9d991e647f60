//! The events of the format as values a writer takes: [`Span`] (`X`), [`Counter`] (`C`),
//! [`Meta`] (`M`) and Kineto's flow events [`Flow`] (`s`/`f`), with their arguments
//! ([`Arg`], [`ArgValue`]), names ([`Text`]) and the v2 flow binding of a span ([`Bind`]).
//! Times are nanoseconds from the trace's base; the writer prints them as microseconds.
use crate::category::Category;
use crate::json::Quoted;
use crate::phase::FlowDir;

/// A numeric argument value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    I64(i64),
    U64(u64),
    /// Written in Rust's shortest round-trip form; a non-finite value as `null`.
    F64(f64),
    /// A time in nanoseconds, written in microseconds with three decimals like `ts`
    /// (`args.cpu_ts` of a GPU span).
    Micros(u64),
    /// Three integers, written as an array (`args.grid` and `args.block` of a kernel, as
    /// Kineto writes them).
    Triple([i64; 3]),
}

macro_rules! arg_from {
    ($($t:ty => $v:ident as $c:ty),* $(,)?) => {$(
        impl From<$t> for ArgValue {
            fn from(x: $t) -> Self {
                ArgValue::$v(x as $c)
            }
        }
    )*};
}
arg_from!(i64 => I64 as i64, i32 => I64 as i64, isize => I64 as i64,
          u64 => U64 as u64, u32 => U64 as u64, usize => U64 as u64,
          f64 => F64 as f64, f32 => F64 as f64);

/// One member of an event's `args`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arg<'a> {
    pub key: &'a str,
    pub value: ArgValue,
}

/// A name as the writer gets it.
#[derive(Clone, Copy, Debug)]
pub enum Text<'a> {
    /// Escaped as it is written.
    Plain(&'a str),
    /// Escaped once beforehand (an interned name).
    Quoted(&'a Quoted),
    /// `ProfilerStep#<n>`.
    Step(u64),
}

/// The flow a span takes part in (Perfetto's flow v2): its `bind_id`, and whether the
/// span is the flow's source (`flow_out`), its destination (`flow_in`), or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bind {
    pub id: u64,
    pub flow_out: bool,
    pub flow_in: bool,
}

impl Bind {
    /// The span is the flow's source.
    pub const fn source(id: u64) -> Bind {
        Bind {
            id,
            flow_out: true,
            flow_in: false,
        }
    }

    /// The span is the flow's destination.
    pub const fn destination(id: u64) -> Bind {
        Bind {
            id,
            flow_out: false,
            flow_in: true,
        }
    }
}

/// A complete event (`ph:"X"`) on track `(pid, tid)`.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a> {
    pub cat: Category,
    pub name: Text<'a>,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub bind: Option<Bind>,
    /// Written in order; keys must not repeat.
    pub args: &'a [Arg<'a>],
}

/// Counter samples (`ph:"C"`) of process `pid`: one track per arg, `<name> <key>`.
#[derive(Clone, Copy, Debug)]
pub struct Counter<'a> {
    /// dflash writes the name's first `.`-separated component.
    pub cat: Text<'a>,
    pub name: Text<'a>,
    pub pid: u32,
    pub ts_ns: u64,
    pub args: &'a [Arg<'a>],
}

/// A metadata event (`ph:"M"`): a process's or thread's name or place in the list.
/// Process events are written with `tid` 0.
#[derive(Clone, Copy, Debug)]
pub enum Meta<'a> {
    ProcessName { pid: u32, name: &'a str },
    ProcessSortIndex { pid: u32, index: u64 },
    ThreadName { pid: u32, tid: u32, name: &'a str },
    ThreadSortIndex { pid: u32, tid: u32, index: u64 },
}

/// A flow event (`ph:"s"` at the source, `"f"` at the destination, binding to the
/// enclosing slice), as Kineto writes its launch-to-kernel arrows (`cat:"ac2g"`).
#[derive(Clone, Copy, Debug)]
pub struct Flow<'a> {
    pub dir: FlowDir,
    pub id: u64,
    pub cat: Category,
    pub name: &'a str,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
}
