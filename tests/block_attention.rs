//! Grouped block attention: each query group attends only to the context its anchors
//! reach and to its own blocks. Checked against the dense `Q x (S + Q)` mask (one group
//! over every key), outputs and gradients, on full and sliding layers, with unused slots.
use dflash::model::layers::Rope;
use dflash::model::objective::{self, QueryGroup};
use dflash::model::{Drafter, DrafterConfig, LayerType, Qwen3Config};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{nn, Device, Kind, Tensor};

const S: i64 = 40;
const BS: i64 = 4;
const N: i64 = 6;

fn drafter() -> (nn::VarStore, Drafter) {
    let target = Qwen3Config::preset("tiny").expect("tiny preset");
    let mut cfg = DrafterConfig::for_target(&target, 2, BS, target.vocab_size - 1);
    cfg.layer_types = vec![LayerType::Sliding, LayerType::Full];
    cfg.sliding_window = 6;
    let vs = nn::VarStore::new(Device::Cpu);
    let d = Drafter::new(&vs.root(), &cfg);
    (vs, d)
}

/// Anchors of two rows: the first draws all slots, the second has three candidates only,
/// so three of its slots are unused (anchor 0, not kept).
fn anchors() -> objective::Anchors {
    let mask = Tensor::ones([2, S], (Kind::Int64, Device::Cpu));
    let _ = mask.get(1).narrow(0, 0, S).fill_(0);
    let _ = mask.get(1).narrow(0, 20, 4).fill_(1);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let a = objective::sample_anchors(&mask, N, &mut rng).unwrap();
    let keep: Vec<bool> = Vec::try_from(a.keep.reshape([-1])).unwrap();
    assert_eq!(
        keep.iter().filter(|k| !**k).count(),
        3,
        "row 1 has unused slots"
    );
    a
}

/// Values in [-1, 1) from a seeded generator of this test's own (libtorch's global
/// generator is shared by the tests running in parallel).
fn uniform(shape: &[i64], seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = shape.iter().product::<i64>() as usize;
    let v: Vec<f32> = (0..n).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect();
    Tensor::from_slice(&v).view(shape)
}

fn host(a: &objective::Anchors) -> (Vec<i64>, Vec<bool>) {
    (
        Vec::try_from(a.anchors.reshape([-1])).unwrap(),
        Vec::try_from(a.keep.reshape([-1])).unwrap(),
    )
}

/// Output of every layer's attention block and the gradients of a fixed projection of
/// all outputs with respect to the block input, the context and every weight.
fn run(d: &Drafter, vs: &nn::VarStore, group_blocks: Option<i64>) -> (Vec<Tensor>, Vec<Tensor>) {
    run_with(d, vs, group_blocks, 0)
}

/// [`run`], with the attention in batched groups of `batch_blocks` blocks when not 0.
fn run_with(
    d: &Drafter,
    vs: &nn::VarStore,
    group_blocks: Option<i64>,
    batch_blocks: i64,
) -> (Vec<Tensor>, Vec<Tensor>) {
    let a = anchors();
    let (anc, keep) = host(&a);
    let groups = match group_blocks {
        Some(g) => objective::query_groups(&anc, &keep, N, S, BS, g),
        None => vec![QueryGroup {
            q0: 0,
            len: N * BS,
            ctx: S,
        }],
    };
    let h = d.cfg.hidden_size;
    let x = uniform(&[2, N * BS, h], 1).set_requires_grad(true);
    let ctx = uniform(&[2, S, h], 2).set_requires_grad(true);
    let rope = Rope::new(
        &objective::positions(S, &a.anchors, BS),
        d.cfg.head_dim,
        d.cfg.rope_theta,
        Kind::Float,
    );
    let mut outs = Vec::new();
    for layer in &d.layers {
        let window = (layer.layer_type == LayerType::Sliding).then_some(d.cfg.sliding_window);
        let dense = objective::block_mask(&a.anchors, &a.keep, S, BS, window);
        let mask = match batch_blocks {
            0 => objective::group_masks(&dense, &groups, S, Kind::Float),
            n => objective::batched_mask(&dense, S, n * BS, Kind::Float),
        };
        outs.push(layer.attn_block(&x, &ctx, &rope, &mask));
    }
    let probe = uniform(&[2, N * BS, h], 3);
    let total = outs
        .iter()
        .map(|o| (o * &probe).sum(Kind::Float))
        .reduce(|a, b| a + b)
        .unwrap();
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    // the attention blocks' own weights (the MLPs, fc and final norm take no part)
    let mut inputs = vec![x.shallow_clone(), ctx.shallow_clone()];
    inputs.extend(
        vars.into_iter()
            .filter(|(n, _)| n.contains("self_attn") || n.contains("input_layernorm"))
            .map(|(_, t)| t),
    );
    let grads = Tensor::run_backward(&[total], &inputs, false, false);
    (outs.iter().map(|o| o.detach()).collect(), grads)
}

fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

#[test]
fn grouped_attention_equals_the_dense_mask_in_outputs_and_gradients() {
    let (vs, d) = drafter();
    let (dense_out, dense_grad) = run(&d, &vs, None);
    assert!(dense_grad.len() > 2 && dense_grad.iter().all(|g| g.defined()));
    for g in [1, 2, 4, N] {
        let (out, grad) = run(&d, &vs, Some(g));
        let (o, gr) = (max_diff(&dense_out, &out), max_diff(&dense_grad, &grad));
        assert!(o < 1e-5, "group of {g} blocks: outputs differ by {o}");
        assert!(gr < 1e-4, "group of {g} blocks: gradients differ by {gr}");
    }
}

#[test]
fn a_group_too_narrow_for_its_anchors_changes_the_result() {
    // the check above can fail: cutting one context key a query sees changes the output
    let (vs, d) = drafter();
    let (dense_out, _) = run(&d, &vs, None);
    let a = anchors();
    let (anc, keep) = host(&a);
    let mut groups = objective::query_groups(&anc, &keep, N, S, BS, N);
    assert_eq!(groups.len(), 1);
    let need = anc
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(a, _)| *a)
        .max()
        .unwrap();
    assert!(groups[0].ctx >= need);
    groups[0].ctx = need - 1;
    let layer = &d.layers[1];
    let dense = objective::block_mask(&a.anchors, &a.keep, S, BS, None);
    let mask = objective::group_masks(&dense, &groups, S, Kind::Float);
    let h = d.cfg.hidden_size;
    let x = uniform(&[2, N * BS, h], 1);
    let ctx = uniform(&[2, S, h], 2);
    let rope = Rope::new(
        &objective::positions(S, &a.anchors, BS),
        d.cfg.head_dim,
        d.cfg.rope_theta,
        Kind::Float,
    );
    let out = tch::no_grad(|| layer.attn_block(&x, &ctx, &rope, &mask));
    assert!(max_diff(&dense_out[1..], &[out]) > 1e-4);
}

#[test]
fn groups_cover_every_allowed_key_and_are_narrower_than_the_dense_mask() {
    let a = anchors();
    let (anc, keep) = host(&a);
    for g in [1, 2, 4, N, 100] {
        let groups = objective::query_groups(&anc, &keep, N, S, BS, g);
        // the groups tile the queries
        let mut next = 0;
        for q in &groups {
            assert_eq!(q.q0, next);
            next += q.len;
            assert!(q.ctx <= S);
            assert!((q.ctx + q.len) % 16 == 0 || q.ctx == S, "{q:?} not aligned");
        }
        assert_eq!(next, N * BS);
        // every allowed (query, key) pair of the dense mask, counted one by one, lies in
        // its group's keys: the group masks hold exactly as many allowed pairs
        for window in [None, Some(6)] {
            let dense = objective::block_mask(&a.anchors, &a.keep, S, BS, window);
            let allowed: Vec<bool> = Vec::try_from(dense.reshape([-1])).unwrap();
            let grouped = objective::group_masks(&dense, &groups, S, Kind::Float);
            let in_groups: f64 = grouped
                .groups
                .iter()
                .map(|(_, m)| m.eq(0.0).sum(Kind::Float).double_value(&[]))
                .sum();
            let total = allowed.iter().filter(|v| **v).count() as f64;
            assert_eq!(in_groups, total, "groups of {g}, window {window:?}");
        }
    }
    // narrower: with one block per group, under 60% of the dense mask's (query, key) pairs
    // (padding each group's keys to a multiple of 16 costs much at this tiny size)
    let groups = objective::query_groups(&anc, &keep, N, S, BS, 1);
    let keys: i64 = groups.iter().map(|q| q.len * (q.ctx + q.len)).sum();
    let dense = N * BS * (S + N * BS);
    assert!(
        keys * 10 < dense * 6,
        "{keys} of {dense} (query, key) pairs"
    );
}

