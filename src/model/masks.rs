//! The drafter's block attention mask and its layouts: the dense `Q x (S + Q)` mask, the
//! query groups that attend only to the context their anchors reach, and the batched
//! groups that one attention call computes. Re-exported by [`super::objective`].
use tch::{Kind, Tensor};

/// The dense block mask `[B, 1, Q, S + Q]`, `Q = N * bs`. Query `q` of block `bq` with
/// offset `oq` and anchor `a` may see key `kv` when
/// `(kv < S && kv < a) || (kv >= S && (kv - S) / bs == bq)`, the block is kept, and on
/// sliding layers `kv >= a + oq - (window - 1)`. Rows of unused slots would be empty
/// (NaN in some attention kernels), so they see their own block instead; their loss weight
/// is zero.
pub fn block_mask(
    anchors: &Tensor,
    keep: &Tensor,
    seq_len: i64,
    block_size: i64,
    window: Option<i64>,
) -> Tensor {
    let (b, n) = (anchors.size()[0], anchors.size()[1]);
    let q_len = n * block_size;
    let kv = Tensor::arange(seq_len + q_len, (Kind::Int64, anchors.device())).view([1, -1]);
    allow_mask(anchors, keep, seq_len, block_size, window, &kv).view([b, 1, q_len, seq_len + q_len])
}

/// [`block_mask`] evaluated at chosen keys: `kv` `[G, K]` holds, for each of `G` equal
/// query groups (group `g` is queries `[g * Q / G, (g + 1) * Q / G)`), the key indices
/// (into the `S + Q` keys) its columns stand for. Returns `[B, G, Q / G, K]` (bool).
fn allow_mask(
    anchors: &Tensor,
    keep: &Tensor,
    seq_len: i64,
    block_size: i64,
    window: Option<i64>,
    kv: &Tensor,
) -> Tensor {
    let (b, n) = (anchors.size()[0], anchors.size()[1]);
    let g = kv.size()[0];
    let q_len = n * block_size;
    let len = q_len / g;
    let dev = anchors.device();
    // 1. per query: its block, offset, anchor and keep flag, (B | 1, G, len, 1)
    let q = Tensor::arange(q_len, (Kind::Int64, dev)).view([1, g, len, 1]);
    let bq = q.divide_scalar_mode(block_size, "floor");
    let oq = q.remainder(block_size);
    let a = anchors
        .repeat_interleave_self_int(block_size, 1, None)
        .view([b, g, len, 1]);
    let kept = keep
        .repeat_interleave_self_int(block_size, 1, None)
        .view([b, g, len, 1]);
    // 2. per key, (1, G, 1, K)
    let kv = kv.view([1, g, 1, -1]);
    let ctx = kv.lt(seq_len).logical_and(&kv.lt_tensor(&a));
    let kv_block = (&kv - seq_len).divide_scalar_mode(block_size, "floor");
    let draft = kv.ge(seq_len).logical_and(&kv_block.eq_tensor(&bq));
    let mut allow = ctx.logical_or(&draft);
    if let Some(w) = window {
        let lo = &a + oq - (w - 1);
        allow = allow.logical_and(&kv.ge_tensor(&lo));
    }
    let allow = allow.logical_and(&kept);
    // 3. unused slots attend to their own block only
    allow.logical_or(&draft.logical_and(&kept.logical_not()))
}

/// `0` where `allow`, `-inf` elsewhere, in `kind`: one kernel.
fn additive(allow: &Tensor, kind: Kind) -> Tensor {
    let opts = (kind, allow.device());
    Tensor::scalar_tensor(0.0, opts)
        .where_self(allow, &Tensor::scalar_tensor(f64::NEG_INFINITY, opts))
}

/// A group of query blocks that attend together: queries `[q0, q0 + len)` and, as keys,
/// the first `ctx` context positions followed by the group's own block keys
/// (`[S + q0, S + q0 + len)`). No query of the group may see a key outside them, so
/// attention over a group's keys equals attention over all `S + Q` keys under the dense
/// block mask: masked keys add exactly zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryGroup {
    pub q0: i64,
    pub len: i64,
    pub ctx: i64,
}

