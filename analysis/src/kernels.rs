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
//! loops over plain vectors taken once from the spans frame ([`crate::columns`]); none of
//! them is a column expression. HTA's figures ([`crate::hta`]) come from the same
//! vectors, kernels and launches.

use chrome_trace_format::cuda_api::ApiClass;
use chrome_trace_format::{Clock, SpanKind};
use polars::prelude::*;
use rustc_hash::FxHashMap;

use crate::columns::{Cols, NO_ROW};

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
    /// Over the whole trace.
    pub kernels: u64,
    pub busy_us: f64,
    /// Only the kernels the steps launched (launch inside a `ProfilerStep#N`): what the
    /// steps cost this stream. A trace's kernels can run before its first step or after
    /// its last (a pipelined producer works ahead), so the whole-trace figures divided by
    /// the step count overstate a step.
    #[serde(default)]
    pub step_kernels: u64,
    #[serde(default)]
    pub step_busy_us: f64,
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

/// The runtime and driver calls, and the section that owns each.
struct Launches {
    /// The launch row of each correlation id.
    launch_of: FxHashMap<u64, usize>,
    /// Every runtime or driver call, with its class.
    runtime: Vec<(usize, ApiClass)>,
    /// Calls with no section on their own thread -> the section waiting for them on
    /// another thread of the process.
    waiting: FxHashMap<usize, usize>,
}

impl Launches {
    fn find(c: &Cols) -> Launches {
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
        Launches {
            launch_of,
            runtime,
            waiting,
        }
    }

    /// The launch of kernel `k`, by its correlation id.
    fn of(&self, c: &Cols, k: usize) -> Option<usize> {
        c.corr[k].and_then(|id| self.launch_of.get(&(id as u64)).copied())
    }

    /// The section that owns a call, and whether it does through a waiting thread.
    fn owner(&self, c: &Cols, launch: usize) -> Option<(usize, bool)> {
        c.section_of(launch)
            .map(|s| (s, false))
            .or_else(|| self.waiting.get(&launch).map(|&s| (s, true)))
    }
}

/// What the pass over the kernels gathers.
struct KernelPass<'c> {
    /// Per section row.
    acc: FxHashMap<usize, Acc>,
    /// Kernels attributed, of those through a waiting thread, and unattributed.
    attributed: u64,
    via_waiting_thread: u64,
    unattributed: u64,
    /// Every kernel's interval.
    all: Union,
    kernel_us: f64,
    /// Per (device, stream): kernels and their intervals, over the trace and of the
    /// kernels the steps launched.
    streams: FxHashMap<(i64, i64), (u64, Union)>,
    step_streams: FxHashMap<(i64, i64), (u64, Union)>,
    /// Per kernel name: count and total time.
    names: FxHashMap<&'c str, (u64, f64)>,
    /// The CPU step windows, and the intervals of the kernels each step launched.
    windows: Vec<(f64, f64, i64)>,
    per_step: Vec<Union>,
}

