//! The hidden-state queue between target workers and the drafter worker: bounded,
//! blocking on both ends, with its depth visible, and with shutdown that propagates both
//! ways. When a producer fails, the consumer's next `get` returns that error; when the
//! consumer fails or stops, every blocked `put` returns at once.
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why the queue closed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueError {
    #[error("a target worker failed: {0}")]
    ProducerFailed(String),
    #[error("the drafter worker stopped: {0}")]
    ConsumerStopped(String),
}

/// Time spent blocked and the depth right after the operation.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    pub wait: Duration,
    pub depth: usize,
}

struct State<T> {
    items: VecDeque<T>,
    producers: usize,
    closed: Option<QueueError>,
}

/// A bounded multi-producer, single-consumer queue.
pub struct HiddenQueue<T> {
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

impl<T> HiddenQueue<T> {
    /// A queue of `capacity` items fed by `producers` producers.
    pub fn new(capacity: usize, producers: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::with_capacity(capacity),
                producers,
                closed: None,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        // a panic while holding the lock leaves plain data behind; keep going
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks while the queue is full. Fails once the queue is closed.
    pub fn put(&self, item: T) -> Result<OpInfo, QueueError> {
        let start = Instant::now();
        let mut st = self.lock();
        loop {
            if let Some(e) = &st.closed {
                return Err(e.clone());
            }
            if st.items.len() < self.capacity {
                break;
            }
            st = self.not_full.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.items.push_back(item);
        let depth = st.items.len();
        drop(st);
        self.not_empty.notify_one();
        Ok(OpInfo {
            wait: start.elapsed(),
            depth,
        })
    }

    /// Blocks while the queue is empty. `Ok(None)` when every producer finished and the
    /// queue is drained; `Err` when a producer failed.
    pub fn get(&self) -> Result<Option<(T, OpInfo)>, QueueError> {
        let start = Instant::now();
        let mut st = self.lock();
        loop {
            if let Some(e @ QueueError::ProducerFailed(_)) = &st.closed {
                return Err(e.clone());
            }
            if let Some(item) = st.items.pop_front() {
                let depth = st.items.len();
                drop(st);
                self.not_full.notify_one();
                return Ok(Some((
                    item,
                    OpInfo {
                        wait: start.elapsed(),
                        depth,
                    },
                )));
            }
            if st.producers == 0 || st.closed.is_some() {
                return Ok(None);
            }
            st = self.not_empty.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until an item is available or the queue is closed or finished, without
    /// taking anything; returns how long it waited. With a single consumer the next
    /// `get` then returns at once, so a trace can show the wait and the get apart.
    pub fn wait_ready(&self) -> Duration {
        let start = Instant::now();
        let mut st = self.lock();
        while st.items.is_empty() && st.closed.is_none() && st.producers > 0 {
            st = self.not_empty.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        start.elapsed()
    }

    /// A producer is done (normally).
    pub fn producer_done(&self) {
        let mut st = self.lock();
        st.producers = st.producers.saturating_sub(1);
        drop(st);
        self.not_empty.notify_all();
    }

    /// A producer failed: the consumer sees `error` at its next `get`.
    pub fn fail(&self, error: String) {
        self.close(QueueError::ProducerFailed(error));
    }

    /// The consumer stops: blocked and future `put`s fail.
    pub fn stop(&self, reason: String) {
        self.close(QueueError::ConsumerStopped(reason));
    }

    fn close(&self, e: QueueError) {
        let mut st = self.lock();
        if st.closed.is_none() {
            st.closed = Some(e);
        }
        st.items.clear();
        drop(st);
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    pub fn depth(&self) -> usize {
        self.lock().items.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn bounded_and_ordered() {
        let q = Arc::new(HiddenQueue::new(2, 1));
        let p = {
            let q = q.clone();
            thread::spawn(move || {
                for i in 0..10 {
                    let info = q.put(i).unwrap();
                    assert!(info.depth <= 2);
                }
                q.producer_done();
            })
        };
        let mut got = Vec::new();
        while let Some((v, _)) = q.get().unwrap() {
            got.push(v);
        }
        p.join().unwrap();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn producer_failure_reaches_a_blocked_consumer() {
        let q = Arc::new(HiddenQueue::<u32>::new(2, 1));
        let q2 = q.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            q2.fail("out of memory".into());
        });
        let start = Instant::now();
        let e = q.get().unwrap_err();
        assert_eq!(e, QueueError::ProducerFailed("out of memory".into()));
        assert!(start.elapsed() < Duration::from_secs(5));
        t.join().unwrap();
    }

    #[test]
    fn consumer_stop_releases_a_blocked_producer() {
        let q = Arc::new(HiddenQueue::new(1, 1));
        q.put(1).unwrap();
        let q2 = q.clone();
        let t = thread::spawn(move || q2.put(2));
        thread::sleep(Duration::from_millis(50));
        q.stop("loss is NaN".into());
        let r = t.join().unwrap();
        assert!(matches!(r, Err(QueueError::ConsumerStopped(m)) if m == "loss is NaN"));
    }
}
