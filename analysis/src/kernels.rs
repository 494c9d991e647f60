//! The kernel view of a trace with GPU kernels (Kineto's; ours once the recorder captures
//! them): a kernel table, and per section the GPU work it launched and the host time it
//! spent launching, waiting and allocating.
//!
//! A kernel belongs to the section that was open when it was launched: its launch (the
//! runtime or driver call with the same correlation id) sits on some thread, and the
//! innermost CPU section enclosing that call on that thread owns it, with every section
//! around that one. Autograd runs the backward pass on a thread of its own that has no
//! sections; a launch there goes to the innermost section open at that moment on another
//! thread of the same process: the one that waits for the backward pass to finish.
//!
//! The walks here (parent chains, a sweep over time, running unions of intervals) are
//! loops over plain vectors taken once from the spans frame; none of them is a column
//! expression.

use chrome_trace_format::cuda_api::ApiClass;
use chrome_trace_format::{Clock, SpanKind};
use polars::prelude::*;
use rustc_hash::FxHashMap;

const NO_ROW: u32 = u32::MAX;

/// One kernel name.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelRow {
    pub name: String,
    pub count: u64,
    pub total_us: f64,
    pub mean_us: f64,
    /// Of the time of all kernels (summed, so shares add up to 1 with streams overlapping).
    pub share: f64,
}

/// What one section name launched and waited for, summed over its instances. Sections
/// nest: a section's figures include those of the sections inside it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SectionGpu {
    pub name: String,
    /// Instances that launched or waited for anything.
    pub instances: u64,
    pub kernels: u64,
    /// Sum of the kernels' durations.
    pub kernel_us: f64,
    /// Union of the kernels' intervals per instance (overlapping streams counted once).
    pub kernel_busy_us: f64,
    /// First kernel start to last kernel end, per instance.
    pub gpu_span_us: f64,
    pub launches: u64,
    /// Host time in launch calls (kernel launches, asynchronous copies and sets).
    pub launch_us: f64,
    pub syncs: u64,
    /// Host time blocked in synchronizing calls.
    pub sync_us: f64,
    /// Device allocations and frees (`cudaMalloc`/`cudaFree`), and their host time.
    pub allocs: u64,
    pub alloc_us: f64,
}

/// Busy time of one GPU stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamBusy {
    /// The device.
    pub pid: i64,
    /// The stream.
    pub tid: i64,
    pub kernels: u64,
    pub busy_us: f64,
}

/// GPU busy time of the work one step launched.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepBusy {
    pub step: i64,
    pub busy_us: f64,
}

/// Host calls of one class over the whole trace.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ApiTotals {
    pub calls: u64,
    pub us: f64,
}

/// The kernel view of a trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelView {
    /// Kernels, copies and sets on the GPU.
    pub kernels: u64,
    /// Union of their intervals (all streams).
    pub gpu_busy_us: f64,
    /// Sum of their durations.
    pub kernel_us: f64,
    /// Kernels whose launch was found, and of those the ones owned through another
    /// thread's section (autograd's); the rest have no launch or no section.
    pub attributed: u64,
    pub via_waiting_thread: u64,
    pub unattributed: u64,
    /// GPU busy time of the work each step launched (the union of the kernels whose
    /// launch lies in a CPU `ProfilerStep#N`, summed over steps). The GPU runs behind the
    /// host, so this, not the busy time inside each step's window, is what a step costs
    /// the GPU.
    pub step_busy_us: f64,
    /// The same per step (steps numbered as in `ProfilerStep#N`).
    pub step_busy: Vec<StepBusy>,
    pub streams: Vec<StreamBusy>,
    /// Names of the CPU sections that no other CPU section encloses (Python frames or
    /// operators between them and the step aside).
    #[serde(skip)]
    pub outer_sections: Vec<String>,
    pub launch: ApiTotals,
    pub sync: ApiTotals,
    pub alloc: ApiTotals,
    pub free: ApiTotals,
    /// What Holistic Trace Analysis reports for one rank: temporal and idle-time
    /// breakdowns, launch statistics, queue lengths.
    pub hta: crate::hta::Hta,
    /// Every kernel name, by total time (longest first).
    pub by_name: Vec<KernelRow>,
    /// Sections that launched or waited, by kernel busy time (longest first).
    pub sections: Vec<SectionGpu>,
}

