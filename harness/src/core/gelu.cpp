#include "chiar/gelu.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "autocast_compat.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/row_kernels.h"  // CHIAR_ROW_KERNEL
#include "exp_kernel.h"
#include "row_passes.h"

namespace chiar {

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// Phi(z) and exp(-z^2 / 2). erfc(a) for a = |z| / sqrt 2 >= 0 by Abramowitz
// and Stegun 7.1.26 (absolute error < 1.5e-7): t = 1 / (1 + p a),
// erfc(a) ~ t (a1 + t (a2 + ...)) exp(-a^2). Phi(-|z|) = erfc(a) / 2 comes
// from it directly, Phi(|z|) = 1 - Phi(-|z|): no 1 + erf(x) cancelling to
// nothing for negative z.
inline void normal_cdf(float z, float& cdf, float& gauss) {
  const float a = (z < 0.f ? -z : z) * kInvSqrt2;
  const float t = 1.f / (1.f + 0.3275911f * a);
  const float poly =
      ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  gauss = exp_nonpositive(-a * a);
  const float tail = 0.5f * poly * gauss;
  cdf = z < 0.f ? tail : 1.f - tail;
}

// out[j] = gelu(u[j] + b[j]); out may be u.
CHIAR_ROW_KERNEL void bias_gelu_row(const float* u, const float* __restrict b, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float z = u[j] + b[j];
    float cdf, gauss;
    normal_cdf(z, cdf, gauss);
    out[j] = z * cdf;
  }
}

// gz[j] = g[j] gelu'(u[j] + b[j]), gelu'(z) = Phi(z) + z phi(z); column sums
// of gz accumulate into sums.
CHIAR_ROW_KERNEL void bias_gelu_backward_row(const float* __restrict u, const float* __restrict b,
                                             const float* __restrict g, float* __restrict gz, float* __restrict sums,
                                             int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float z = u[j] + b[j];
    float cdf, gauss;
    normal_cdf(z, cdf, gauss);
    const float d = g[j] * (cdf + z * gauss * kInvSqrt2Pi);
    gz[j] = d;
    sums[j] += d;
  }
}

bool fast_path(const at::Tensor& u, const at::Tensor& bias) {
  return host_kernels_enabled() && fp32_cpu(u) && fp32_cpu(bias) && !autocast::any_enabled();
}

void check(const at::Tensor& u, const at::Tensor& bias) {
  if (!u.defined() || !bias.defined() || u.dim() < 1 || bias.dim() != 1 || bias.size(0) != u.size(-1))
    throw UserError("bias_gelu: input " + (u.defined() ? c10::str(u.sizes()) : std::string("undefined")) +
                    " and bias " + (bias.defined() ? c10::str(bias.sizes()) : std::string("undefined")) +
                    " are not (..., n) and (n)");
}

// u, out (rows, n) contiguous (out may be u), bias (n) contiguous.
void forward_rows(const float* u, const float* bias, float* out, int64_t rows, int64_t n) {
  for_each_row(rows, n, [&](int64_t r) { bias_gelu_row(u + r * n, bias, out + r * n, n); });
}

struct BiasGelu : public torch::autograd::Function<BiasGelu> {
  // u (..., n) fp32 contiguous, bias (n) fp32 contiguous.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& u, const at::Tensor& bias) {
    ctx->save_for_backward({u, bias});
    auto out = at::empty_like(u);
    const int64_t n = u.size(-1);
    forward_rows(u.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), n > 0 ? u.numel() / n : 0, n);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &u = saved[0], &bias = saved[1];
    if (torch::autograd::GradMode::is_enabled()) {
      // create_graph: a differentiable backward from libtorch's ops.
      const auto gu = at::gelu_backward(grads[0], u + bias);
      return {gu, gu.reshape({-1, bias.size(0)}).sum(0)};
    }
    const auto g = grads[0].contiguous();  // (..., n)
    const int64_t n = u.size(-1), rows = n > 0 ? u.numel() / n : 0;
    auto gu = at::empty_like(u);
    const float* up = u.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* out = gu.data_ptr<float>();
    auto gb = for_each_row_with_sums(rows, n, u.options(), [&](int64_t r, float* sums) {  // (n)
      bias_gelu_backward_row(up + r * n, bp, gp + r * n, out + r * n, sums, n);
    });
    return {gu, ctx->needs_input_grad(1) ? gb : at::Tensor()};
  }
};

}  // namespace

at::Tensor bias_gelu(const at::Tensor& u, const at::Tensor& bias) {
  RECORD_FUNCTION("chiar::bias_gelu", std::vector<c10::IValue>({u, bias}));
  check(u, bias);
  if (!fast_path(u, bias)) return at::gelu(u + bias.to(u.scalar_type()));
  count_host_kernel();
  return BiasGelu::apply(u.contiguous(), bias.contiguous());
}

at::Tensor& bias_gelu_(at::Tensor& u, const at::Tensor& bias) {
  RECORD_FUNCTION("chiar::bias_gelu_", std::vector<c10::IValue>({u, bias}));
  check(u, bias);
  at::NoGradGuard no_grad;
  if (!fast_path(u, bias) || !u.is_contiguous()) {
    u.add_(bias.to(u.scalar_type()));
    at::gelu_(u);
    return u;
  }
  const auto b = bias.contiguous();
  const int64_t n = u.size(-1);
  forward_rows(u.data_ptr<float>(), b.data_ptr<float>(), u.data_ptr<float>(), n > 0 ? u.numel() / n : 0, n);
  u.unsafeGetTensorImpl()->bump_version();  // written in place, as at::gelu_ would mark it
  return u;
}

}  // namespace chiar