#[test]
fn group_widths_on_the_realistic_shape_take_few_values() {
    // S 2048, 256 blocks of 16 in groups of 32: whatever the anchors, a group's keys are a
    // multiple of 256 (or all of the context), so cuDNN sees at most 9 widths per group
    const S: i64 = 2048;
    const N: i64 = 256;
    const BS: i64 = 16;
    assert_eq!(objective::key_bucket(S), 256);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut widths = vec![std::collections::BTreeSet::new(); (N / 32) as usize];
    for draw in 0..300 {
        // two rows of sorted anchors, some slots unused in the second row
        let mut anc = Vec::new();
        let mut keep = Vec::new();
        for row in 0..2 {
            let mut a: Vec<i64> = (0..N).map(|_| rng.gen_range(0..S - 1)).collect();
            a.sort_unstable();
            let used = if row == 1 { draw % N } else { N };
            for (j, x) in a.into_iter().enumerate() {
                keep.push((j as i64) < used);
                anc.push(if (j as i64) < used { x } else { 0 });
            }
        }
        let groups = objective::query_groups(&anc, &keep, N, S, BS, 32);
        assert_eq!(groups.len(), widths.len());
        for (i, g) in groups.iter().enumerate() {
            // the widest kept anchor of the group, over both rows, computed here directly
            let need = (0..2)
                .flat_map(|r| (i * 32..i * 32 + 32).map(move |j| r * N as usize + j))
                .filter(|&k| keep[k])
                .map(|k| anc[k])
                .max()
                .unwrap_or(0);
            assert!(g.ctx >= need && g.ctx <= S, "{g:?} against {need}");
            assert!((g.ctx + g.len) % 256 == 0 || g.ctx == S, "{g:?}");
            assert!(
                g.ctx < need + 256,
                "{g:?} wider than the bucket needs ({need})"
            );
            widths[i].insert(g.ctx);
        }
    }
    for (i, w) in widths.iter().enumerate() {
        assert!(w.len() <= 9, "group {i}: {} widths {w:?}", w.len());
    }
}

/// Dense attention and the grouped node over random q/k/v with grouped heads (4 query
/// heads on 2 key/value heads): outputs and the gradients of q, k and v.
#[test]
fn the_grouped_node_matches_dense_attention_with_grouped_heads() {
    use dflash::model::drafter::grouped_attention;
    let a = anchors();
    let (anc, keep) = host(&a);
    let q_len = N * BS;
    let probe = uniform(&[2, 4, q_len, 8], 14);
    // output and the gradients of q, k, v of one layout, from the same inputs every time
    let run = |mask: &objective::GroupedMask| {
        let q = uniform(&[2, 4, q_len, 8], 11).set_requires_grad(true);
        let k = uniform(&[2, 2, S + q_len, 8], 12).set_requires_grad(true);
        let v = uniform(&[2, 2, S + q_len, 8], 13).set_requires_grad(true);
        let out = grouped_attention(&q, &k, &v, mask);
        let grads = Tensor::run_backward(
            &[(&out * &probe).sum(Kind::Float)],
            &[&q, &k, &v],
            false,
            false,
        );
        (out.detach(), grads)
    };
    let dense = objective::block_mask(&a.anchors, &a.keep, S, BS, None);
    let layout = |g| {
        objective::group_masks(
            &dense,
            &objective::query_groups(&anc, &keep, N, S, BS, g),
            S,
            Kind::Float,
        )
    };
    let (want, want_grads) = run(&layout(0));
    for g in [1, 2, 4] {
        let mask = layout(g);
        assert!(mask.groups.len() > 1);
        let (got, grads) = run(&mask);
        let o = max_diff(&[want.shallow_clone()], &[got]);
        let gr = max_diff(&want_grads, &grads);
        assert!(o < 1e-5, "groups of {g} blocks: outputs differ by {o}");
        assert!(gr < 1e-5, "groups of {g} blocks: gradients differ by {gr}");
    }
}