/// The spans frame as plain vectors (the columns the walks need).
pub(crate) struct Cols {
    pub(crate) kind: Vec<SpanKind>,
    pub(crate) clock: Vec<Clock>,
    pub(crate) step: Vec<Option<i64>>,
    pub(crate) pid: Vec<i64>,
    pub(crate) tid: Vec<i64>,
    pub(crate) ts: Vec<f64>,
    pub(crate) dur: Vec<f64>,
    pub(crate) parent: Vec<u32>,
    pub(crate) corr: Vec<Option<f64>>,
    names: Names,
}

/// Span names: the Enum's codes and its mapping (no string column is built: casting a
/// few million names to `String` was a sixth of a breakdown's time), or the plain strings
/// when the loader could not build the Enum.
enum Names {
    Codes(Vec<u32>, std::sync::Arc<CategoricalMapping>),
    Plain(StringChunked),
}

impl Cols {
    fn take(spans: &DataFrame) -> PolarsResult<Cols> {
        let codes = spans
            .column("kind")?
            .as_materialized_series()
            .to_physical_repr()
            .cast(&DataType::UInt32)?;
        let kind = codes
            .u32()?
            .iter()
            .map(|c| {
                c.and_then(|c| SpanKind::ALL.get(c as usize).copied())
                    .unwrap_or(SpanKind::Other)
            })
            .collect();
        let clock = spans
            .column("clock")?
            .as_materialized_series()
            .to_physical_repr()
            .cast(&DataType::UInt32)?
            .u32()?
            .iter()
            .map(|c| {
                c.and_then(|c| Clock::ALL.get(c as usize).copied())
                    .unwrap_or(Clock::Cpu)
            })
            .collect();
        let f64s = |n: &str| -> PolarsResult<Vec<f64>> {
            Ok(spans
                .column(n)?
                .f64()?
                .iter()
                .map(|v| v.unwrap_or(0.0))
                .collect())
        };
        let i64s = |n: &str| -> PolarsResult<Vec<i64>> {
            Ok(spans
                .column(n)?
                .i64()?
                .iter()
                .map(|v| v.unwrap_or(0))
                .collect())
        };
        let name = spans.column("name")?;
        let names = match name.dtype() {
            DataType::Enum(_, mapping) | DataType::Categorical(_, mapping) => Names::Codes(
                name.as_materialized_series()
                    .to_physical_repr()
                    .cast(&DataType::UInt32)?
                    .u32()?
                    .iter()
                    .map(|c| c.unwrap_or(u32::MAX))
                    .collect(),
                mapping.clone(),
            ),
            _ => Names::Plain(name.cast(&DataType::String)?.str()?.rechunk().into_owned()),
        };
        Ok(Cols {
            kind,
            clock,
            step: spans.column("step")?.i64()?.iter().collect(),
            pid: i64s("pid")?,
            tid: i64s("tid")?,
            ts: f64s("ts")?,
            dur: f64s("dur")?,
            parent: spans
                .column("parent")?
                .u32()?
                .iter()
                .map(|p| p.unwrap_or(NO_ROW))
                .collect(),
            corr: spans.column("correlation")?.f64()?.iter().collect(),
            names,
        })
    }

    pub(crate) fn name(&self, row: usize) -> &str {
        match &self.names {
            Names::Codes(codes, mapping) => mapping.cat_to_str(codes[row]).unwrap_or(""),
            Names::Plain(s) => s.get(row).unwrap_or(""),
        }
    }

    pub(crate) fn end(&self, row: usize) -> f64 {
        self.ts[row] + self.dur[row]
    }

    /// The innermost CPU section enclosing `row` on its track (itself if it is one).
    fn section_of(&self, row: usize) -> Option<usize> {
        let mut r = row as u32;
        while r != NO_ROW {
            if self.kind[r as usize] == SpanKind::Cpu {
                return Some(r as usize);
            }
            r = self.parent[r as usize];
        }
        None
    }

