//! What a span is: its `cat` as written ([`Category`]: ours and Kineto's), the kind a
//! reader makes of it ([`SpanKind`]) and the clock that timed it ([`Clock`]). This is
//! where the Kineto dialect is mapped onto ours: `user_annotation` is a CPU section like
//! our `cpu`, `gpu_user_annotation` a GPU section like our `gpu`, and so on.
use std::fmt;

use serde::{Deserialize, Serialize};

/// A span's or counter's `cat`. dflash writes [`Cpu`](Self::Cpu), [`Gpu`](Self::Gpu),
/// [`Queue`](Self::Queue) and [`Step`](Self::Step); the others are Kineto's (PyTorch
/// profiler). A `cat` not listed here reads as [`Unknown`](Self::Unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// A section timed on the CPU clock.
    Cpu,
    /// A section timed by GPU events, on the GPU's track.
    Gpu,
    /// `queue.put` / `queue.get` / `queue.wait`, and the queue counter.
    Queue,
    /// `ProfilerStep#N`.
    Step,
    /// Kineto: an operator (`aten::mm`).
    CpuOp,
    /// Kineto: a `record_function` range on the CPU.
    UserAnnotation,
    /// Kineto: the GPU side of a `record_function` range.
    GpuUserAnnotation,
    /// Kineto: a GPU kernel.
    Kernel,
    GpuMemcpy,
    GpuMemset,
    /// Kineto: a CUDA runtime call (`cudaLaunchKernel`).
    CudaRuntime,
    /// Kineto: a CUDA driver call (`cuLaunchKernel`).
    CudaDriver,
    /// Kineto: CUPTI's record of a host wait on the GPU ("Stream Sync", "Event Sync"),
    /// inside the call that waited.
    CudaSync,
    /// Kineto: time the driver or CUPTI spent on its own account ("Command Buffer Full").
    Overhead,
    /// Kineto: a Python frame (with stack tracing on).
    PythonFunction,
    /// Kineto: a launch-to-kernel flow (`s`/`f` events).
    Ac2g,
    /// Any other `cat`, or none.
    Unknown,
}

impl Category {
    /// Every category with a name, in declaration order.
    pub const KNOWN: [Category; 16] = [
        Category::Cpu,
        Category::Gpu,
        Category::Queue,
        Category::Step,
        Category::CpuOp,
        Category::UserAnnotation,
        Category::GpuUserAnnotation,
        Category::Kernel,
        Category::GpuMemcpy,
        Category::GpuMemset,
        Category::CudaRuntime,
        Category::CudaDriver,
        Category::CudaSync,
        Category::Overhead,
        Category::PythonFunction,
        Category::Ac2g,
    ];

    /// The `cat` string; `""` for [`Unknown`](Self::Unknown) (as a reader sees an event
    /// without `cat`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Cpu => "cpu",
            Category::Gpu => "gpu",
            Category::Queue => "queue",
            Category::Step => "step",
            Category::CpuOp => "cpu_op",
            Category::UserAnnotation => "user_annotation",
            Category::GpuUserAnnotation => "gpu_user_annotation",
            Category::Kernel => "kernel",
            Category::GpuMemcpy => "gpu_memcpy",
            Category::GpuMemset => "gpu_memset",
            Category::CudaRuntime => "cuda_runtime",
            Category::CudaDriver => "cuda_driver",
            Category::CudaSync => "cuda_sync",
            Category::Overhead => "overhead",
            Category::PythonFunction => "python_function",
            Category::Ac2g => "ac2g",
            Category::Unknown => "",
        }
    }

    pub fn parse(cat: &str) -> Category {
        Category::KNOWN
            .into_iter()
            .find(|c| c.as_str() == cat)
            .unwrap_or(Category::Unknown)
    }

    /// What a reader makes of a span of this category.
    pub const fn kind(self) -> SpanKind {
        match self {
            Category::Cpu | Category::UserAnnotation => SpanKind::Cpu,
            Category::Gpu | Category::GpuUserAnnotation => SpanKind::Gpu,
            Category::Queue => SpanKind::Queue,
            Category::Step => SpanKind::Step,
            Category::Kernel | Category::GpuMemcpy | Category::GpuMemset => SpanKind::Kernel,
            Category::CpuOp => SpanKind::Op,
            Category::CudaRuntime | Category::CudaDriver => SpanKind::Runtime,
            Category::CudaSync
            | Category::Overhead
            | Category::PythonFunction
            | Category::Ac2g
            | Category::Unknown => SpanKind::Other,
        }
    }

    /// The clock that timed a span of this category.
    pub const fn clock(self) -> Clock {
        self.kind().clock()
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a span is to a reader (the analyzer's `kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpanKind {
    /// A section timed on the CPU (ours: `cat:"cpu"`; Kineto: `user_annotation`).
    Cpu,
    /// A section timed on the GPU (ours: `cat:"gpu"`; Kineto: `gpu_user_annotation`).
    Gpu,
    /// `queue.put` / `queue.get`.
    Queue,
    /// `ProfilerStep#N`.
    Step,
    /// A GPU kernel, memcpy or memset (Kineto).
    Kernel,
    /// An operator (Kineto `cpu_op`).
    Op,
    /// A CUDA runtime or driver call (Kineto).
    Runtime,
    Other,
}

impl SpanKind {
    pub const ALL: [SpanKind; 8] = [
        SpanKind::Cpu,
        SpanKind::Gpu,
        SpanKind::Queue,
        SpanKind::Step,
        SpanKind::Kernel,
        SpanKind::Op,
        SpanKind::Runtime,
        SpanKind::Other,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            SpanKind::Cpu => "cpu",
            SpanKind::Gpu => "gpu",
            SpanKind::Queue => "queue",
            SpanKind::Step => "step",
            SpanKind::Kernel => "kernel",
            SpanKind::Op => "op",
            SpanKind::Runtime => "runtime",
            SpanKind::Other => "other",
        }
    }

    /// The kind of a span with this `cat` (Kineto's categories mapped onto ours).
    pub fn of_cat(cat: &str) -> SpanKind {
        Category::parse(cat).kind()
    }

    /// The clock a span of this kind was timed on.
    pub const fn clock(self) -> Clock {
        match self {
            SpanKind::Gpu | SpanKind::Kernel => Clock::Gpu,
            _ => Clock::Cpu,
        }
    }
}

