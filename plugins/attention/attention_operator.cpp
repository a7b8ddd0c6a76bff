// Multi-head self-attention with rotary positions (RoPE, half-split pairs:
// feature i rotates with feature i + dh/2 at frequency base^(-2i/dh)),
// causal for language modelling, key-padding-masked for classification;
// y = LN(x + W_o Attn(x)), or pre-norm y = x + W_o Attn(LN(x)).
//
// Causal attention runs in query blocks of `block` positions: the queries of
// block [s, s + block) score keys [0, s + block) only, so about half of the
// T x T scores are never computed, each block's scores stay small enough to
// be cache-friendly, and only the diagonal tile is masked. forward_rows groups
// its rows by position blocks too, wider ones (a power of two times block)
// for a sequence whose rows are sparse, so that each product keeps enough
// query rows to run near the GEMM rate; flops_at() counts exactly the keys
// each row reads. Without causality (classification) every query reads
// every key, with the padding mask. Which code computes the core
// softmax(q k^T + mask) v is the option `core`:
//   fused    on the CPU, tile by tile in cache, recomputing its weights in
//            backward (fused_core.h), with RoPE written straight into the
//            layouts it reads (rotary.h); in fp32, or under bf16 products
//            on bf16 projections (bf16_projections); elsewhere as chunked
//   sdpa     libtorch's scaled_dot_product_attention (sdpa.h), builds with
//            libtorch 2.1 or newer only
//   chunked  batched products in chunks of at most chunk_mib of weights,
//            long sequences recomputing the weights in backward instead of
//            storing them (recompute_mib)
//   auto     (default) fused on the CPU in fp32 and under bf16 products
//            (bf16 autocast's projections on a CPU without oneDNN's bf16
//            kernels widened to fp32 for it where the build has no sdpa);
//            elsewhere (float64, fp16, other devices) sdpa where the build
//            has it, else chunked.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/layer_norm.h"
#include "chiar/linear.h"
#include "chiar/plugin.h"
#include "chiar/rows.h"
#include "fused_core.h"
#include "rotary.h"
#include "sdpa.h"

namespace {

using namespace chiar;

// Scores, mask and softmax in fp32 whatever the autocast dtype: the lowest
// float below does not fit bf16 or fp16, and the normalisation wants fp32.
at::ScalarType wide_type(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Scores q k^T (q already scaled) in the wide type with every key a query must not read
// set to the lowest finite value rather than -inf, so a row with every key
// masked (a padding query) gets uniform weights instead of NaN.
// q: (G, h, m, dh); k: (G, h, e, dh); qpos: (G|1, 1, m, 1) query positions;
// keys from mask_from on (no query precedes mask_from - 1) are masked beyond
// each query's position, mask_from >= e: none is; valid: (G, e), or undefined
// or empty for no padding.
at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& qpos, int64_t mask_from,
                         const at::Tensor& valid) {
  const int64_t e = k.size(2);
  auto scores = chiar::batch_matmul(q, k.transpose(-2, -1)).to(wide_type(q));  // (G, h, m, e)
  constexpr float kMasked = std::numeric_limits<float>::lowest();
  if (mask_from < e) {  // only this tile can hold keys after a query
    auto ahead = at::arange(mask_from, e, qpos.options()).view({1, 1, 1, e - mask_from}) > qpos;
    scores.narrow(-1, mask_from, e - mask_from).masked_fill_(ahead, kMasked);
  }
  if (valid.defined() && valid.numel() > 0)
    scores.masked_fill_(valid.logical_not().view({valid.size(0), 1, 1, e}), kMasked);
  return scores;
}

// How many rows each group holds: group (N,) int64 on the host, in
// 0..count-1 (group_rows's labels), cheaper than at::bincount
// (chiar_bench: routed_dct_attn/sparse/128/256/*).
std::vector<int64_t> rows_per_group(const at::Tensor& group, int64_t count) {
  const auto labels = group.contiguous();
  const int64_t* label = labels.data_ptr<int64_t>();
  std::vector<int64_t> rows(static_cast<size_t>(count), 0);
  for (int64_t i = 0; i < labels.numel(); ++i) ++rows[static_cast<size_t>(label[i])];
  return rows;
}

// Keys (or values) [0, e) of t (G, h, L, dh): t itself when that is all of
// them, so that backward has no slice to undo.
at::Tensor first_keys(const at::Tensor& t, int64_t e) { return e == t.size(2) ? t : t.narrow(2, 0, e); }

// softmax(scores) v through autograd: the (m x e) weights are kept for backward.
at::Tensor attend_stored(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& qpos,
                         int64_t mask_from, const at::Tensor& valid) {
  auto p = at::softmax(masked_scores(q, k, qpos, mask_from, valid), -1);  // (G, h, m, e)
  return chiar::batch_matmul(p.to(v.scalar_type()), v);
}

// The same value, keeping only q, k, v, the output and the row log-sum-exp
// for backward, which recomputes the weights: memory O(m dh) per block instead
// of O(m e), at the price of one more q k^T product in backward. This is what
// lets T = 4096 classification train with the whole batch's scores never held.
struct RecomputedAttention : public torch::autograd::Function<RecomputedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& qpos, int64_t mask_from, const at::Tensor& valid) {
    auto scores = masked_scores(q, k, qpos, mask_from, valid);  // (G, h, m, e)
    auto lse = scores.logsumexp(-1, /*keepdim=*/true);          // (G, h, m, 1)
    auto o = chiar::batch_matmul(scores.sub_(lse).exp_().to(v.scalar_type()), v);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["qpos"] = qpos;
    ctx->saved_data["valid"] = valid;
    ctx->saved_data["mask_from"] = mask_from;
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const auto wide = wide_type(q);
    auto o = saved[3].to(wide), lse = saved[4];
    auto dout = grads[0].to(wide);  // (G, h, m, dh)
    auto p = masked_scores(q, k, ctx->saved_data["qpos"].toTensor(), ctx->saved_data["mask_from"].toInt(),
                           ctx->saved_data["valid"].toTensor())
                 .sub_(lse)
                 .exp_();                                               // (G, h, m, e)
    auto dv = chiar::batch_matmul(p.transpose(-2, -1), dout);           // (G, h, e, dh)
    auto dp = chiar::batch_matmul(dout, v.to(wide).transpose(-2, -1));  // (G, h, m, e)
    auto ds = p.mul_(dp.sub_((dout * o).sum(-1, /*keepdim=*/true)));    // softmax backward
    auto dq = chiar::batch_matmul(ds, k.to(wide));                      // (G, h, m, dh)
    auto dk = chiar::batch_matmul(ds.transpose(-2, -1), q.to(wide));    // (G, h, e, dh)
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
            at::Tensor(),           at::Tensor(),           at::Tensor()};
  }
};

