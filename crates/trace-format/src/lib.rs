//! `chrome-trace-format`: the trace format that the dflash recorder writes and
//! `dflash-analyze` reads, in code. `docs/trace-format.md` tells it in prose; where the
//! two differ, this crate decides.
//!
//! Owns:
//! - the event model ([`event`]): spans (`X`), counters (`C`), metadata (`M`: process and
//!   thread names and sort indices), flows (v2 `bind_id` with `flow_out`/`flow_in` on a
//!   span; Kineto's `s`/`f` events of category `ac2g`) and argument values;
//! - what an event is to a reader ([`category`]: the `cat` strings, ours and Kineto's,
//!   the span kind each maps to and the clock that timed it; [`phase`]: the `ph` letters,
//!   metadata names, flow directions; [`limits`]);
//! - the file around the events ([`header`]: top-level keys, `metadata` keys and values)
//!   and its tracks ([`tracks`]: pids of the trainer and the GPUs, their names and order);
//! - what a CUDA runtime or driver call does to the step ([`cuda_api`]: launch, sync,
//!   allocation);
//! - well-known names ([`names`]: `ProfilerStep#N`; [`dflash`]: the trainer's sections,
//!   envelopes, the `queue.` prefix, the queue counter, argument keys);
//! - the run directory's files ([`run_dir`]);
//! - the streaming writer ([`writer`]) over hand-written JSON primitives ([`json`]).
//!
//! May import: `std`, `serde` (derives) and `serde_json` (the header's objects). No
//! libtorch, no polars: the recorder, the trainer and the analyzer all import it, and it
//! imports none of them. Inside, [`writer`] sits on top; the other modules import at most
//! [`json`], [`category`], [`phase`] and [`names`], and none imports this file's
//! re-exports (`crate::Category` is spelled `crate::category::Category` inside the crate).
//!
//! A new kind of event (kernels, runtime calls, allocator counters) is added here once: a
//! [`Category`] for its `cat` (with the [`SpanKind`] and [`Clock`] a reader gives it), a
//! struct in [`event`] if it has a shape of its own, and one [`EventWriter`] method.

pub mod category;
pub mod cuda_api;
pub mod dflash;
pub mod event;
pub mod header;
pub mod json;
pub mod limits;
pub mod names;
pub mod phase;
pub mod run_dir;
pub mod tracks;
pub mod writer;

pub use category::{Category, Clock, SpanKind};
pub use event::{Arg, ArgValue, Bind, Counter, Flow, Meta, Span, Text};
pub use header::{DeviceEntry, DistributedInfo, Header};
pub use json::Quoted;
pub use phase::{FlowDir, MetaName, Phase};
pub use writer::EventWriter;