impl fmt::Display for SpanKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which clock timed a span: the host's (wall time of the launching thread) or the
/// GPU's. Serialized as `"cpu"` / `"gpu"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    Cpu,
    Gpu,
}

impl Clock {
    pub const ALL: [Clock; 2] = [Clock::Cpu, Clock::Gpu];

    pub const fn as_str(self) -> &'static str {
        match self {
            Clock::Cpu => "cpu",
            Clock::Gpu => "gpu",
        }
    }

    pub fn parse(s: &str) -> Option<Clock> {
        Clock::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// A clock equals its serialized string: `Clock::Cpu == "cpu"`.
impl PartialEq<&str> for Clock {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for Clock {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl fmt::Display for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_round_trip_and_map_kineto_onto_ours() {
        for c in Category::KNOWN {
            assert_eq!(Category::parse(c.as_str()), c);
        }
        assert_eq!(
            Category::parse("gpu_user_annotation"),
            Category::GpuUserAnnotation
        );
        assert_eq!(Category::parse("nonsense"), Category::Unknown);
        assert_eq!(Category::parse(""), Category::Unknown);
        let kinds: Vec<(&str, &str, &str)> = [
            "cpu",
            "user_annotation",
            "gpu",
            "gpu_user_annotation",
            "queue",
            "step",
            "kernel",
            "gpu_memcpy",
            "gpu_memset",
            "cpu_op",
            "cuda_runtime",
            "cuda_driver",
            "python_function",
            "ac2g",
            "whatever",
        ]
        .into_iter()
        .map(|c| {
            (
                c,
                SpanKind::of_cat(c).as_str(),
                SpanKind::of_cat(c).clock().as_str(),
            )
        })
        .collect();
        assert_eq!(
            kinds,
            [
                ("cpu", "cpu", "cpu"),
                ("user_annotation", "cpu", "cpu"),
                ("gpu", "gpu", "gpu"),
                ("gpu_user_annotation", "gpu", "gpu"),
                ("queue", "queue", "cpu"),
                ("step", "step", "cpu"),
                ("kernel", "kernel", "gpu"),
                ("gpu_memcpy", "kernel", "gpu"),
                ("gpu_memset", "kernel", "gpu"),
                ("cpu_op", "op", "cpu"),
                ("cuda_runtime", "runtime", "cpu"),
                ("cuda_driver", "runtime", "cpu"),
                ("python_function", "other", "cpu"),
                ("ac2g", "other", "cpu"),
                ("whatever", "other", "cpu"),
            ]
        );
    }

    #[test]
    fn clocks_and_kinds_serialize_as_their_strings() {
        for c in Clock::ALL {
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
            assert_eq!(Clock::parse(c.as_str()), Some(c));
            let back: Clock = serde_json::from_str(&format!("\"{c}\"")).unwrap();
            assert_eq!(back, c);
        }
        assert_eq!(Clock::parse("tpu"), None);
        assert!(Clock::Cpu == "cpu" && Clock::Gpu != "cpu" && Clock::Gpu == *"gpu");
        for k in SpanKind::ALL {
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{k}\""));
        }
    }
}