/// One pass over the kernels (sorted by start): totals, streams, names, the steps that
/// launched them, and the sections that own their launches.
fn kernel_pass<'c>(c: &'c Cols, kernels: &[usize], l: &Launches) -> KernelPass<'c> {
    let windows = step_windows(c);
    let mut p = KernelPass {
        acc: FxHashMap::default(),
        attributed: 0,
        via_waiting_thread: 0,
        unattributed: 0,
        all: Union::default(),
        kernel_us: 0.0,
        streams: FxHashMap::default(),
        step_streams: FxHashMap::default(),
        names: FxHashMap::default(),
        per_step: vec![Union::default(); windows.len()],
        windows,
    };
    let mut chain = Vec::new();
    for &k in kernels {
        let (s, e) = (c.ts[k], c.end(k));
        p.all.add(s, e);
        p.kernel_us += c.dur[k];
        let st = p.streams.entry((c.pid[k], c.tid[k])).or_default();
        st.0 += 1;
        st.1.add(s, e);
        let n = p.names.entry(c.name(k)).or_default();
        n.0 += 1;
        n.1 += c.dur[k];
        let launch = l.of(c, k);
        if let Some(w) = window_of(&p.windows, launch.map_or(s, |l| c.ts[l])) {
            p.per_step[w].add(s, e);
            let st = p.step_streams.entry((c.pid[k], c.tid[k])).or_default();
            st.0 += 1;
            st.1.add(s, e);
        }
        let Some((sec, via)) = launch.and_then(|launch| l.owner(c, launch)) else {
            p.unattributed += 1;
            continue;
        };
        p.attributed += 1;
        if via {
            p.via_waiting_thread += 1;
        }
        c.with_ancestors(sec, &mut chain);
        for &a in &chain {
            let x = p.acc.entry(a).or_insert_with(|| Acc {
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
    p
}

/// One pass over the runtime and driver calls: totals per class, and the launches,
/// syncs and allocations of the sections that own them (added to `acc`).
fn api_pass(
    c: &Cols,
    l: &Launches,
    acc: &mut FxHashMap<usize, Acc>,
) -> FxHashMap<ApiClass, ApiTotals> {
    let mut totals: FxHashMap<ApiClass, ApiTotals> = FxHashMap::default();
    let mut chain = Vec::new();
    for &(r, class) in &l.runtime {
        let t = totals.entry(class).or_default();
        t.calls += 1;
        t.us += c.dur[r];
        if class == ApiClass::Other {
            continue;
        }
        let Some((sec, _)) = l.owner(c, r) else {
            continue;
        };
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
    totals
}

/// Every kernel name, by total time (longest first).
fn kernel_rows(names: FxHashMap<&str, (u64, f64)>, kernel_us: f64) -> Vec<KernelRow> {
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
    by_name
}

/// The section rows summed per name, by kernel busy time (longest first).
fn section_rows(c: &Cols, acc: FxHashMap<usize, Acc>) -> Vec<SectionGpu> {
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
    sections
}

/// The streams, busiest first.
fn stream_rows(
    streams: FxHashMap<(i64, i64), (u64, Union)>,
    mut in_steps: FxHashMap<(i64, i64), (u64, Union)>,
) -> Vec<StreamBusy> {
    let mut streams: Vec<StreamBusy> = streams
        .into_iter()
        .map(|((pid, tid), (n, u))| {
            let (sn, su) = in_steps.remove(&(pid, tid)).unwrap_or_default();
            StreamBusy {
                pid,
                tid,
                kernels: n,
                busy_us: u.total(),
                step_kernels: sn,
                step_busy_us: su.total(),
            }
        })
        .collect();
    streams.sort_by(|a, b| {
        b.busy_us
            .total_cmp(&a.busy_us)
            .then((a.pid, a.tid).cmp(&(b.pid, b.tid)))
    });
    streams
}

/// The kernel view over the columns, `None` when the trace has no kernels.
fn view(c: &Cols) -> PolarsResult<Option<KernelView>> {
    let mut kernels: Vec<usize> = (0..c.kind.len())
        .filter(|&r| c.kind[r] == SpanKind::Kernel)
        .collect();
    if kernels.is_empty() {
        return Ok(None);
    }
    kernels.sort_by(|&a, &b| c.ts[a].total_cmp(&c.ts[b]));

    let launches = Launches::find(c);
    let mut pass = kernel_pass(c, &kernels, &launches);
    let mut totals = api_pass(c, &launches, &mut pass.acc);
    let mut total = |k| totals.remove(&k).unwrap_or_default();
    Ok(Some(KernelView {
        kernels: kernels.len() as u64,
        gpu_busy_us: pass.all.total(),
        kernel_us: pass.kernel_us,
        attributed: pass.attributed,
        via_waiting_thread: pass.via_waiting_thread,
        unattributed: pass.unattributed,
        step_busy_us: pass.per_step.iter().map(Union::total).sum(),
        step_busy: pass
            .windows
            .iter()
            .zip(&pass.per_step)
            .map(|(w, u)| StepBusy {
                step: w.2,
                busy_us: u.total(),
            })
            .collect(),
        streams: stream_rows(pass.streams, pass.step_streams),
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
        hta: crate::hta::hta(c, &kernels, &launches.launch_of),
        by_name: kernel_rows(pass.names, pass.kernel_us),
        sections: section_rows(c, pass.acc),
    }))
}
