// Multi-head self-attention with rotary positions (RoPE, half-split pairs:
// feature i rotates with feature i + dh/2 at frequency base^(-2i/dh)),
// causal for language modelling, key-padding-masked for classification;
// y = LN(x + W_o Attn(x)). forward_rows computes queries only for the selected
// rows, keys and values for every position of the sequences they belong to.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>

#include "chiar/error.h"
#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

class AttentionOperator final : public Operator {
 public:
  explicit AttentionOperator(const OperatorSpec& spec)
      : d_(spec.d_model),
        heads_(spec.params.get_int("heads", spec.n_heads)),
        rope_(spec.params.get_bool("rope", true)),
        rope_base_(spec.params.get_double("rope_base", 10000.0)) {
    if (heads_ < 1 || d_ % heads_ != 0)
      throw UserError("attention: d_model " + std::to_string(d_) + " is not divisible by heads " +
                      std::to_string(heads_));
    dh_ = d_ / heads_;
    if (rope_ && dh_ % 2 != 0)
      throw UserError("attention: RoPE needs an even head size, found " + std::to_string(dh_));
    q_ = register_module("q", torch::nn::Linear(d_, d_));
    kv_ = register_module("kv", torch::nn::Linear(d_, 2 * d_));
    out_ = register_module("out", torch::nn::Linear(d_, d_));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_})));
  }

  at::Tensor forward(const at::Tensor& x, const OpContext& ctx) override {
    const int64_t B = x.size(0), T = x.size(1);
    auto pos = at::arange(T, x.options().dtype(at::kLong)).view({1, 1, T});  // (1, 1, T)
    auto q = rotate(q_(x).view({B, T, heads_, dh_}).transpose(1, 2), pos);  // (B, h, T, dh)
    auto [k, v] = keys_values(x);                                           // (B, h, T, dh)
    auto o = attend(q, k, v, pos.view({1, 1, T, 1}), ctx.valid, ctx.causal);  // (B, h, T, dh)
    return norm_(x + out_(o.transpose(1, 2).reshape({B, T, d_})));
  }

  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows,
                          const OpContext& ctx) override {
    const int64_t T = x.size(1);
    auto xr = x.reshape({-1, d_}).index_select(0, rows);                // (N, d)
    const RowGroups g = group_rows(at::div(rows, T, "floor"));          // one group per sequence
    auto [k, v] = keys_values(x.index_select(0, g.keys));               // (G, h, T, dh)
    auto t = pack_rows(at::remainder(rows, T), g);                      // (G, m) query positions
    auto q = pack_rows(q_(xr), g)                                       // (G, m, d)
                 .view({g.count, g.width, heads_, dh_})
                 .transpose(1, 2);                                      // (G, h, m, dh)
    q = rotate(q, t.unsqueeze(1));
    auto valid = ctx.valid.defined() ? ctx.valid.index_select(0, g.keys) : at::Tensor();
    auto o = attend(q, k, v, t.view({g.count, 1, g.width, 1}), valid, ctx.causal);  // (G,h,m,dh)
    o = unpack_rows(o.transpose(1, 2).reshape({g.count, g.width, d_}), g);          // (N, d)
    return norm_(xr + out_(o));
  }

  FlopCount flops(int64_t T, int64_t n, int64_t d) const override {
    // forward_rows works per sequence that has rows: a sequence without any
    // computes nothing, not even its keys and values.
    if (n == 0) return {};
    const int64_t h = heads_;
    FlopCount f = matmul_flops(n, d, d) + matmul_flops(T, d, 2 * d) + matmul_flops(n, d, d);
    if (rope_) f += elementwise_flops(n + T, d, 3);
    // Scores and weighted values over all T keys (masked entries are computed
    // too), the 1/sqrt(dh) scale and the softmax.
    f += FlopCount{2 * n * T * d, 4 * n * T * d} * 2;
    f += FlopCount{6 * n * T * h, 3 * n * T * h};
    return f + elementwise_flops(n, d) + layernorm_flops(n, d);
  }

  OperatorTraits traits() const override { return {true, true, true}; }

  std::string describe() const override {
    std::string s = "attention(heads " + std::to_string(heads_);
    return s + (rope_ ? ", rope)" : ")");
  }

 private:
  std::pair<at::Tensor, at::Tensor> keys_values(const at::Tensor& x) {  // x: (G, T, d)
    const int64_t G = x.size(0), T = x.size(1);
    auto kv = kv_(x).view({G, T, 2, heads_, dh_}).permute({2, 0, 3, 1, 4});  // (2, G, h, T, dh)
    auto pos = at::arange(T, x.options().dtype(at::kLong)).view({1, 1, T});
    return {rotate(kv[0], pos), kv[1]};
  }

  // x: (G, h, L, dh); pos: (G or 1, 1, L) int64 positions of the L vectors.
  at::Tensor rotate(const at::Tensor& x, const at::Tensor& pos) const {
    if (!rope_) return x;
    const int64_t half = dh_ / 2;
    auto inv_freq = at::exp(at::arange(half, x.options()) * (-2.0 * std::log(rope_base_) /
                                                             static_cast<double>(dh_)));
    auto angle = pos.to(x.scalar_type()).unsqueeze(-1) * inv_freq;  // (G|1, 1, L, half)
    auto c = at::cos(angle), s = at::sin(angle);
    auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    return at::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1);
  }

  // q: (G, h, m, dh) at positions qpos (G|1, 1, m, 1); k, v: (G, h, T, dh);
  // valid: (G, T) bool or undefined. Returns (G, h, m, dh).
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& qpos, const at::Tensor& valid, bool causal) const {
    const int64_t T = k.size(2);
    // Scores, mask and softmax in fp32 whatever the autocast dtype: the lowest
    // float below does not fit bf16 or fp16, and the normalisation wants fp32.
    const auto wide = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    auto scores = at::matmul(q, k.transpose(-2, -1)).to(wide) *
                  (1.0 / std::sqrt(static_cast<double>(dh_)));
    at::Tensor masked;  // true where a key must not be read
    if (causal) masked = at::arange(T, qpos.options()).view({1, 1, 1, T}) > qpos;
    if (valid.defined()) {
      auto pad = valid.logical_not().view({valid.size(0), 1, 1, T});
      masked = masked.defined() ? masked.logical_or(pad) : pad;
    }
    // The lowest finite value rather than -inf: a row with every key masked
    // (a padding query) gets uniform weights instead of NaN.
    if (masked.defined())
      scores = scores.masked_fill(masked, std::numeric_limits<float>::lowest());
    return at::matmul(at::softmax(scores, -1).to(v.scalar_type()), v);
  }

  int64_t d_, heads_, dh_ = 0;
  bool rope_;
  double rope_base_;
  torch::nn::Linear q_{nullptr}, kv_{nullptr}, out_{nullptr};  // (d->d), (d->2d), (d->d)
  torch::nn::LayerNorm norm_{nullptr};
};

void register_plugin(Registrar& r) {
  r.add_operator("attention", "multi-head self-attention with RoPE, causal or padding-masked, O(T^2 d)",
                 [](const OperatorSpec& spec) { return std::make_unique<AttentionOperator>(spec); },
                 {"attn"});
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