enum class Core { Auto, Fused, Sdpa, Chunked };

Core parse_core(const std::string& name) {
  if (name == "auto") return Core::Auto;
  if (name == "fused") return Core::Fused;
  if (name == "sdpa") {
    if (!chiar_attention::kHasSdpa)
      throw UserError("attention: core \"sdpa\" needs libtorch 2.1 or newer; this build has " +
                      std::string(TORCH_VERSION));
    return Core::Sdpa;
  }
  if (name == "chunked") return Core::Chunked;
  throw UserError("attention: core must be auto, fused, sdpa or chunked, found \"" + name + "\"");
}

class AttentionOperator final : public Operator {
 public:
  explicit AttentionOperator(const OperatorSpec& spec)
      : d_(spec.d_model),
        heads_(spec.params.get_int("heads", spec.n_heads)),
        block_(spec.params.get_int("block")),
        recompute_mib_(spec.params.get_double("recompute_mib")),
        chunk_mib_(spec.params.get_double("chunk_mib")),
        rope_(spec.params.get_bool("rope")),
        rope_base_(spec.params.get_double("rope_base")),
        core_(parse_core(spec.params.get_string("core"))) {
    if (heads_ < 1 || d_ % heads_ != 0)
      throw UserError("attention: d_model " + std::to_string(d_) + " is not divisible by heads " +
                      std::to_string(heads_));
    if (block_ < 1) throw UserError("attention: block must be at least 1, found " + std::to_string(block_));
    dh_ = d_ / heads_;
    if (rope_ && dh_ % 2 != 0) throw UserError("attention: RoPE needs an even head size, found " + std::to_string(dh_));
    q_ = register_module("q", torch::nn::Linear(d_, d_));
    kv_ = register_module("kv", torch::nn::Linear(d_, 2 * d_));
    out_ = register_module("out", torch::nn::Linear(d_, d_));
    norm_ =
        SublayerNorm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_}))), spec.pre_norm);
  }

  at::Tensor forward(const at::Tensor& x, const OpContext& ctx) override {
    const int64_t B = x.size(0), T = x.size(1);
    const auto in = norm_.input(x);                                               // (B, T, d)
    auto q = queries(project_for_core(q_, in).view({B, T, heads_, dh_}), {}, T);  // (B, h, T, dh)
    auto [kt, v] = keys_values(in);                                               // (B, h, dh, T), (B, h, T, dh)
    at::Tensor o;                                                                 // (B, h, T, dh)
    if (fuses(q)) {
      chiar::count_host_kernel();
      o = chiar_attention::fused_attention(q, kt, v, {}, ctx.valid, ctx.causal ? block_ : 0);
    } else if (sdpa_for(q)) {
      // Causal in one call: SDPA's kernels skip the masked half themselves.
      o = chiar_attention::sdpa_attention(q, kt.transpose(2, 3), v, ctx.causal, {}, ctx.valid);
    } else if (!ctx.causal) {
      const auto k = kt.transpose(2, 3);
      o = attend(q, k, v, at::Tensor(), T, ctx.valid, recompute_for(T, false));
    } else {
      const auto k = kt.transpose(2, 3);
      const bool recompute = recompute_for(T, true);
      std::vector<at::Tensor> blocks;
      const auto query_blocks = T > block_ ? q.split(block_, 2) : std::vector<at::Tensor>{q};  // see attend()
      for (int64_t s = 0, b = 0; s < T; s += block_, ++b) {
        const int64_t n = std::min(block_, T - s), e = s + n;
        auto qpos = at::arange(s, e, x.options().dtype(at::kLong)).view({1, 1, n, 1});
        auto valid = ctx.valid.defined() ? ctx.valid.narrow(1, 0, e) : at::Tensor();
        blocks.push_back(attend(query_blocks[static_cast<size_t>(b)], first_keys(k, e), first_keys(v, e), qpos, s + 1,
                                valid, recompute));
      }
      o = blocks.size() == 1 ? blocks[0] : at::cat(blocks, 2);
    }
    return norm_.output(project(out_, o.transpose(1, 2).reshape({B, T, d_}), x));
  }

  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    const int64_t T = x.size(1), N = rows.size(0);
    // Every row selected (rows are strictly increasing): the blocked forward
    // is the same computation without the gathers.
    if (N == x.size(0) * T) return forward(x, ctx).view({N, d_});
    auto xr = chiar::gather_rows(x.reshape({-1, d_}), rows);  // (N, d): the residual
    auto t = at::remainder(rows, T);                          // (N,) query positions
    // The rows are grouped on the host (the groups' sizes decide the
    // products' shapes): from the routed layer's host copy of them
    // (OpContext::host_rows), else from a copy of their own, which on a GPU
    // waits. The index tensors the products need go back in copies that do
    // not wait (groups_on_device, indices_to_device).
    const auto host_rows = rows_in_host_memory(rows, ctx.host_rows).contiguous();  // (N,) int64
    const RowGroups hg = group_rows(at::div(host_rows, T, "floor"));  // one group per sequence, on the host
    const RowGroups g = groups_on_device(hg, x.device());
    // Every sequence has rows (g.keys = 0 .. B-1): no gather of x.
    const auto in = norm_.input(g.count == x.size(0) ? x : x.index_select(0, g.keys));  // (G, T, d)
    auto [kt, v] = keys_values(in);                                                     // (G, h, dh, T), (G, h, T, dh)
    // Rotated, scaled queries of every row: (N, h, dh).
    const auto q_in = norm_.pre() ? in.reshape({-1, d_}).index_select(0, g.group * T + t) : xr;  // (N, d)
    auto q = queries(project_for_core(q_, q_in).view({1, N, heads_, dh_}), t, T).squeeze(0).transpose(0, 1);
    auto valid = ctx.valid.defined() ? ctx.valid.index_select(0, g.keys) : at::Tensor();
    const bool recompute = recompute_for(T, ctx.causal);
    const bool fused = fuses(q);
    if (!ctx.causal || T <= block_) {
      // Every row of a sequence reads all T keys (masked after its position
      // when causal): one segment per sequence, rows in their order.
      if (fused) {
        const auto per_sequence = rows_per_group(hg.group, hg.count);
        const int64_t* n = per_sequence.data();
        std::vector<int64_t> segments;
        for (int64_t j = 0, start = 0; j < g.count; start += n[j], ++j)
          segments.insert(segments.end(), {start, n[j], j, T});
        auto o = chiar_attention::fused_attention_rows(q, kt, v, as_segments(segments), ctx.causal ? t : at::Tensor(),
                                                       valid);
        return norm_.output(project(out_, o.reshape({N, d_}), xr));
      }
      return norm_.output(project(out_, attend_rows(q, kt, v, t, g, T, ctx.causal ? 1 : T, valid, recompute), xr));
    }

    // Each sequence's rows go in query blocks of span(rows, T) positions
    // (block, or a multiple of it when its rows are sparse); a block's rows
    // read keys [0, e), e the block's end.
    const auto per_sequence = rows_per_group(hg.group, hg.count);
    std::vector<int64_t> spans(static_cast<size_t>(g.count));
    for (int64_t j = 0; j < g.count; ++j) spans[static_cast<size_t>(j)] = span(per_sequence[static_cast<size_t>(j)], T);
    if (fused) {
      // One fused call over every (sequence, e) pair (causal_segments).
      auto o = chiar_attention::fused_attention_rows(q, kt, v, causal_segments(host_rows, hg.group, spans, T), t,
                                                     valid);  // (N, h, dh)
      return norm_.output(project(out_, o.reshape({N, d_}), xr));
    }
    const auto o = chunked_causal_rows(q, kt, v, t, valid, host_rows, hg, g, spans, T, recompute);  // (N, d)
    return norm_.output(project(out_, o, xr));
  }

  // The fused core's segments for causal rows: one per (sequence, e) pair,
  // e the end of the row's query block of span(rows, T) positions, reading
  // that sequence's keys [0, e) in place; no padding, no copies of keys.
  // Rows ascend, so each pair's rows are already one run: no reordering.
  //   host_rows (N,) int64 ascending, group (N,) each row's sequence group
  static at::Tensor causal_segments(const at::Tensor& host_rows, const at::Tensor& group_of,
                                    const std::vector<int64_t>& spans, int64_t T) {
    const int64_t N = host_rows.size(0);
    const int64_t* row = host_rows.data_ptr<int64_t>();
    const int64_t* group = group_of.data_ptr<int64_t>();
    std::vector<int64_t> segments;
    for (int64_t i = 0; i < N;) {
      const int64_t sequence = row[i] / T, width = spans[static_cast<size_t>(group[i])];
      const int64_t e = std::min(T, (row[i] % T / width + 1) * width);
      int64_t n = 1;
      while (i + n < N && row[i + n] < sequence * T + e) ++n;
      segments.insert(segments.end(), {i, n, group[i], e});
      i += n;
    }
    return as_segments(segments);
  }

  // Causal rows on the chunked core or SDPA: the rows sorted by e, then
  // sequence (stable, so then by position): the rows of one e are one slice,
  // each of its sequences one run, and run as one batched product. Planned
  // on the host. q (N, h, dh), kt (G, h, dh, T), v (G, h, T, dh), t (N,)
  // positions; hg the row groups on the host, g on the device. Returns (N, d)
  // in row order.
  at::Tensor chunked_causal_rows(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v, const at::Tensor& t,
                                 const at::Tensor& valid, const at::Tensor& host_rows, const RowGroups& hg,
                                 const RowGroups& g, const std::vector<int64_t>& spans, int64_t T,
                                 bool recompute) const {
    const int64_t N = host_rows.size(0);
    const auto host_t = at::remainder(host_rows, T);
    auto row_span = at::tensor(spans, host_t.options()).index_select(0, hg.group);  // (N,)
    auto end = ((at::div(host_t, row_span, "floor") + 1) * row_span).clamp_max(T);  // (N,) e of each row
    auto [sorted, order] = at::sort(end * g.count + hg.group, c10::optional<bool>(true), /*dim=*/0);  // stable
    const RowGroups gp = group_rows(sorted);  // one group per (e, sequence) pair
    const auto counts = rows_per_group(gp.group, gp.count);
    const int64_t* key = gp.keys.data_ptr<int64_t>();
    const int64_t* count = counts.data();
    auto inverse = at::empty_like(order).scatter_(0, order, at::arange(N, order.options()));
    struct KeyBlock {  // the (e, sequence) pairs of one e
      int64_t e = 0, first_pair = 0, first_row = 0, rows = 0;
      int64_t widest = 0;  // keys from e - widest span on may lie after a query
      RowGroups pairs;     // count and width here; group and slot on the device
    };
    std::vector<KeyBlock> blocks;
    std::vector<int64_t> sequences;  // each block's sequences, block after block
    for (int64_t p = 0, r = 0; p < gp.count;) {
      KeyBlock b;
      b.e = key[p] / g.count, b.first_pair = p, b.first_row = r;
      for (; p + b.pairs.count < gp.count && key[p + b.pairs.count] / g.count == b.e; ++b.pairs.count) {
        sequences.push_back(key[p + b.pairs.count] % g.count);
        b.widest = std::max(b.widest, spans[static_cast<size_t>(sequences.back())]);
        b.pairs.width = std::max(b.pairs.width, count[p + b.pairs.count]);
        b.rows += count[p + b.pairs.count];
      }
      p += b.pairs.count;
      r += b.rows;
      blocks.push_back(std::move(b));
    }
    const auto plan =
        indices_to_device({order, inverse, gp.group, gp.slot, at::tensor(sequences, host_t.options())}, q.device());
    auto qs = q.index_select(0, plan[0]), ts = t.index_select(0, plan[0]);  // (N, h, dh), (N,)
    std::vector<at::Tensor> pieces;                                         // (n_j, d) per e, in sorted order
    int64_t first_sequence = 0;
    for (KeyBlock& b : blocks) {
      const int64_t e = b.e, r = b.first_row, n = b.rows;
      b.pairs.group = plan[2].narrow(0, r, n) - b.first_pair;  // renumbered from 0
      b.pairs.slot = plan[3].narrow(0, r, n);
      // Keys [0, e) of the block's sequences; no copy when all have rows here.
      const auto index = plan[4].narrow(0, first_sequence, b.pairs.count);
      first_sequence += b.pairs.count;
      const auto pick = [&](const at::Tensor& a, int64_t dim) {
        auto head = a.narrow(dim, 0, e);
        return b.pairs.count == g.count ? head : head.index_select(0, index);
      };
      auto vab = valid.defined() ? pick(valid, 1) : at::Tensor();
      pieces.push_back(attend_rows(qs.narrow(0, r, n), pick(kt, 3), pick(v, 2), ts.narrow(0, r, n), b.pairs, e,
                                   std::max<int64_t>(1, e - b.widest + 1), vab, recompute));
    }
    return at::cat(pieces).index_select(0, plan[1]);
  }

  FlopCount flops(int64_t T, int64_t n, int64_t d) const override {
    // Every query reads all T keys: the non-causal cost.
    return cost(T, n, n * T, d, recomputes(T, false));
  }

  FlopCount flops_at(int64_t T, const std::vector<int64_t>& positions, int64_t d,
                     const FlopContext& ctx) const override {
    const auto n = static_cast<int64_t>(positions.size());
    if (!ctx.causal) return cost(T, n, n * T, d, recomputes(T, false));
    const int64_t p = span(n, T);  // forward_rows' query blocks for this many rows
    int64_t keys = 0;
    for (const int64_t t : positions) keys += causal_keys(t, T, p);
    return cost(T, n, keys, d, recomputes(T, true));
  }

  OperatorTraits traits() const override {
    OperatorTraits t;
    t.display_name = "Attention";
    t.colour = "#f7c9c0";
    t.role = OperatorRole::GlobalMixing;
    t.attention_flops = true;
    t.pre_norm = true;
    return t;
  }

  std::string describe() const override {
    std::ostringstream mib;
    mib << recompute_mib_;
    // Where the fused core does not apply (not fp32, not the CPU).
    const bool sdpa_elsewhere = core_ == Core::Auto && chiar_attention::kHasSdpa;
    std::string core;
    switch (core_) {
      case Core::Auto:
      case Core::Fused:
        core = std::string("fused core (fp32 CPU), else ") + (sdpa_elsewhere ? "SDPA" : "chunked");
        break;
      case Core::Sdpa: core = "SDPA core"; break;
      case Core::Chunked: core = "chunked core, recompute above " + mib.str() + " MiB"; break;
    }
    return "attention(heads " + std::to_string(heads_) + ", block " + std::to_string(block_) + ", " + core +
           (rope_ ? ", rope)" : ")");
  }

 private:
  // n output rows of a sequence of length T reading `keys` (query, key) pairs
  // in total. forward_rows works per sequence that has rows: a sequence
  // without any computes nothing, not even its keys and values.
  FlopCount cost(int64_t T, int64_t n, int64_t keys, int64_t d, bool recompute) const {
    if (n == 0) return {};
    const int64_t h = heads_;
    FlopCount f = matmul_flops(n, d, d) + matmul_flops(T, d, 2 * d) + matmul_flops(n, d, d);
    if (rope_) f += elementwise_flops(n + T, d, 3);
    f += elementwise_flops(n, d);  // the 1/sqrt(dh) scale, applied to the queries
    // Scores and weighted values over the keys read, then the softmax.
    f += FlopCount{2 * keys * d, 4 * keys * d} * 2;
    f += FlopCount{5 * keys * h, 3 * keys * h};
    // Backward recomputes the scores and weights rather than storing them.
    if (recompute) f += FlopCount{0, 2 * keys * d + 5 * keys * h};
    // Pre-norm normalises every position the keys read, post-norm the rows.
    return f + elementwise_flops(n, d) + layernorm_flops(norm_.pre() ? T : n, d);
  }

  // (query, key) pairs of a whole sequence of length T: all of them, or the
  // causal blocks' share.
  int64_t pairs(int64_t T, bool causal) const {
    if (!causal) return T * T;
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) n += causal_keys(t, T);
    return n;
  }

  // Keys a causal query at position t reads in query blocks of `width`
  // positions: its block [s, s + width) reads [0, min(T, s + width)).
  static int64_t causal_keys(int64_t t, int64_t T, int64_t width) { return std::min(T, (t / width + 1) * width); }
  int64_t causal_keys(int64_t t, int64_t T) const { return causal_keys(t, T, block_); }

  // Positions per causal query block when forward_rows has n rows of a
  // sequence of length T: block while at least ~35% of positions are rows,
  // else the power of two times block nearest (on a log scale) to
  // block / (2 x density), so that a block holds about block / 2 rows
  // (25% of rows: 2 blocks, 10%: 4). Small products run at two thirds of
  // the GEMM rate of block-sized ones here, and padding the sequences of a
  // block to the same length wastes more of them; reading up to
  // (span - block) / 2 more keys per row on average costs less.
  int64_t span(int64_t n, int64_t T) const {
    if (n <= 0 || n * 2 >= T) return block_;
    const double blocks = static_cast<double>(T) / (2.0 * static_cast<double>(n));
    const int64_t most = (T + block_ - 1) / block_;
    int64_t s = 1;
    while (s < most && std::log2(static_cast<double>(s)) + 0.5 <= std::log2(blocks)) s *= 2;
    return s * block_;
  }

  // Whether training recomputes the weights in backward rather than keep
  // them: decided per sequence length, so FLOP accounting knows it too. At
  // the default 64 MiB: classification from T 2049, causal LM from T 2834
  // (4 heads, fp32).
  bool recompute_for(int64_t T, bool causal) const {
    const double bytes = static_cast<double>(heads_ * pairs(T, causal)) * 4.0;
    return bytes > recompute_mib_ * 1024.0 * 1024.0;
  }

  // Whether backward recomputes the weights (FLOP accounting): always with
  // the fused core, which never keeps them, and with SDPA's flash and
  // memory-efficient kernels (its plain math path keeps them: libtorch's
  // choice, not visible here). The count follows the fp32 CPU core the
  // options give, as it does for the query blocks.
  bool recomputes(int64_t T, bool causal) const { return core_ != Core::Chunked || recompute_for(T, causal); }

  // The fused core takes fp32 on the CPU, and the bf16 projections below
  // (unless the kernel policy asks for libtorch compositions,
  // chiar/kernels.h); other dtypes (float64 in the tests' references, bf16
  // that for_core left as it is) and devices go to SDPA or the chunked core.
  static bool fp32_cpu(const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.device().is_cpu(); }
  bool fuses(const at::Tensor& q) const {
    return (core_ == Core::Auto || core_ == Core::Fused) && chiar::host_kernels_enabled() &&
           (fp32_cpu(q) || (q.scalar_type() == at::kBFloat16 && bf16_projections(q)));
  }
  // Whether the core's projections come out in bf16: where the fused core
  // runs under bf16 products (chiar::cpu_bf16_products), which reads bf16
  // q, k and v in place and gives their gradients back in bf16, RoPE turning
  // them in fp32 between (rotary.h). The projections then write half the
  // bytes, and nothing casts them to fp32 and back to bf16 for the core's
  // products, or their gradients on the way back (docs/performance.md,
  // 'Queries, keys and values in bf16').
  bool bf16_projections(const at::Tensor& x) const {
    return (core_ == Core::Auto || core_ == Core::Fused) && chiar::host_kernels_enabled() && x.device().is_cpu() &&
           chiar::cpu_bf16_products();
  }
  at::Tensor project_for_core(const torch::nn::Linear& layer, const at::Tensor& x) const {
    return bf16_projections(x) ? chiar::linear_bf16_out(x, layer->weight, layer->bias) : for_core(project(layer, x));
  }
  // A projection as the core takes it where bf16_projections does not
  // apply. Under bf16 autocast on a CPU whose oneDNN has bf16 kernels, that
  // is the SDPA or chunked core, and chiar::linear returns fp32; elsewhere
  // the projections come out in bf16, and where the fused core is the choice
  // (fused, or auto without SDPA) they are widened to fp32 once, (B, T, d)
  // each, so that RoPE and the core run fused rather than as autocast's
  // chunked bf16 products and their fp32 softmax passes (bench-train
  // --variants-file configs/attention_cores.toml; docs/performance.md, 'bf16
  // autocast'). So under auto in a build with SDPA, bf16 attention runs the
  // fused core on CPUs with native bf16 kernels and SDPA on others.
  at::Tensor for_core(const at::Tensor& projection) const {
    const bool fused_choice = core_ == Core::Fused || (core_ == Core::Auto && !chiar_attention::kHasSdpa);
    const bool widen = fused_choice && projection.scalar_type() == at::kBFloat16 && projection.device().is_cpu() &&
                       chiar::host_kernels_enabled();
    return widen ? projection.to(at::kFloat) : projection;
  }
  bool sdpa_for(const at::Tensor& q) const {
    return core_ == Core::Sdpa || (core_ == Core::Auto && chiar_attention::kHasSdpa && !fuses(q));
  }

  // Rotated queries scaled by 1/sqrt(dh) (once per query, not per score):
  // qx (G, L, h, dh) a view of the projection at positions pos (L), or
  // undefined for 0 .. L-1, of a sequence of length T -> (G, h, L, dh).
  at::Tensor queries(const at::Tensor& qx, const at::Tensor& pos, int64_t T) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh_));
    if (rope_ && fuses(qx)) {
      const auto& [cos, sin] = rope_table(T, qx);
      return chiar_attention::rotary(qx, cos, sin, pos, scale, /*keys_transposed=*/false);
    }
    auto q = qx.transpose(1, 2);
    return rope_ ? rotate(q, pos.defined() ? pos.view({1, 1, -1}) : pos, T, scale) : q * scale;
  }

  // Rotated keys transposed, kt (G, h, dh, T), and values (G, h, T, dh), of
  // x (G, T, d). The keys contiguous once, as the (dh, e) operand of q k^T
  // that every query block reads in place (row-major: oneDNN's sgemm runs it
  // faster than k read transposed; docs/performance.md, 'The fused attention
  // core'); the values a view of the projection, whose rows (stride 2d) the
  // products read in place too.
  std::pair<at::Tensor, at::Tensor> keys_values(const at::Tensor& x) {
    const int64_t G = x.size(0), T = x.size(1);
    // unbind, not select: backward stacks the two gradients once instead of
    // filling a zero tensor of both for each.
    const auto parts = project_for_core(kv_, x).view({G, T, 2, heads_, dh_}).unbind(2);  // (G, T, h, dh) each
    auto v = parts[1].transpose(1, 2);
    // The projection's dtype decides, not x's: under autocast x is fp32 and
    // the projection may be bf16.
    if (rope_ && fuses(parts[0])) {
      const auto& [cos, sin] = rope_table(T, parts[0]);
      return {chiar_attention::rotary(parts[0], cos, sin, {}, 1.0, /*keys_transposed=*/true), v};
    }
    auto k = rotate(parts[0].transpose(1, 2), at::Tensor(), T);  // (G, h, T, dh)
    // SDPA reads k row by row (its kernels want a unit last stride): kt as
    // a view, so that kt.transpose(2, 3) is k again without a copy.
    return {sdpa_for(k) ? k.contiguous().transpose(2, 3) : k.transpose(2, 3).contiguous(), v};
  }

  // x: (G, h, L, dh) rotated (and scaled) at positions pos: (G or 1, 1, L)
  // int64 in [0, T), or undefined for 0 .. L-1.
  at::Tensor rotate(const at::Tensor& x, const at::Tensor& pos, int64_t T, double scale = 1.0) const {
    if (!rope_) return x;
    const int64_t half = dh_ / 2;
    const auto& [cos, sin] = rope_table(T, x);
    at::Tensor c, s;  // (G|1, 1, L, half)
    if (pos.defined()) {
      std::vector<int64_t> shape(pos.sizes().begin(), pos.sizes().end());
      shape.push_back(half);
      c = cos.index_select(0, pos.reshape({-1})).view(shape);
      s = sin.index_select(0, pos.reshape({-1})).view(shape);
    } else {
      c = cos.narrow(0, 0, x.size(2)).view({1, 1, x.size(2), half});
      s = sin.narrow(0, 0, x.size(2)).view({1, 1, x.size(2), half});
    }
    if (scale != 1.0) c = c * scale, s = s * scale;
    auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    return at::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1);
  }

  // cos and sin of the angles of positions 0 .. >= T-1, (L, dh/2) each, in
  // x's dtype (fp32 for the fused core's bf16, which RoPE turns in fp32) and
  // device: computed in double once, then reused.
  std::pair<at::Tensor, at::Tensor> rope_table(int64_t T, const at::Tensor& x) const {
    const auto type = x.scalar_type() == at::kBFloat16 && fuses(x) ? at::kFloat : x.scalar_type();
    if (!rope_cos_.defined() || rope_cos_.size(0) < T || rope_cos_.scalar_type() != type ||
        rope_cos_.device() != x.device()) {
      const int64_t half = dh_ / 2;
      const auto f64 = x.options().dtype(at::kDouble);
      auto inv_freq = at::exp(at::arange(half, f64) * (-2.0 * std::log(rope_base_) / static_cast<double>(dh_)));
      auto angle = at::arange(T, f64).unsqueeze(1) * inv_freq;  // (T, half)
      rope_cos_ = angle.cos().to(type);
      rope_sin_ = angle.sin().to(type);
    }
    return {rope_cos_, rope_sin_};
  }

  // (start, count, sequence, keys) quadruples as the (S, 4) tensor
  // fused_attention_rows takes.
  static at::Tensor as_segments(const std::vector<int64_t>& flat) {
    return at::tensor(flat, at::TensorOptions().dtype(at::kLong)).view({-1, 4});
  }

  // Rows packed per sequence: q (n, h, dh) at positions t (n,), grouped by g
  // into sequences whose keys and values are kt (G, h, dh, >= e), v (G, h,
  // >= e, dh); keys from mask_from on are masked beyond each query's
  // position. Returns (n, d).
  at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v, const at::Tensor& t,
                         const RowGroups& g, int64_t e, int64_t mask_from, const at::Tensor& valid,
                         bool recompute) const {
    auto qp = pack_rows(q, g).transpose(1, 2);  // (G, h, m, dh)
    auto qpos = pack_rows(t, g).view({g.count, 1, g.width, 1});
    at::Tensor o;  // (G, h, m, dh)
    if (fuses(qp)) {
      chiar::count_host_kernel();
      // Masking from key 0 rather than mask_from changes nothing: no real
      // query is before mask_from - 1, and padding slots are dropped.
      o = chiar_attention::fused_attention(qp, kt.narrow(3, 0, e), first_keys(v, e),
                                           mask_from < e ? qpos : at::Tensor(), valid, 0);
    } else {
      o = attend(qp, kt.narrow(3, 0, e).transpose(2, 3), first_keys(v, e), qpos, mask_from, valid, recompute);
    }
    return unpack_rows(o.transpose(1, 2), g).reshape({-1, d_});
  }

  // q: (G, h, m, dh), already scaled; k, v: (G, h, e, dh); qpos, mask_from,
  // valid: see masked_scores. Returns (G, h, m, dh). SDPA takes it in one
  // call. The chunked core works in chunks of sequences x query rows whose
  // weights (G', h, rows, e) stay within chunk_mib (32 MiB):
  // glibc serves blocks up to that size from its heap and reuses them, where
  // larger ones are mapped and page-faulted afresh each time (or, with mmap
  // off, fragment the heap). Sequences are split before rows, which keeps the
  // products at up to `block` rows. With recompute_weights, training keeps no
  // weights for backward.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& qpos,
                    int64_t mask_from, const at::Tensor& valid, bool recompute_weights) const {
    if (sdpa_for(q))
      return chiar_attention::sdpa_attention(q, k, v, false, mask_from < k.size(2) ? qpos : at::Tensor(), valid);
    const bool recompute = recompute_weights && torch::autograd::GradMode::is_enabled() &&
                           (q.requires_grad() || k.requires_grad() || v.requires_grad());
    const int64_t G = q.size(0), m = q.size(2);
    const auto kChunkBytes = static_cast<int64_t>(chunk_mib_ * 1024 * 1024);
    const int64_t row_bytes = std::max<int64_t>(1, q.size(1) * k.size(2) * 4);  // one query row of one sequence
    const int64_t rows = std::clamp<int64_t>(kChunkBytes / row_bytes, 1, std::min(block_, m));
    const int64_t seqs = std::clamp<int64_t>(kChunkBytes / (row_bytes * rows), 1, G);
    const auto none = at::empty({0}, q.options().dtype(at::kLong));  // "no tensor" for the autograd function
    const bool padded = valid.defined() && valid.numel() > 0;
    // split, not a narrow per piece: backward then assembles each input's
    // gradient once, where every narrow would add a zero-filled full-size
    // tensor of its own (32 x 32 of them per layer at T 4096, batch 32).
    const auto pieces = [](const at::Tensor& t, int64_t size, int64_t dim) {
      return size >= t.size(dim) ? std::vector<at::Tensor>{t} : t.split(size, dim);
    };
    const bool per_sequence_pos = qpos.defined() && qpos.size(0) == G && G > 1;
    const auto qgs = pieces(q, seqs, 0), kgs = pieces(k, seqs, 0), vgs = pieces(v, seqs, 0);
    const auto pgs = per_sequence_pos ? pieces(qpos, seqs, 0) : std::vector<at::Tensor>(qgs.size(), qpos);
    const auto validgs = padded ? pieces(valid, seqs, 0) : std::vector<at::Tensor>(qgs.size(), at::Tensor());
    std::vector<at::Tensor> slices;  // (G', h, m, dh) per slice of sequences
    for (size_t g = 0; g < qgs.size(); ++g) {
      const auto& kg = kgs[g];
      const auto& vg = vgs[g];
      const auto& pg = pgs[g];
      const auto& validg = validgs[g];
      const auto qcs = pieces(qgs[g], rows, 2);
      const auto pcs = pg.defined() && pg.size(2) == m ? pieces(pg, rows, 2) : std::vector<at::Tensor>(qcs.size(), pg);
      std::vector<at::Tensor> chunks;
      for (size_t c = 0; c < qcs.size(); ++c)
        chunks.push_back(recompute ? RecomputedAttention::apply(qcs[c], kg, vg, pcs[c].defined() ? pcs[c] : none,
                                                                mask_from, validg.defined() ? validg : none)
                                   : attend_stored(qcs[c], kg, vg, pcs[c], mask_from, validg));
      slices.push_back(chunks.size() == 1 ? chunks[0] : at::cat(chunks, 2));
    }
    return slices.size() == 1 ? slices[0] : at::cat(slices, 0);
  }

  int64_t d_, heads_, block_, dh_ = 0;
  double recompute_mib_;                    // recompute the weights when one sequence's would take more
  double chunk_mib_;                        // the most weights one chunk of attend() materialises
  mutable at::Tensor rope_cos_, rope_sin_;  // (L, dh/2) cache of rope_table
  bool rope_;
  double rope_base_;
  Core core_;  // which code computes softmax(q k^T + mask) v (see the top of this file)
  torch::nn::Linear q_{nullptr}, kv_{nullptr}, out_{nullptr};  // (d->d), (d->2d), (d->d)
  SublayerNorm norm_;
};

void register_plugin(Registrar& r) {
  r.add_operator("attention", "multi-head self-attention with RoPE, causal or padding-masked, O(T^2 d)",
                 [](const OperatorSpec& spec) { return std::make_unique<AttentionOperator>(spec); }, {"attn"});
  r.declare_options("operator", "attention",
                    {{"heads", ParamKind::Int, "model.n_heads", "attention heads; d_model must be a multiple"},
                     {"core", ParamKind::String, "auto",
                      "the code computing softmax(q k^T + mask) v: auto, fused, sdpa "
                      "(libtorch 2.1 or newer) or chunked"},
                     {"block", ParamKind::Int, "128", "query positions per block of causal attention"},
                     {"chunk_mib", ParamKind::Number, "32", "most MiB of attention weights per chunk (core chunked)"},
                     {"recompute_mib", ParamKind::Number, "64",
                      "weights above this many MiB are recomputed in backward instead of stored (core chunked)"},
                     {"rope", ParamKind::Bool, "true", "rotary positions on queries and keys"},
                     {"rope_base", ParamKind::Number, "10000", "RoPE frequency base"}});
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