    /// `row` and the CPU sections around it, innermost first.
    fn with_ancestors(&self, row: usize, out: &mut Vec<usize>) {
        out.clear();
        let mut r = row as u32;
        while r != NO_ROW {
            if self.kind[r as usize] == SpanKind::Cpu {
                out.push(r as usize);
            }
            r = self.parent[r as usize];
        }
    }
}

/// For launches with no section on their own thread: the innermost CPU section open at
/// the launch on another thread of the same process, by a sweep over time per process.
fn waiting_sections(c: &Cols, orphans: &[usize]) -> FxHashMap<usize, usize> {
    let mut by_pid: FxHashMap<i64, (Vec<usize>, Vec<usize>)> = FxHashMap::default();
    for (row, &k) in c.kind.iter().enumerate() {
        if k == SpanKind::Cpu {
            by_pid.entry(c.pid[row]).or_default().0.push(row);
        }
    }
    for &l in orphans {
        if let Some(e) = by_pid.get_mut(&c.pid[l]) {
            e.1.push(l);
        }
    }
    let mut found = FxHashMap::default();
    for (_, (mut secs, mut launches)) in by_pid {
        secs.sort_by(|&a, &b| c.ts[a].total_cmp(&c.ts[b]));
        launches.sort_by(|&a, &b| c.ts[a].total_cmp(&c.ts[b]));
        let mut active: Vec<usize> = Vec::new();
        let mut next = 0;
        for l in launches {
            let t = c.ts[l];
            while next < secs.len() && c.ts[secs[next]] <= t {
                active.push(secs[next]);
                next += 1;
            }
            active.retain(|&s| c.end(s) >= t);
            let (lp, lt) = (c.pid[l], c.tid[l]);
            let best = active
                .iter()
                .copied()
                .filter(|&s| (c.pid[s], c.tid[s]) != (lp, lt))
                .min_by(|&a, &b| c.dur[a].total_cmp(&c.dur[b]));
            if let Some(s) = best {
                found.insert(l, s);
            }
        }
    }
    found
}

/// The CPU step windows `(start, end, step)`, by start.
fn step_windows(c: &Cols) -> Vec<(f64, f64, i64)> {
    let mut w: Vec<(f64, f64, i64)> = (0..c.kind.len())
        .filter(|&r| c.kind[r] == SpanKind::Step && c.clock[r] == Clock::Cpu)
        .filter_map(|r| Some((c.ts[r], c.end(r), c.step[r]?)))
        .collect();
    w.sort_by(|a, b| a.0.total_cmp(&b.0));
    w
}

/// The window holding time `t`, if any.
fn window_of(w: &[(f64, f64, i64)], t: f64) -> Option<usize> {
    let k = w.partition_point(|s| s.0 <= t).checked_sub(1)?;
    (t <= w[k].1).then_some(k)
}

/// The CPU sections inside steps that no other CPU section encloses.
fn outer_sections(c: &Cols) -> impl Iterator<Item = usize> + '_ {
    (0..c.kind.len())
        .filter(|&r| c.kind[r] == SpanKind::Cpu && c.step[r].is_some())
        .filter(|&r| {
            let p = c.parent[r];
            p == NO_ROW || c.section_of(p as usize).is_none()
        })
}

fn outer_section_us(c: &Cols) -> f64 {
    outer_sections(c).map(|r| c.dur[r]).sum()
}

/// Per section row: what it launched and waited for.
#[derive(Default, Clone)]
struct Acc {
    kernels: u64,
    kernel_us: f64,
    busy: Union,
    first: f64,
    last: f64,
    launches: u64,
    launch_us: f64,
    syncs: u64,
    sync_us: f64,
    allocs: u64,
    alloc_us: f64,
}

/// A running union of intervals fed in order of their starts.
#[derive(Default, Clone, Copy)]
struct Union {
    open: Option<(f64, f64)>,
    done: f64,
}

impl Union {
    fn add(&mut self, s: f64, e: f64) {
        match &mut self.open {
            Some((_, oe)) if s <= *oe => *oe = oe.max(e),
            Some((os, oe)) => {
                self.done += *oe - *os;
                self.open = Some((s, e));
            }
            None => self.open = Some((s, e)),
        }
    }

    fn total(&self) -> f64 {
        self.done + self.open.map_or(0.0, |(s, e)| e - s)
    }
}

