// DCT mixing: y = LN(x + iDCT(DCT(x) * w)) (pre-norm: x + iDCT(DCT(LN x) * w)),
// per token along the feature axis, with a learnable per-frequency filter w
// (d,) initialised to 1. Tokens are not mixed, so it is causal by
// construction and ignores padding.
#include <ATen/ATen.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

#include "chiar/layer_norm.h"
#include "chiar/linear.h"
#include "chiar/plugin.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"

namespace {

using namespace chiar;

class DctOperator final : public Operator {
 public:
  explicit DctOperator(const OperatorSpec& spec)
      : d_(spec.d_model),
        impl_(resolve_dct_impl(dct_impl_from_string(spec.params.get_string("dct_impl")), spec.d_model)) {
    filter_ = register_parameter("filter", at::ones({d_}));
    norm_ =
        SublayerNorm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_}))), spec.pre_norm);
  }

  // A supplied spectrum is x's; pre-norm transforms LN(x) instead.
  at::Tensor forward(const at::Tensor& x, const OpContext& ctx) override {
    return mix(x, uses_spectrum(ctx) ? ctx.spectrum : dct2(norm_.input(x), impl_));
  }

  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    // Every row (rows are strictly increasing): the same without the gathers.
    if (rows.size(0) == x.numel() / d_) return forward(x, ctx).reshape({-1, d_});
    auto xr = gather_rows(x.reshape({-1, d_}), rows);  // (N, d)
    auto cr = uses_spectrum(ctx) ? gather_rows(ctx.spectrum.reshape({-1, d_}), rows) : dct2(norm_.input(xr), impl_);
    return mix(xr, cr);
  }

  FlopCount flops(int64_t, int64_t n_rows, int64_t d) const override {
    // Two transforms, the filter, the residual and the LayerNorm, per row.
    return transform_flops(n_rows, d) * 2 + elementwise_flops(n_rows, d, 2) + layernorm_flops(n_rows, d);
  }

  FlopCount flops_at(int64_t T, const std::vector<int64_t>& positions, int64_t d,
                     const FlopContext& ctx) const override {
    const auto n = static_cast<int64_t>(positions.size());
    return flops(T, n, d) - (ctx.spectrum && !norm_.pre() ? transform_flops(n, d) : FlopCount{});
  }

  OperatorTraits traits() const override {
    OperatorTraits t;
    t.mixes_tokens = false;
    t.display_name = "DCT";
    t.colour = "#cfe3f7";
    t.role = OperatorRole::CheapMixing;
    t.pre_norm = true;
    return t;
  }

  std::string describe() const override { return std::string("dct(filter, ") + to_string(impl_) + ")"; }

 private:
  bool uses_spectrum(const OpContext& ctx) const { return ctx.spectrum.defined() && !norm_.pre(); }

  FlopCount transform_flops(int64_t n_rows, int64_t d) const {
    FlopCount transform;
    if (impl_ == DctImpl::Gemm) {
      transform = matmul_flops(n_rows, d, d, /*weight_grad=*/false);
    } else {
      const auto log2d = static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(d))));
      const int64_t f = n_rows * (5 * d * log2d + 8 * d);  // complex FFT + twiddles
      transform = {f, f};
    }
    return transform;
  }

  // x: (..., d) and the spectrum c of x, or of LN(x) pre-norm: (..., d) -> (..., d).
  at::Tensor mix(const at::Tensor& x, const at::Tensor& c) {
    if (impl_ != DctImpl::Gemm) return norm_.output(x + idct2(c * filter_, impl_));
    // idct2(c * w) + x = (c * w) B + x, B the orthonormal basis (dct2(x) =
    // x B^T): the residual rides in the product's pass. Without gradients
    // w is folded into the basis too (d^2 multiplies instead of a pass over
    // every element; chiar_bench: dct/fwd/*); with them that would
    // cost a weight-gradient product, so the filter stays elementwise.
    // FLOPs are counted per element either way, as the definition has them.
    const auto basis_t = idct_basis(d_, c.scalar_type(), c.device());  // (d, d) = B^T
    if (at::GradMode::is_enabled() && (filter_.requires_grad() || c.requires_grad()))
      return norm_.output(chiar::linear(c * filter_, basis_t, {}, x));
    return norm_.output(chiar::linear(c, basis_t * filter_, {}, x));
  }

  int64_t d_;
  DctImpl impl_;
  at::Tensor filter_;  // (d,) per-frequency gain
  SublayerNorm norm_;
};

void register_plugin(Registrar& r) {
  r.add_operator("dct", "DCT mixing: per-token learnable frequency filter, O(d^2) or O(d log d)",
                 [](const OperatorSpec& spec) { return std::make_unique<DctOperator>(spec); });
  r.declare_options("operator", "dct",
                    {{"dct_impl", ParamKind::String, "auto",
                      "how the DCT runs: gemm, fft, or auto (gemm below d_model 1024, fft from there)"}});
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