#[test]
#[should_panic(expected = "does not tile the queries")]
fn the_grouped_node_refuses_groups_that_do_not_tile_the_queries() {
    let q = Tensor::zeros([1, 2, 8, 4], (Kind::Float, Device::Cpu));
    let k = Tensor::zeros([1, 2, 12, 4], (Kind::Float, Device::Cpu));
    let m = Tensor::zeros([1, 1, 4, 8], (Kind::Float, Device::Cpu));
    // the second group starts at query 5, not 4
    let groups = [((0, 4, 4), &m), ((5, 3, 4), &m)];
    let _ = dflash::model::layers::grouped_attention(&q, &k, &k, &groups, 4);
}

#[test]
fn batched_groups_equal_the_dense_mask_in_outputs_and_gradients() {
    // full and sliding layers, unused slots; groups of 1, 2, 3 and all 6 blocks
    let (vs, d) = drafter();
    let (dense_out, dense_grad) = run(&d, &vs, None);
    for n in [1, 2, 3, N] {
        let (out, grad) = run_with(&d, &vs, None, n);
        let (o, gr) = (max_diff(&dense_out, &out), max_diff(&dense_grad, &grad));
        assert!(
            o < 1e-5,
            "batched groups of {n} blocks: outputs differ by {o}"
        );
        assert!(
            gr < 1e-4,
            "batched groups of {n} blocks: gradients differ by {gr}"
        );
    }
}

#[test]
fn the_batched_mask_stacks_each_groups_rows_over_all_context_keys() {
    // row b * G + g of the batched mask is group g's mask over ctx = S (group_masks), of
    // sequence b: an independent construction by narrowing and concatenating
    let a = anchors();
    for window in [None, Some(6)] {
        let dense = objective::block_mask(&a.anchors, &a.keep, S, BS, window);
        for n in [1, 2, 3] {
            let len = n * BS;
            let g = N / n;
            let batched = objective::batched_mask(&dense, S, len, Kind::Float);
            assert_eq!(batched.batch, len);
            let m = &batched.groups[0].1;
            assert_eq!(m.size(), [2 * g, 1, len, S + len]);
            // the training step's direct construction gives the same mask
            let direct =
                objective::batched_block_mask(&a.anchors, &a.keep, S, BS, window, len, Kind::Float);
            assert_eq!(direct.batch, len);
            assert!(
                direct.groups[0].1.equal(m),
                "window {window:?}, groups of {n}: the direct batched mask differs"
            );
            let groups: Vec<QueryGroup> = (0..g)
                .map(|i| QueryGroup {
                    q0: i * len,
                    len,
                    ctx: S,
                })
                .collect();
            let each = objective::group_masks(&dense, &groups, S, Kind::Float);
            for b in 0..2 {
                for (i, (_, want)) in each.groups.iter().enumerate() {
                    let got = m.get(b * g + i as i64);
                    assert!(
                        got.equal(&want.get(b)),
                        "window {window:?}, groups of {n}: row {b} group {i} differs"
                    );
                }
            }
        }
    }
}

#[test]
fn batched_groups_take_the_largest_divisor_of_the_blocks_up_to_the_setting() {
    assert_eq!(objective::batch_blocks(256, 32), 32);
    assert_eq!(objective::batch_blocks(100, 32), 25);
    assert_eq!(objective::batch_blocks(97, 32), 1);
    assert_eq!(objective::batch_blocks(6, 100), 6);
    // brute force: every (blocks, want) up to 64
    for n in 1..=64i64 {
        for want in 1..=70i64 {
            let got = objective::batch_blocks(n, want);
            let best = (1..=want.min(n)).filter(|d| n % d == 0).max().unwrap();
            assert_eq!(got, best, "{n} blocks, at most {want}");
        }
    }
}
