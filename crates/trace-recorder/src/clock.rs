//! The recorder's clock: raw TSC ticks on the hot path (`quanta`'s raw counter, one
//! `rdtsc`), converted to nanoseconds only at export. Converting on the hot path would
//! cost about 25 ns per span more (see TRACE_NOTES.md). Where the CPU has no invariant
//! TSC, quanta falls back to the monotonic clock and raw values are already ns.
use std::sync::OnceLock;

static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

/// The process-wide clock. The first call calibrates the TSC against the monotonic clock
/// (up to ~200 ms, once per process); [`Recorder::start`](crate::Recorder::start) makes
/// that first call, so spans never pay for it.
pub(crate) fn clock() -> &'static quanta::Clock {
    CLOCK.get_or_init(quanta::Clock::new)
}

/// Raw ticks now.
#[inline(always)]
pub(crate) fn now() -> u64 {
    clock().raw()
}

/// Ticks to nanoseconds since the trace's time zero.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timebase {
    pub base_ticks: u64,
    /// Unix time of `base_ticks`, written as `baseTimeNanoseconds`.
    pub base_unix_ns: u128,
}

impl Timebase {
    pub(crate) fn now() -> Self {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Timebase {
            base_ticks: now(),
            base_unix_ns: unix,
        }
    }

    /// Nanoseconds from the base to `ticks`; 0 for ticks before the base.
    #[inline]
    pub(crate) fn ns(&self, ticks: u64) -> u64 {
        clock().delta_as_nanos(self.base_ticks, ticks)
    }
}

/// Nanoseconds between two raw readings (0 when `end <= start`).
pub(crate) fn delta_ns(start: u64, end: u64) -> u64 {
    clock().delta_as_nanos(start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_plausible_ns() {
        let tb = Timebase::now();
        let t0 = now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t1 = now();
        let d = tb.ns(t1) - tb.ns(t0);
        assert!((4_000_000..200_000_000).contains(&d), "{d}");
        assert_eq!(tb.ns(tb.base_ticks.saturating_sub(10)), 0);
    }
}
