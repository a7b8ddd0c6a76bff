// nan_at: a per-token operator that trains normally until its K-th forward
// call in training mode, and returns NaN from that call on, so the fault
// tests can make a run diverge at a known step without an absurd learning
// rate. y = LN(x + W x); K is the option `call` (1-based, default 1).
// Evaluation-mode calls (validation, test) are not counted: with one
// micro-batch per step and no router to calibrate, the K-th counted call is
// the forward of training step K.
#include <limits>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

class NanAt final : public Operator {
 public:
  explicit NanAt(const OperatorSpec& spec) : d_(spec.d_model), poisoned_call_(spec.params.get_int("call", 1)) {
    linear_ = register_module("linear", torch::nn::Linear(d_, d_));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_})));
  }

  at::Tensor forward(const at::Tensor& x, const OpContext&) override {
    const at::Tensor y = norm_(x + linear_(x));
    if (!is_training()) return y;
    ++training_calls_;
    // Added rather than filled in, so the NaN stays on the autograd graph the
    // trainer's loss and backward go through.
    return training_calls_ >= poisoned_call_ ? y + std::numeric_limits<double>::quiet_NaN() : y;
  }

  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    return forward(x, ctx).reshape({-1, d_}).index_select(0, rows);
  }

  FlopCount flops(int64_t T, int64_t n, int64_t d) const override {
    return matmul_flops(T, d, d) + elementwise_flops(T, d) + layernorm_flops(T, d) + elementwise_flops(n, d);
  }

  OperatorTraits traits() const override {
    OperatorTraits t;
    t.mixes_tokens = false;
    t.display_name = "NaN at call K";
    t.role = OperatorRole::CheapMixing;
    return t;
  }

  std::string describe() const override { return "nan_at(call=" + std::to_string(poisoned_call_) + ")"; }

 private:
  int64_t d_;
  int64_t poisoned_call_;  // the first training-mode call that returns NaN
  int64_t training_calls_ = 0;
  torch::nn::Linear linear_{nullptr};  // (d -> d)
  torch::nn::LayerNorm norm_{nullptr};
};

void register_plugin(Registrar& r) {
  r.add_operator("nan_at", "test operator: y = LN(x + W x), NaN from its K-th training forward (option call = K)",
                 [](const OperatorSpec& spec) { return std::make_unique<NanAt>(spec); });
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
