//! The placed records into the trace: per-section kernel figures, track names, calls
//! (with the class totals), sync and overhead records, GPU records with Kineto's args,
//! and the launch flows.
use std::collections::{BTreeSet, HashMap};

use chrome_trace_format::cuda_api::ApiClass;
use chrome_trace_format::names::kineto;
use chrome_trace_format::tracks::{gpu_process_name, gpu_sort_index};
use chrome_trace_format::{Arg, ArgValue, Category, EventWriter, Flow, FlowDir, Meta, Span, Text};

use super::place::{Gpu, Placement};
use super::report::{MergeInput, MergeReport};
use crate::cuda::activity::{Activity, ActivityKind};

/// `tid` of the per-device track of device-level overhead records.
const OVERHEAD_TID: u32 = 999;

fn category(kind: ActivityKind) -> Category {
    match kind {
        ActivityKind::Kernel => Category::Kernel,
        ActivityKind::Memcpy => Category::GpuMemcpy,
        ActivityKind::Memset => Category::GpuMemset,
        ActivityKind::Runtime => Category::CudaRuntime,
        ActivityKind::Driver => Category::CudaDriver,
        ActivityKind::Sync => Category::CudaSync,
        ActivityKind::Overhead => Category::Overhead,
    }
}

fn name_device(w: &mut EventWriter, device: u32) {
    w.meta(&Meta::ProcessName {
        pid: device,
        name: &gpu_process_name(device),
    });
    w.meta(&Meta::ProcessSortIndex {
        pid: device,
        index: gpu_sort_index(device),
    });
}