/// What one walk over the spans finds.
pub struct Walk {
    /// Time in CPU sections inside steps that no other CPU section encloses: how much of
    /// the steps the user's annotations cover (operators or Python frames between them
    /// and the step do not matter).
    pub outer_section_us: f64,
    /// `None` when the trace has no kernels.
    pub kernels: Option<KernelView>,
}

/// The section coverage and the kernel view, from one copy of the columns.
pub fn walk(spans: &DataFrame) -> PolarsResult<Walk> {
    let c = Cols::take(spans)?;
    Ok(Walk {
        outer_section_us: outer_section_us(&c),
        kernels: view(&c)?,
    })
}

/// The kernel view, `None` when the trace has no kernels.
pub fn kernel_view(spans: &DataFrame) -> PolarsResult<Option<KernelView>> {
    view(&Cols::take(spans)?)
}

fn view(c: &Cols) -> PolarsResult<Option<KernelView>> {
    let mut kernels: Vec<usize> = (0..c.kind.len())
        .filter(|&r| c.kind[r] == SpanKind::Kernel)
        .collect();
    if kernels.is_empty() {
        return Ok(None);
    }
    kernels.sort_by(|&a, &b| c.ts[a].total_cmp(&c.ts[b]));

    // Launches by correlation id, their class and their section.
    let mut launch_of: FxHashMap<u64, usize> = FxHashMap::default();
    let mut runtime: Vec<(usize, ApiClass)> = Vec::new();
    let mut class_of: FxHashMap<&str, ApiClass> = FxHashMap::default();
    for row in 0..c.kind.len() {
        if c.kind[row] != SpanKind::Runtime {
            continue;
        }
        let name = c.name(row);
        let class = *class_of.entry(name).or_insert_with(|| ApiClass::of(name));
        runtime.push((row, class));
        if let Some(id) = c.corr[row] {
            launch_of.insert(id as u64, row);
        }
    }
    let orphans: Vec<usize> = runtime
        .iter()
        .filter(|&&(r, _)| c.section_of(r).is_none())
        .map(|&(r, _)| r)
        .collect();
    let waiting = waiting_sections(c, &orphans);
    let owner = |launch: usize| -> Option<(usize, bool)> {
        c.section_of(launch)
            .map(|s| (s, false))
            .or_else(|| waiting.get(&launch).map(|&s| (s, true)))
    };

    let mut acc: FxHashMap<usize, Acc> = FxHashMap::default();
    let mut chain = Vec::new();
    let mut view_counts = (0u64, 0u64, 0u64);
    let mut all = Union::default();
    let mut kernel_us = 0.0;
    let mut streams: FxHashMap<(i64, i64), (u64, Union)> = FxHashMap::default();
    let mut names: FxHashMap<&str, (u64, f64)> = FxHashMap::default();
    let windows = step_windows(c);
    let mut per_step: Vec<Union> = vec![Union::default(); windows.len()];
    for &k in &kernels {
        let (s, e) = (c.ts[k], c.end(k));
        all.add(s, e);
        kernel_us += c.dur[k];
        let st = streams.entry((c.pid[k], c.tid[k])).or_default();
        st.0 += 1;
        st.1.add(s, e);
        let n = names.entry(c.name(k)).or_default();
        n.0 += 1;
        n.1 += c.dur[k];
        let launch = c.corr[k].and_then(|id| launch_of.get(&(id as u64)).copied());
        if let Some(w) = window_of(&windows, launch.map_or(s, |l| c.ts[l])) {
            per_step[w].add(s, e);
        }
        let Some((sec, via)) = launch.and_then(owner) else {
            view_counts.2 += 1;
            continue;
        };
        view_counts.0 += 1;
        if via {
            view_counts.1 += 1;
        }
        c.with_ancestors(sec, &mut chain);
        for &a in &chain {
            let x = acc.entry(a).or_insert_with(|| Acc {
                first: s,
                last: e,
                ..Acc::default()
            });
            x.kernels += 1;
            x.kernel_us += c.dur[k];
            x.busy.add(s, e);
            x.last = x.last.max(e);
        }
    }

    let mut totals: FxHashMap<ApiClass, ApiTotals> = FxHashMap::default();
    for &(r, class) in &runtime {
        let t = totals.entry(class).or_default();
        t.calls += 1;
        t.us += c.dur[r];
        if class == ApiClass::Other {
            continue;
        }
        let Some((sec, _)) = owner(r) else { continue };
        c.with_ancestors(sec, &mut chain);
        for &a in &chain {
            let x = acc.entry(a).or_insert_with(|| Acc {
                first: f64::INFINITY,
                last: f64::NEG_INFINITY,
                ..Acc::default()
            });
            match class {
                ApiClass::Launch => {
                    x.launches += 1;
                    x.launch_us += c.dur[r];
                }
                ApiClass::Sync => {
                    x.syncs += 1;
                    x.sync_us += c.dur[r];
                }
                ApiClass::Alloc | ApiClass::Free => {
                    x.allocs += 1;
                    x.alloc_us += c.dur[r];
                }
                ApiClass::Other => {}
            }
        }
    }

    let busy = all.total();
    let mut by_name: Vec<KernelRow> = names
        .into_iter()
        .map(|(name, (count, total))| KernelRow {
            name: name.to_string(),
            count,
            total_us: total,
            mean_us: total / count as f64,
            share: if kernel_us > 0.0 {
                total / kernel_us
            } else {
                0.0
            },
        })
        .collect();
    by_name.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(&b.name)));

    let mut per_name: FxHashMap<&str, SectionGpu> = FxHashMap::default();
    for (row, x) in acc {
        let name = c.name(row);
        let s = per_name.entry(name).or_insert_with(|| SectionGpu {
            name: name.to_string(),
            instances: 0,
            kernels: 0,
            kernel_us: 0.0,
            kernel_busy_us: 0.0,
            gpu_span_us: 0.0,
            launches: 0,
            launch_us: 0.0,
            syncs: 0,
            sync_us: 0.0,
            allocs: 0,
            alloc_us: 0.0,
        });
        s.instances += 1;
        s.kernels += x.kernels;
        s.kernel_us += x.kernel_us;
        s.kernel_busy_us += x.busy.total();
        if x.kernels > 0 {
            s.gpu_span_us += x.last - x.first;
        }
        s.launches += x.launches;
        s.launch_us += x.launch_us;
        s.syncs += x.syncs;
        s.sync_us += x.sync_us;
        s.allocs += x.allocs;
        s.alloc_us += x.alloc_us;
    }
    let mut sections: Vec<SectionGpu> = per_name.into_values().collect();
    sections.sort_by(|a, b| {
        b.kernel_busy_us
            .total_cmp(&a.kernel_busy_us)
            .then(b.launch_us.total_cmp(&a.launch_us))
            .then(a.name.cmp(&b.name))
    });
    let mut streams: Vec<StreamBusy> = streams
        .into_iter()
        .map(|((pid, tid), (n, u))| StreamBusy {
            pid,
            tid,
            kernels: n,
            busy_us: u.total(),
        })
        .collect();
    streams.sort_by(|a, b| {
        b.busy_us
            .total_cmp(&a.busy_us)
            .then((a.pid, a.tid).cmp(&(b.pid, b.tid)))
    });
    let mut total = |k| totals.remove(&k).unwrap_or_default();
    Ok(Some(KernelView {
        kernels: kernels.len() as u64,
        gpu_busy_us: busy,
        kernel_us,
        attributed: view_counts.0,
        via_waiting_thread: view_counts.1,
        unattributed: view_counts.2,
        step_busy_us: per_step.iter().map(Union::total).sum(),
        step_busy: windows
            .iter()
            .zip(&per_step)
            .map(|(w, u)| StepBusy {
                step: w.2,
                busy_us: u.total(),
            })
            .collect(),
        streams,
        outer_sections: {
            let mut n: Vec<String> = outer_sections(c).map(|r| c.name(r).to_string()).collect();
            n.sort();
            n.dedup();
            n
        },
        launch: total(ApiClass::Launch),
        sync: total(ApiClass::Sync),
        alloc: total(ApiClass::Alloc),
        free: total(ApiClass::Free),
        hta: crate::hta::hta(c, &kernels, &launch_of),
        by_name,
        sections,
    }))
}
