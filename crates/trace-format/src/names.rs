//! Names and argument keys every trace of this format may carry, dflash's or Kineto's:
//! the step spans `ProfilerStep#N` and the keys a GPU span adds to its CPU span's args.
//! The trainer's own section names are in [`crate::dflash`].

/// The name of step spans before their number (Kineto's spelling).
pub const STEP: &str = "ProfilerStep";
/// What precedes the step number in a step span's name.
pub const STEP_PREFIX: &str = "ProfilerStep#";

/// `ProfilerStep#<n>`.
pub fn step_name(n: u64) -> String {
    format!("{STEP_PREFIX}{n}")
}

/// `ProfilerStep#12` -> 12; `None` for any other name.
pub fn parse_step(name: &str) -> Option<i64> {
    name.strip_prefix(STEP_PREFIX)?.parse().ok()
}

/// `args.step` of a GPU span: the step of the `ProfilerStep#N` span open on the thread
/// that launched it.
pub const STEP_ARG: &str = "step";
/// `args.cpu_ts` of a GPU span: the `ts` of its CPU span.
pub const CPU_TS_ARG: &str = "cpu_ts";
/// `args.correlation` of a kernel, memcpy or memset and of the runtime or driver call
/// that launched it (CUPTI's correlation id, as Kineto writes it): the launch-to-kernel
/// link.
pub const CORRELATION_ARG: &str = "correlation";

/// Kineto's allocator records (`profile_memory=True`): instant events of this name whose
/// args carry the allocator's totals after each allocation or free. A reader takes them
/// as counter samples.
pub const KINETO_MEMORY: &str = "[memory]";
/// Bytes handed out to tensors, after the event.
pub const MEMORY_ALLOCATED: &str = "Total Allocated";
/// Bytes the caching allocator holds from the device, after the event.
pub const MEMORY_RESERVED: &str = "Total Reserved";

/// Kineto's argument keys and names for CUDA activity, which the recorder's kernel
/// capture writes too (tools made for PyTorch traces read them).
pub mod kineto {
    pub const DEVICE: &str = "device";
    pub const CONTEXT: &str = "context";
    pub const STREAM: &str = "stream";
    pub const CORRELATION: &str = crate::names::CORRELATION_ARG;
    /// The CUPTI callback id of a runtime or driver call.
    pub const CBID: &str = "cbid";
    pub const REGISTERS: &str = "registers per thread";
    pub const SHARED_MEMORY: &str = "shared memory";
    pub const GRID: &str = "grid";
    pub const BLOCK: &str = "block";
    pub const BYTES: &str = "bytes";
    /// Of a copy or set: bytes per ns, that is GB/s.
    pub const BANDWIDTH: &str = "memory bandwidth (GB/s)";
    /// The name and category of launch-to-kernel flows.
    pub const AC2G: &str = "ac2g";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_round_trip() {
        assert_eq!(step_name(12), "ProfilerStep#12");
        assert_eq!(parse_step(&step_name(12)), Some(12));
        assert_eq!(parse_step("ProfilerStep#"), None);
        assert_eq!(parse_step("ProfilerStep#x"), None);
        assert_eq!(parse_step("ProfilerStep"), None);
        assert_eq!(parse_step("drafter.step"), None);
    }
}