/// Step 6: Per GPU-timed section: its spans and GPU time, the kernels launched inside it (or
/// inside a section it encloses on its thread) and their busy time.
pub(super) fn section_figures(input: &MergeInput, p: &Placement, rep: &mut MergeReport) {
    let spans = &input.gpu_spans;
    for s in spans {
        let e = rep.sections.entry(s.name.clone()).or_default();
        e.spans += 1;
        e.gpu_ns += s.dur_ns;
    }
    for g in &p.gpu {
        if input.activities[g.idx].kind != ActivityKind::Kernel {
            continue;
        }
        let Some(s) = g.section else { continue };
        let thread = spans[s].thread;
        let t = g.launch.map(|l| l.ts as u64).unwrap_or(0);
        let mut names: Vec<&str> = p.by_thread[&thread]
            .iter()
            .filter(|&&i| spans[i].cpu_ts_ns <= t && t <= spans[i].cpu_end_ns)
            .map(|&i| spans[i].name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        for n in names {
            if let Some(e) = rep.sections.get_mut(n) {
                e.kernels += 1;
                e.kernel_ns += (g.end - g.ts).max(0) as u64;
            }
        }
    }
}

/// Step 7: Everything placed, through `w`.
pub(super) fn write(
    input: &MergeInput,
    p: &mut Placement,
    w: &mut EventWriter,
    rep: &mut MergeReport,
) {
    let mut named: BTreeSet<u32> = input.gpu_spans.iter().map(|s| s.device).collect();
    name_tracks(input, p, &mut named, w, rep);
    write_calls(input, p, w, rep);
    write_sync_and_overhead(input, p, &mut named, w, rep);
    for g in &p.gpu {
        let a = &input.activities[g.idx];
        write_gpu_record(a, g, p.track_of[&(a.device, a.stream)], w, rep);
    }
}

/// Names the tracks made for threads and streams the recorder had none for.
fn name_tracks(
    input: &MergeInput,
    p: &Placement,
    named: &mut BTreeSet<u32>,
    w: &mut EventWriter,
    rep: &mut MergeReport,
) {
    for (os, tid) in &p.foreign {
        w.meta(&Meta::ThreadName {
            pid: input.pid,
            tid: *tid,
            name: &format!("CUDA calls {os}"),
        });
        w.meta(&Meta::ThreadSortIndex {
            pid: input.pid,
            tid: *tid,
            index: u64::from(*tid),
        });
    }
    rep.new_tracks += p.foreign.len() as u64;
    for &(device, stream, tid) in &p.new_streams {
        if named.insert(device) {
            name_device(w, device);
        }
        w.meta(&Meta::ThreadName {
            pid: device,
            tid,
            name: &format!("stream {stream} (CUDA)"),
        });
        w.meta(&Meta::ThreadSortIndex {
            pid: device,
            tid,
            index: u64::from(tid),
        });
        rep.new_tracks += 1;
    }
}

/// The calls, and the class totals over the outermost calls of each thread (a driver
/// call inside a runtime call is not counted twice).
fn write_calls(input: &MergeInput, p: &mut Placement, w: &mut EventWriter, rep: &mut MergeReport) {
    p.calls
        .sort_by_key(|c| (c.tid, c.ts, std::cmp::Reverse(c.end)));
    let mut open_until: HashMap<u32, i64> = HashMap::new();
    let (mut other, mut other_ns) = (0u64, 0u64);
    for c in &p.calls {
        let a = &input.activities[c.idx];
        if open_until.get(&c.tid).is_none_or(|&e| c.ts >= e) {
            open_until.insert(c.tid, c.end);
            let dur = (c.end - c.ts) as u64;
            let (n, ns) = match ApiClass::of(&a.name) {
                ApiClass::Launch => (&mut rep.launches, &mut rep.launch_ns),
                ApiClass::Sync => (&mut rep.syncs, &mut rep.sync_ns),
                ApiClass::Alloc | ApiClass::Free => (&mut rep.allocs, &mut rep.alloc_ns),
                ApiClass::Other => (&mut other, &mut other_ns),
            };
            *n += 1;
            *ns += dur;
        }
        let args = [
            Arg {
                key: kineto::CORRELATION,
                value: ArgValue::U64(a.correlation.into()),
            },
            Arg {
                key: kineto::CBID,
                value: ArgValue::U64(a.detail.into()),
            },
        ];
        w.span(&Span {
            cat: category(a.kind),
            name: Text::Plain(&a.name),
            pid: c.pid,
            tid: c.tid,
            ts_ns: c.ts as u64,
            dur_ns: (c.end - c.ts) as u64,
            bind: None,
            args: &args,
        });
        rep.api_calls += 1;
    }
}

/// CUPTI's synchronization records (on the thread of the call that waited) and overhead
/// records (on the thread they name, or a per-device track named after the loop).
fn write_sync_and_overhead(
    input: &MergeInput,
    p: &Placement,
    named: &mut BTreeSet<u32>,
    w: &mut EventWriter,
    rep: &mut MergeReport,
) {
    let base = input.base_clock_ns as i64;
    let mut overhead_tracks: BTreeSet<u32> = BTreeSet::new();
    for a in &input.activities {
        let (ts, end) = (a.start as i64 - base, a.end as i64 - base);
        match a.kind {
            ActivityKind::Sync => {
                let Some(l) = p.launch_of.get(&a.correlation) else {
                    rep.left_out += 1;
                    continue;
                };
                let (ts, end) = (ts.max(l.ts), end.min(l.end).max(ts.max(l.ts)));
                let args = [
                    Arg {
                        key: kineto::CORRELATION,
                        value: ArgValue::U64(a.correlation.into()),
                    },
                    Arg {
                        key: kineto::STREAM,
                        value: ArgValue::U64(a.stream.into()),
                    },
                ];
                w.span(&Span {
                    cat: Category::CudaSync,
                    name: Text::Plain(&a.name),
                    pid: l.pid,
                    tid: l.tid,
                    ts_ns: ts as u64,
                    dur_ns: (end - ts) as u64,
                    bind: None,
                    args: &args,
                });
                rep.sync_records += 1;
            }
            ActivityKind::Overhead => {
                let end = end.max(ts);
                if ts < p.window.0 || ts > p.window.1 {
                    rep.left_out += 1;
                    continue;
                }
                let thread = p.known.get(&a.tid).or_else(|| p.foreign.get(&a.tid));
                let (pid, tid) = match thread {
                    Some(&t) if a.tid != 0 => (input.pid, t),
                    _ => {
                        if named.insert(a.device) {
                            name_device(w, a.device);
                        }
                        overhead_tracks.insert(a.device);
                        (a.device, OVERHEAD_TID)
                    }
                };
                w.span(&Span {
                    cat: Category::Overhead,
                    name: Text::Plain(&a.name),
                    pid,
                    tid,
                    ts_ns: ts as u64,
                    dur_ns: (end - ts) as u64,
                    bind: None,
                    args: &[],
                });
                rep.overhead_records += 1;
                rep.overhead_ns += (end - ts) as u64;
                if a.name == "Command Buffer Full" {
                    rep.command_buffer_full_ns += (end - ts) as u64;
                }
            }
            _ => {}
        }
    }
    for d in overhead_tracks {
        w.meta(&Meta::ThreadName {
            pid: d,
            tid: OVERHEAD_TID,
            name: "CUDA overhead",
        });
    }
}

/// One kernel, copy or set on its stream's track, with Kineto's args, and the flow from
/// its launch.
fn write_gpu_record(a: &Activity, g: &Gpu, track: u32, w: &mut EventWriter, rep: &mut MergeReport) {
    let ts = g.ts.max(0) as u64;
    let dur = (g.end - g.ts).max(0) as u64;
    let mut args: Vec<Arg<'_>> = vec![
        Arg {
            key: kineto::DEVICE,
            value: ArgValue::U64(a.device.into()),
        },
        Arg {
            key: kineto::CONTEXT,
            value: ArgValue::U64(a.context.into()),
        },
        Arg {
            key: kineto::STREAM,
            value: ArgValue::U64(a.stream.into()),
        },
        Arg {
            key: kineto::CORRELATION,
            value: ArgValue::U64(a.correlation.into()),
        },
    ];
    match a.kind {
        ActivityKind::Kernel => {
            rep.kernels += 1;
            args.extend([
                Arg {
                    key: kineto::REGISTERS,
                    value: ArgValue::I64(a.registers.into()),
                },
                Arg {
                    key: kineto::SHARED_MEMORY,
                    value: ArgValue::I64(i64::from(a.shared_static) + i64::from(a.shared_dynamic)),
                },
                Arg {
                    key: kineto::GRID,
                    value: ArgValue::Triple(a.grid.map(i64::from)),
                },
                Arg {
                    key: kineto::BLOCK,
                    value: ArgValue::Triple(a.block.map(i64::from)),
                },
            ]);
        }
        ActivityKind::Memcpy | ActivityKind::Memset => {
            if a.kind == ActivityKind::Memcpy {
                rep.memcpys += 1;
            } else {
                rep.memsets += 1;
            }
            args.push(Arg {
                key: kineto::BYTES,
                value: ArgValue::U64(a.bytes),
            });
            if dur > 0 {
                args.push(Arg {
                    key: kineto::BANDWIDTH,
                    value: ArgValue::F64(a.bytes as f64 / dur as f64),
                });
            }
        }
        _ => {}
    }
    w.span(&Span {
        cat: category(a.kind),
        name: Text::Plain(&a.name),
        pid: a.device,
        tid: track,
        ts_ns: ts,
        dur_ns: dur,
        bind: None,
        args: &args,
    });
    if let Some(l) = g.launch {
        for (dir, pid, tid, ts_ns) in [
            (FlowDir::Out, l.pid, l.tid, l.ts as u64),
            (FlowDir::In, a.device, track, ts),
        ] {
            w.flow(&Flow {
                dir,
                id: a.correlation.into(),
                pid,
                tid,
                ts_ns,
                cat: Category::Ac2g,
                name: kineto::AC2G,
            });
        }
        rep.flows += 1;
    }
}