impl QueryGroup {
    /// The group's keys along `dim` of `t` (all `S + Q` keys there): the first `ctx`
    /// context keys and the group's own block keys; `t` itself, uncopied, when the group
    /// is every key (the dense mask).
    pub fn keys_of(&self, t: &Tensor, seq_len: i64, dim: i64) -> Tensor {
        if self.q0 == 0 && self.ctx == seq_len && seq_len + self.len == t.size()[dim as usize] {
            t.shallow_clone()
        } else {
            Tensor::cat(
                &[
                    t.narrow(dim, 0, self.ctx),
                    t.narrow(dim, seq_len + self.q0, self.len),
                ],
                dim,
            )
        }
    }
}

/// Splits the `N` blocks into groups of `group_blocks` and gives each group the context
/// width its queries need: the largest kept anchor in the group over the batch (a query
/// sees context keys `kv < anchor`), rounded up so that the group's key count is a
/// multiple of [`key_bucket`]`(S)`, at most `S`. The coarse rounding keeps the number of
/// distinct attention shapes small (at most 9 key widths per group position, whatever the
/// anchors): cuDNN builds an execution plan for every new shape, on the host, while the GPU
/// waits, and reuses it after that.
/// `anchors`/`keep` are the host's `[B, N]` values, row-major. `group_blocks` 0 gives the
/// reference: one group over every key (the dense mask).
///
/// Why: the dense mask is `Q x (S + Q)`, but a query block sees at most its anchor's
/// prefix and its own `bs` keys. On the realistic shape (S 2048, 256 blocks of 16) the
/// dense attention computes 6144 keys per query; groups of 32 blocks over sorted anchors
/// compute about 1700 on average.
pub fn query_groups(
    anchors: &[i64],
    keep: &[bool],
    num_blocks: i64,
    seq_len: i64,
    block_size: i64,
    group_blocks: i64,
) -> Vec<QueryGroup> {
    if group_blocks == 0 {
        return vec![QueryGroup {
            q0: 0,
            len: num_blocks * block_size,
            ctx: seq_len,
        }];
    }
    let n = num_blocks.max(1) as usize;
    let per = group_blocks.clamp(1, num_blocks.max(1)) as usize;
    let rows = anchors.len() / n;
    (0..n)
        .step_by(per)
        .map(|first| {
            let last = (first + per).min(n);
            let need = (0..rows)
                .flat_map(|r| (first..last).map(move |j| r * n + j))
                .filter(|&i| keep[i])
                .map(|i| anchors[i])
                .max()
                .unwrap_or(0)
                .clamp(0, seq_len);
            let len = (last - first) as i64 * block_size;
            let align = key_bucket(seq_len);
            let ctx = ((need + len + align - 1) / align * align - len).clamp(need, seq_len);
            QueryGroup {
                q0: first as i64 * block_size,
                len,
                ctx,
            }
        })
        .collect()
}

/// The granule of a query group's key count: an eighth of the sequence, rounded up to a
/// multiple of 16 (the alignment of the fused attention kernels' masks), at least 16. On
/// the realistic shape (S 2048) a group's keys are a multiple of 256.
pub fn key_bucket(seq_len: i64) -> i64 {
    ((seq_len.max(1) + 7) / 8 + 15) / 16 * 16
}

/// The dense mask's rows and columns of each group (`[B, 1, len, ctx + len]`), as an
/// additive mask of `kind` (0 where allowed, -inf elsewhere) that every layer reuses.
pub fn group_masks(full: &Tensor, groups: &[QueryGroup], seq_len: i64, kind: Kind) -> GroupedMask {
    let groups = groups
        .iter()
        .map(|g| {
            let rows = full.narrow(2, g.q0, g.len);
            let allow = g.keys_of(&rows, seq_len, 3);
            (*g, additive(&allow, kind))
        })
        .collect();
    GroupedMask {
        seq_len,
        groups,
        batch: 0,
    }
}

