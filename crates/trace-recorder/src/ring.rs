//! A bounded single-producer single-consumer ring of [`Slot`]s: one per recording thread,
//! written by that thread and drained by the writer. Positions are free-running counters
//! over a power-of-two buffer, and the producer caches the consumer's position, so a push
//! that finds room is a slot copy, an add and one release store.
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::event::{Arg, GpuPart, Head, Slot};

/// Keeps the two positions on separate cache lines, so that the producer's stores do not
/// invalidate the line the consumer polls and vice versa.
#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    /// Slots read so far (written by the consumer).
    head: Padded<AtomicUsize>,
    /// Slots published so far (written by the producer).
    tail: Padded<AtomicUsize>,
    producer_gone: AtomicBool,
    buf: Box<[UnsafeCell<MaybeUninit<Slot>>]>,
}

// SAFETY: a slot is written only by the producer while it lies in [tail, head + cap),
// and read only by the consumer once published (below `tail`); the positions order the
// two with release/acquire.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub(crate) struct Producer {
    shared: Arc<Shared>,
    buf: *mut Slot,
    mask: usize,
    tail: usize,
    /// The consumer's position as last seen; refreshed only when the ring looks full.
    head: usize,
}

// SAFETY: `buf` points into `shared`, which the producer keeps alive.
unsafe impl Send for Producer {}

pub(crate) struct Consumer {
    shared: Arc<Shared>,
    head: usize,
}

/// A ring of `capacity` slots (rounded up to a power of two).
pub(crate) fn ring(capacity: usize) -> (Producer, Consumer) {
    let cap = capacity.max(2).next_power_of_two();
    let buf: Box<[UnsafeCell<MaybeUninit<Slot>>]> = (0..cap)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let shared = Arc::new(Shared {
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
        producer_gone: AtomicBool::new(false),
        buf,
    });
    let p = Producer {
        buf: shared.buf.as_ptr() as *mut Slot,
        shared: shared.clone(),
        mask: cap - 1,
        tail: 0,
        head: 0,
    };
    (p, Consumer { shared, head: 0 })
}

impl Producer {
    /// Whether `n` more slots fit.
    #[inline(always)]
    fn room(&mut self, n: usize) -> bool {
        if self.tail.wrapping_sub(self.head) + n <= self.mask + 1 {
            return true;
        }
        self.head = self.shared.head.0.load(Ordering::Acquire);
        self.tail.wrapping_sub(self.head) + n <= self.mask + 1
    }

    /// Publishes one slot; false (nothing written) when the ring is full.
    #[inline(always)]
    pub(crate) fn push(&mut self, s: Slot) -> bool {
        if !self.room(1) {
            return false;
        }
        // SAFETY: the slot at `tail` is free (room checked) and only we write it.
        unsafe { self.buf.add(self.tail & self.mask).write(s) };
        self.tail = self.tail.wrapping_add(1);
        self.shared.tail.0.store(self.tail, Ordering::Release);
        true
    }

    /// Publishes an event's head, its args and its GPU half at once, written straight
    /// into their slots, or nothing when they do not fit.
    pub(crate) fn push_event(&mut self, head: Head, args: &[Arg], gpu: Option<GpuPart>) -> bool {
        if !self.room(1 + args.len() + usize::from(gpu.is_some())) {
            return false;
        }
        let mut t = self.tail;
        // SAFETY: as in `push`, for each of the free slots counted by `room`.
        unsafe {
            self.buf.add(t & self.mask).write(Slot::Head(head));
            t = t.wrapping_add(1);
            for a in args {
                self.buf.add(t & self.mask).write(Slot::Arg(*a));
                t = t.wrapping_add(1);
            }
            if let Some(g) = gpu {
                self.buf.add(t & self.mask).write(Slot::Gpu(g));
                t = t.wrapping_add(1);
            }
        }
        self.tail = t;
        self.shared.tail.0.store(t, Ordering::Release);
        true
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.shared.producer_gone.store(true, Ordering::Release);
    }
}

impl Consumer {
    /// Slots published and not yet read.
    pub(crate) fn slots(&self) -> usize {
        self.shared
            .tail
            .0
            .load(Ordering::Acquire)
            .wrapping_sub(self.head)
    }

    pub(crate) fn pop(&mut self) -> Option<Slot> {
        if self.slots() == 0 {
            return None;
        }
        let mask = self.shared.buf.len() - 1;
        // SAFETY: published (below the acquired tail) and not yet released to the
        // producer; `Slot` is `Copy`.
        let s = unsafe { (*self.shared.buf[self.head & mask].get()).assume_init() };
        self.head = self.head.wrapping_add(1);
        self.shared.head.0.store(self.head, Ordering::Release);
        Some(s)
    }

    /// The producer's thread has exited (its thread-local state was dropped).
    pub(crate) fn is_abandoned(&self) -> bool {
        self.shared.producer_gone.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Arg, Head, Kind};
    use crate::names::Name;
    use chrome_trace_format::ArgValue;

    fn head(i: u64) -> Slot {
        let mut h = Head::new(Name(0), Kind::Cpu);
        h.start = i;
        Slot::Head(h)
    }

    fn start(s: Slot) -> u64 {
        match s {
            Slot::Head(h) => h.start,
            _ => u64::MAX,
        }
    }

    #[test]
    fn fifo_bounded_and_all_or_nothing() {
        let (mut p, mut c) = ring(5);
        assert_eq!(p.mask, 7);
        for i in 0..8 {
            assert!(p.push(head(i)));
        }
        assert!(!p.push(head(8)), "full");
        assert_eq!(c.slots(), 8);
        assert_eq!(c.pop().map(start), Some(0));
        assert_eq!(c.pop().map(start), Some(1));
        let arg = Arg {
            key: "k",
            value: ArgValue::I64(1),
        };
        let Slot::Head(h9) = head(9) else {
            unreachable!()
        };
        assert!(!p.push_event(h9, &[arg, arg], None), "3 do not fit in 2");
        assert_eq!(c.slots(), 6);
        assert!(p.push_event(h9, &[arg], None));
        let got: Vec<u64> = std::iter::from_fn(|| c.pop()).map(start).collect();
        assert_eq!(got, vec![2, 3, 4, 5, 6, 7, 9, u64::MAX]);
        assert!(c.pop().is_none());
        assert!(!c.is_abandoned());
        drop(p);
        assert!(c.is_abandoned());
    }

    #[test]
    fn wraps_many_times_across_threads_in_order() {
        let (mut p, mut c) = ring(64);
        let n = 200_000u64;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                if p.push(head(i)) {
                    i += 1;
                }
            }
        });
        let mut next = 0;
        while next < n {
            if let Some(s) = c.pop() {
                assert_eq!(start(s), next);
                next += 1;
            }
        }
        t.join().unwrap();
        assert!(c.is_abandoned() && c.slots() == 0);
    }
}
