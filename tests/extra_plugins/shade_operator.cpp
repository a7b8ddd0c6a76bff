// shade: an operator the harness has never heard of, built apart from the
// in-tree plugins, with its own display name, colour and role, so tests can
// show that inspection, charts and benchmarks present it without a harness
// edit. Each position adds a projection of the mean of the real positions it
// may read: y = LN(x + W mean(x)), prefix means when causal.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

class Shade final : public Operator {
 public:
  explicit Shade(const OperatorSpec& spec) : d_(spec.d_model) {
    linear_ = register_module("linear", torch::nn::Linear(d_, d_));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_})));
  }

  at::Tensor forward(const at::Tensor& x, const OpContext& ctx) override { return norm_(x + linear_(means(x, ctx))); }

  // Every position's mean is needed anyway; the rows are picked from them.
  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    return forward(x, ctx).reshape({-1, d_}).index_select(0, rows);
  }

  FlopCount flops(int64_t T, int64_t n, int64_t d) const override {
    return elementwise_flops(T, d, 3) + elementwise_flops(T, d, 3) + matmul_flops(T, d, d) + layernorm_flops(T, d) +
           elementwise_flops(n, d);
  }

  OperatorTraits traits() const override {
    OperatorTraits t;
    t.display_name = "Shade";
    t.colour = "#f5e6a3";  // a pale yellow: ANSI yellow in a terminal
    t.role = OperatorRole::IntermediateMixing;
    return t;
  }

  std::string describe() const override { return "shade"; }

 private:
  // (B, T, d): per position the mean of the real positions it reads.
  at::Tensor means(const at::Tensor& x, const OpContext& ctx) const {
    const auto w = ctx.valid.defined() ? ctx.valid.to(x.scalar_type()).unsqueeze(-1)
                                       : at::ones_like(x.narrow(-1, 0, 1));  // (B, T, 1)
    const auto xw = x * w;
    if (ctx.causal) return xw.cumsum(1) / w.cumsum(1).clamp_min(1);
    return (xw.sum(1, true) / w.sum(1, true).clamp_min(1)).expand_as(x);
  }

  int64_t d_;
  torch::nn::Linear linear_{nullptr};  // (d -> d)
  torch::nn::LayerNorm norm_{nullptr};
};

void register_plugin(Registrar& r) {
  r.add_operator("shade", "test operator: projected means of the readable positions",
                 [](const OperatorSpec& spec) { return std::make_unique<Shade>(spec); });
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