/// The dense mask `[B, 1, Q, S + Q]` for attention in batched groups of `len` queries
/// (`Q` a multiple of `len`, `G = Q / len` groups): group `g`'s queries see all `S` context
/// keys and their own `len` block keys, and the `G` groups stack into the batch dimension,
/// `[B * G, 1, len, S + len]` (row `b * G + g`), additive in `kind`. Every group has one
/// shape, so one attention call computes them all: on the realistic shape (S 2048, Q 4096,
/// groups of 512) 42% of the dense mask's `(query, key)` pairs, with none of the per-group
/// calls of [`group_masks`]. This cuts the groups out of a dense mask that exists; the
/// training step builds them directly with [`batched_block_mask`].
pub fn batched_mask(full: &Tensor, seq_len: i64, len: i64, kind: Kind) -> GroupedMask {
    let (b, q) = (full.size()[0], full.size()[2]);
    let g = q / len;
    assert_eq!(g * len, q, "{q} queries do not split into groups of {len}");
    // context columns: [B, 1, G, len, S]
    let ctx = full.narrow(3, 0, seq_len).reshape([b, 1, g, len, seq_len]);
    // the diagonal blocks of the block columns: [B, 1, G, len, G, len] -> [B, 1, G, len, len]
    let own = full
        .narrow(3, seq_len, q)
        .reshape([b, 1, g, len, g, len])
        .diagonal(0, 2, 4)
        .permute([0, 1, 4, 2, 3]);
    let allow = Tensor::cat(&[ctx, own], 4)
        .permute([0, 2, 1, 3, 4])
        .reshape([b * g, 1, len, seq_len + len]);
    batched(additive(&allow, kind), seq_len, q, len)
}

/// [`batched_mask`] of [`block_mask`]`(anchors, keep, seq_len, block_size, window)`,
/// computed at the batched layout's `(query, key)` pairs only (42% of the dense mask's on
/// the realistic shape) instead of cut out of the dense mask.
pub fn batched_block_mask(
    anchors: &Tensor,
    keep: &Tensor,
    seq_len: i64,
    block_size: i64,
    window: Option<i64>,
    len: i64,
    kind: Kind,
) -> GroupedMask {
    let (b, n) = (anchors.size()[0], anchors.size()[1]);
    let q = n * block_size;
    let g = q / len;
    assert_eq!(g * len, q, "{q} queries do not split into groups of {len}");
    let dev = anchors.device();
    // group g's columns: the S context keys, then its own block keys S + g * len + j
    let ctx = Tensor::arange(seq_len, (Kind::Int64, dev)).expand([g, seq_len], false);
    let own = Tensor::arange(q, (Kind::Int64, dev)).view([g, len]) + seq_len;
    let kv = Tensor::cat(&[ctx, own], 1);
    let allow = allow_mask(anchors, keep, seq_len, block_size, window, &kv).view([
        b * g,
        1,
        len,
        seq_len + len,
    ]);
    batched(additive(&allow, kind), seq_len, q, len)
}

fn batched(add: Tensor, seq_len: i64, q: i64, len: i64) -> GroupedMask {
    GroupedMask {
        seq_len,
        groups: vec![(
            QueryGroup {
                q0: 0,
                len: q,
                ctx: seq_len,
            },
            add,
        )],
        batch: len,
    }
}

/// Blocks per batched group for `num_blocks` blocks and at most `want` per group: the
/// largest divisor of `num_blocks` not above `want` (the groups must tile the blocks), at
/// least 1.
pub fn batch_blocks(num_blocks: i64, want: i64) -> i64 {
    (1..=want.clamp(1, num_blocks.max(1)))
        .rev()
        .find(|d| num_blocks % d == 0)
        .unwrap_or(1)
}

/// A layer's attention mask, group by group (see [`QueryGroup`]).
#[derive(Debug)]
pub struct GroupedMask {
    pub seq_len: i64,
    pub groups: Vec<(QueryGroup, Tensor)>,
    /// 0: the groups as listed. `len > 0`: batched groups of `len` queries ([`batched_mask`]):
    /// one entry over all queries, whose mask is `[B * Q / len, 1, len, S + len]`.
    pub batch: i64,
}
