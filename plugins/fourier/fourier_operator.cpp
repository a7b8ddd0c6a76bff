// FNet-style Fourier mixing: y = LN(x + Re(DFT_seq(DFT_features(x)))) (pre-norm:
// x + Re(DFT_seq(DFT_features(LN x)))), no
// parameters besides the LayerNorm. Every position mixes with every other, so
// it is not causal: the harness refuses it in language-modelling variants.
// Padding is honoured exactly: each sequence is transformed over its own real
// length L (padding is assumed to follow the real tokens), so the output at a
// real token does not depend on how much padding the batch added.
#include <ATen/ATen.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

#include "chiar/error.h"
#include "chiar/layer_norm.h"
#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

class FourierOperator final : public Operator {
 public:
  explicit FourierOperator(const OperatorSpec& spec) : d_(spec.d_model) {
    norm_ =
        SublayerNorm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_}))), spec.pre_norm);
  }

  at::Tensor forward(const at::Tensor& x, const OpContext& ctx) override {
    if (ctx.causal) throw UserError("fourier: the operator reads future tokens and cannot run causally");
    const auto in = norm_.input(x);  // (B, T, d)
    if (!ctx.valid.defined()) return norm_.output(x + mix(in));
    // Sequences of different real lengths: transform each over its own length.
    const int64_t B = x.size(0), T = x.size(1);
    // One host read, for the whole batch: the lengths size each transform.
    const auto lengths = ctx.valid.sum(1).to(at::kCPU, at::kLong).contiguous();  // (B,)
    const int64_t* length = lengths.data_ptr<int64_t>();
    std::vector<at::Tensor> rows;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = std::max<int64_t>(1, length[b]);
      auto xb = in[b].narrow(0, 0, L).unsqueeze(0);                        // (1, L, d)
      auto yb = mix(xb).squeeze(0);                                        // (L, d)
      if (L < T) yb = at::cat({yb, at::zeros({T - L, d_}, x.options())});  // padding rows: unspecified, zero
      rows.push_back(yb);
    }
    return norm_.output(x + at::stack(rows));
  }

  // Fourier mixing has no cheaper per-row form: the whole sequences of the
  // selected rows are transformed, then the rows picked.
  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    return gather_rows(forward(x, ctx).reshape({-1, d_}), rows);
  }

  FlopCount flops(int64_t T, int64_t n, int64_t d) const override {
    auto log2 = [](int64_t v) {
      return static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(std::max<int64_t>(v, 2)))));
    };
    // Complex FFTs of length d for T rows and of length T for d columns.
    const int64_t fft = 5 * T * d * (log2(d) + log2(T));
    // Pre-norm normalises every position before the transforms.
    return FlopCount{fft, fft} + elementwise_flops(n, d) + layernorm_flops(norm_.pre() ? T : n, d);
  }

  OperatorTraits traits() const override {
    OperatorTraits t;
    t.causal = false;
    t.display_name = "Fourier";
    t.colour = "#e7d3ee";
    t.role = OperatorRole::IntermediateMixing;
    t.pre_norm = true;
    return t;
  }
  std::string describe() const override { return "fourier(FNet)"; }

 private:
  at::Tensor mix(const at::Tensor& x) {  // (B, L, d) -> (B, L, d)
    return at::real(at::fft_fft(at::fft_fft(x, c10::nullopt, -1), c10::nullopt, 1));
  }

  int64_t d_;
  SublayerNorm norm_;
};

void register_plugin(Registrar& r) {
  r.add_operator("fourier", "FNet Fourier mixing over sequence and features; non-causal (classification only)",
                 [](const OperatorSpec& spec) { return std::make_unique<FourierOperator>(spec); });
  r.declare_options("operator", "fourier", {});
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
