//! The names the dflash trainer writes and the analyzer looks for: its sections, the
//! envelope span whose children are a step's top level, the queue's spans, counter and
//! `queue.` prefix, its argument keys, and the `metadata` values that say a trace is
//! ours. docs/trace-format.md lists the same names with the threads that write them.

/// `metadata.producer` of a dflash trace.
pub const PRODUCER: &str = "dflash";
/// `metadata.format` of this version of the format.
pub const FORMAT: &str = "dflash-trace/1";

/// Target worker: the frozen target's forward pass, and the hidden states it taps.
pub const TARGET_FORWARD: &str = "target.forward";
pub const TARGET_EXTRACT: &str = "target.extract";
/// The target worker's sections, in the order they run.
pub const TARGET_SECTIONS: [&str; 2] = [TARGET_FORWARD, TARGET_EXTRACT];

/// Queue spans (`cat:"queue"`): a put, a get, and the wait before a get.
pub const QUEUE_PUT: &str = "queue.put";
pub const QUEUE_GET: &str = "queue.get";
pub const QUEUE_WAIT: &str = "queue.wait";
/// What every queue span's name starts with.
pub const QUEUE_PREFIX: &str = "queue.";
/// The queue counter and its key.
pub const QUEUE_COUNTER: &str = "queue";
pub const QUEUE_DEPTH: &str = "depth";

/// The drafter's step: an envelope around its sections, with `step`, `tokens`, `loss`.
pub const DRAFTER_STEP: &str = "drafter.step";
/// Reading the step's metrics back (a CPU span after the sections).
pub const DRAFTER_METRICS: &str = "drafter.metrics";
pub const DRAFTER_PREFIX: &str = "drafter.";

pub const DRAFTER_H2D: &str = "drafter.h2d";
pub const DRAFTER_ANCHORS: &str = "drafter.anchors";
pub const DRAFTER_NOISE_EMBED: &str = "drafter.noise_embed";
pub const DRAFTER_ROPE: &str = "drafter.rope";
pub const DRAFTER_MASK: &str = "drafter.mask";
pub const DRAFTER_FC: &str = "drafter.fc";
pub const DRAFTER_NORM: &str = "drafter.norm";
pub const DRAFTER_LM_HEAD_LOSS: &str = "drafter.lm_head_loss";
pub const DRAFTER_BACKWARD: &str = "drafter.backward";
pub const DRAFTER_CLIP: &str = "drafter.clip";
pub const DRAFTER_OPTIMIZER: &str = "drafter.optimizer";

/// The drafter's sections directly inside [`DRAFTER_STEP`], in the order they run; the
/// layers ([`layer`]) run between [`DRAFTER_FC`] and [`DRAFTER_NORM`].
pub const DRAFTER_SECTIONS: [&str; 11] = [
    DRAFTER_H2D,
    DRAFTER_ANCHORS,
    DRAFTER_NOISE_EMBED,
    DRAFTER_ROPE,
    DRAFTER_MASK,
    DRAFTER_FC,
    DRAFTER_NORM,
    DRAFTER_LM_HEAD_LOSS,
    DRAFTER_BACKWARD,
    DRAFTER_CLIP,
    DRAFTER_OPTIMIZER,
];

pub const LAYER_PREFIX: &str = "drafter.layer.";

/// `drafter.layer.<i>`, with [`layer_attn`] and [`layer_mlp`] inside.
pub fn layer(i: usize) -> String {
    format!("{LAYER_PREFIX}{i}")
}

pub fn layer_attn(i: usize) -> String {
    format!("{LAYER_PREFIX}{i}.attn")
}

pub fn layer_mlp(i: usize) -> String {
    format!("{LAYER_PREFIX}{i}.mlp")
}

/// Spans that only envelop the sections of a step: their children are top-level.
pub const ENVELOPES: &[&str] = &[DRAFTER_STEP];

pub fn is_envelope(name: &str) -> bool {
    ENVELOPES.contains(&name)
}

/// A queue span (`queue.put`, `queue.get`, `queue.wait`): time one side waited for the
/// other, not work of its own.
pub fn is_queue(name: &str) -> bool {
    name.starts_with(QUEUE_PREFIX)
}

/// A drafter section outside the layers: `drafter.<word>`, the envelope aside.
pub fn is_drafter_section(name: &str) -> bool {
    name.starts_with(DRAFTER_PREFIX) && name.matches('.').count() == 1 && !is_envelope(name)
}

/// Counter written after each traced step on CUDA: the caching allocator of the
/// drafter's device (keys [`args::ALLOCATED_BYTES`] .. [`args::OOMS`]; the counts are
/// per-step deltas).
pub const CUDA_ALLOCATOR: &str = "cuda.allocator";
/// Counter written after each traced step on CUDA: host syncs the trainer's own code
/// made during the step, all threads ([`args::SYNCS`]).
pub const CUDA_HOST_SYNCS: &str = "cuda.host_syncs";

/// Argument keys of the trainer's spans and counters.
pub mod args {
    /// `drafter.step`: its step number, tokens trained on, and loss.
    pub const STEP: &str = crate::names::STEP_ARG;
    pub const TOKENS: &str = "tokens";
    pub const LOSS: &str = "loss";
    /// Queue spans: time blocked (us), depth after the operation, batch number.
    pub const WAIT_US: &str = "wait_us";
    pub const DEPTH: &str = "depth";
    pub const BATCH: &str = "batch";
    /// [`super::CUDA_ALLOCATOR`]: bytes now, and device allocations, frees, retries and
    /// OOMs during the step.
    pub const ALLOCATED_BYTES: &str = "allocated_bytes";
    pub const RESERVED_BYTES: &str = "reserved_bytes";
    pub const DEVICE_ALLOCS: &str = "device_allocs";
    pub const DEVICE_FREES: &str = "device_frees";
    pub const ALLOC_RETRIES: &str = "alloc_retries";
    pub const OOMS: &str = "ooms";
    /// [`super::CUDA_HOST_SYNCS`].
    pub const SYNCS: &str = "syncs";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_distinct_drafter_names() {
        let mut all: Vec<&str> = DRAFTER_SECTIONS.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), DRAFTER_SECTIONS.len());
        assert!(DRAFTER_SECTIONS.iter().all(|s| is_drafter_section(s)));
        assert!(is_drafter_section(DRAFTER_METRICS));
        assert!(!is_drafter_section(DRAFTER_STEP));
        assert!(!is_drafter_section(&layer(0)));
        assert!(!is_drafter_section(QUEUE_GET));
        assert_eq!(layer_attn(3), "drafter.layer.3.attn");
        assert_eq!(layer_mlp(0), "drafter.layer.0.mlp");
    }

    #[test]
    fn envelope_and_queue_rules() {
        assert!(is_envelope("drafter.step"));
        assert!(!is_envelope("drafter.fc"));
        for q in [QUEUE_PUT, QUEUE_GET, QUEUE_WAIT] {
            assert!(is_queue(q), "{q}");
        }
        assert!(!is_queue(QUEUE_COUNTER));
        assert!(!is_queue("queued.x"));
    }
}
