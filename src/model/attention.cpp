// Grouped block attention as one autograd node (any device).
//
// The drafter's query groups (objective::QueryGroup) each attend to the first `ctx`
// context keys and to their own block keys. Built from ATen ops under autograd, every
// group adds a narrow, a cat and a head repeat of the keys and values to the graph, and
// each narrow's backward fills a zero tensor of all S + Q keys before copying its slice:
// on the realistic shape (8 groups x 3 layers) that graph cost 5 ms of GPU kernels and
// 9 ms of host time a step, more than the attention it saved (docs/gpu-results.md, sixth
// run). Here the node's forward builds one small graph per group from detached leaves
// (keys cat, head repeat, ATen's scaled_dot_product_attention: the same kernels as
// before), and its backward runs each group's graph and writes the gradients into one
// buffer per input: no zero fill but one per key tensor, no graph over the full tensors.
// Once differentiable: the groups' graphs are freed by the backward.

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

thread_local char attn_error[512] = {0};

int fail(const std::string& msg) {
  std::strncpy(attn_error, msg.c_str(), sizeof(attn_error) - 1);
  attn_error[sizeof(attn_error) - 1] = 0;
  return -1;
}

struct Group {
  int64_t q0, len, ctx;
};

std::vector<Group> groups_of(const std::vector<int64_t>& spec) {
  std::vector<Group> gs;
  for (size_t i = 0; i + 2 < spec.size(); i += 3) gs.push_back({spec[i], spec[i + 1], spec[i + 2]});
  return gs;
}

// A group's keys along dim 2: the first ctx context keys, then its own block keys.
at::Tensor keys_of(const at::Tensor& t, const Group& g, int64_t seq_len) {
  return at::cat({t.narrow(2, 0, g.ctx), t.narrow(2, seq_len + g.q0, g.len)}, 2);
}

struct GroupedAttnFn : public torch::autograd::Function<GroupedAttnFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor q, at::Tensor k, at::Tensor v,
                            std::vector<at::Tensor> masks, std::vector<int64_t> spec, int64_t seq_len) {
    const auto gs = groups_of(spec);
    const int64_t rep = q.size(1) / k.size(1);
    const at::Tensor qd = q.detach(), kd = k.detach(), vd = v.detach();
    // per group: its output (with its graph) and its three leaves
    std::vector<at::Tensor> graphs, outs;
    {
      at::AutoGradMode grad_on(true);
      for (size_t i = 0; i < gs.size(); ++i) {
        const Group& g = gs[i];
        at::Tensor qg = qd.narrow(2, g.q0, g.len).detach().requires_grad_(true);
        at::Tensor kg = keys_of(kd, g, seq_len).requires_grad_(true);
        at::Tensor vg = keys_of(vd, g, seq_len).requires_grad_(true);
        // the key/value heads repeated as layers::attention does with a mask
        const at::Tensor kr = rep > 1 ? kg.repeat_interleave(rep, 1) : kg;
        const at::Tensor vr = rep > 1 ? vg.repeat_interleave(rep, 1) : vg;
        at::Tensor o = at::scaled_dot_product_attention(qg, kr, vr, masks[i], 0.0, false);
        outs.push_back(o.detach());
        graphs.insert(graphs.end(), {o, qg, kg, vg});
      }
    }
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["graphs"] = graphs;
    ctx->saved_data["spec"] = spec;
    ctx->saved_data["seq_len"] = seq_len;
    return outs.size() == 1 ? outs[0] : at::cat(outs, 2);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor none;
    if (!grads[0].defined()) return {none, none, none, none, none, none};
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const auto graphs = ctx->saved_data["graphs"].toTensorVector();
    const auto gs = groups_of(ctx->saved_data["spec"].toIntVector());
    const int64_t seq_len = ctx->saved_data["seq_len"].toInt();
    TORCH_CHECK(graphs.size() == 4 * gs.size(), "grouped attention: backward called twice");
    at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    for (size_t i = 0; i < gs.size(); ++i) {
      const Group& g = gs[i];
      const at::Tensor& o = graphs[4 * i];
      auto r = torch::autograd::grad({o}, {graphs[4 * i + 1], graphs[4 * i + 2], graphs[4 * i + 3]},
                                     {grads[0].narrow(2, g.q0, g.len)}, false, false, true);
      dq.narrow(2, g.q0, g.len).copy_(r[0]);
      at::Tensor* d[2] = {&dk, &dv};
      for (int j = 0; j < 2; ++j) {
        const at::Tensor& gk = r[1 + j];
        if (!gk.defined()) continue;
        d[j]->narrow(2, 0, g.ctx).add_(gk.narrow(2, 0, g.ctx));
        d[j]->narrow(2, seq_len + g.q0, g.len).copy_(gk.narrow(2, g.ctx, g.len));
      }
    }
    ctx->saved_data["graphs"] = std::vector<at::Tensor>{};
    return {dq, dk, dv, none, none, none};
  }
};

}  // namespace

extern "C" {

const char* dflash_attention_last_error() { return attn_error; }

// Attention of q [B, Hq, Q, D] over k, v [B, Hkv, S + Q, D] in n groups: group i has the
// queries [q0, q0 + len) and the keys [0, ctx) and [S + q0, S + q0 + len), with the
// additive mask masks[i] ([B, 1, len, ctx + len]); spec holds (q0, len, ctx) per group.
// The groups must tile the queries in order. Returns 0, or -1 with the error in
// dflash_attention_last_error().
int dflash_grouped_attention(void* q_, void* k_, void* v_, void** masks_, const int64_t* spec_, int64_t n,
                             int64_t seq_len, void** out) {
  try {
    const at::Tensor& q = *static_cast<at::Tensor*>(q_);
    const at::Tensor& k = *static_cast<at::Tensor*>(k_);
    const at::Tensor& v = *static_cast<at::Tensor*>(v_);
    std::vector<at::Tensor> masks;
    std::vector<int64_t> spec(spec_, spec_ + 3 * n);
    int64_t next = 0;
    for (int64_t i = 0; i < n; ++i) {
      masks.push_back(*static_cast<at::Tensor*>(masks_[i]));
      const int64_t q0 = spec[3 * i], len = spec[3 * i + 1], c = spec[3 * i + 2];
      if (q0 != next || len <= 0 || c < 0 || c > seq_len)
        return fail("grouped attention: group " + std::to_string(i) + " does not tile the queries");
      next += len;
    }
    if (q.dim() != 4 || k.dim() != 4 || next != q.size(2) || k.size(2) != seq_len + q.size(2) ||
        k.sizes() != v.sizes() || k.size(1) == 0 || q.size(1) % k.size(1) != 0)
      return fail("grouped attention: q, k, v shapes do not match the groups");
    *out = new at::Tensor(GroupedAttnFn::apply(q, k, v, masks, spec, seq_len));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

}  // extern "C"
