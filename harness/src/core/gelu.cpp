#include "chiar/gelu.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <string>
#include <vector>

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

// bf16 rows (as bits) through the fp32 kernels, in chunks that stay in L1:
// widened (exactly), computed in fp32, rounded once. The bias add and the
// GELU then run in fp32, where libtorch's bf16 path rounds u + b first. One
// loop over both types ran at half the fp32 kernel's vector width (GCC sizes
// its lanes by the 16-bit type) and took 3x the fp32 pass; widening element
// by element through c10::BFloat16 stayed scalar (bench-train --op-times,
// chiar::bias_gelu at the anchor).
constexpr int64_t kChunk = 512;

void bias_gelu_row_bf16(const uint16_t* u, const float* b, uint16_t* out, int64_t n) {
  float z[kChunk];
  for (int64_t s = 0; s < n; s += kChunk) {
    const int64_t len = std::min(kChunk, n - s);
    widen_bf16(u + s, z, len);
    bias_gelu_row(z, b + s, z, len);
    round_to_bf16(z, out + s, len);
  }
}

// gz rounded to bf16, the column sums from the unrounded terms.
void bias_gelu_backward_row_bf16(const uint16_t* u, const float* b, const uint16_t* g, uint16_t* gz, float* sums,
                                 int64_t n) {
  float ur[kChunk], gr[kChunk], gzr[kChunk];
  for (int64_t s = 0; s < n; s += kChunk) {
    const int64_t len = std::min(kChunk, n - s);
    widen_bf16(u + s, ur, len);
    widen_bf16(g + s, gr, len);
    bias_gelu_backward_row(ur, b + s, gr, gzr, sums + s, len);
    round_to_bf16(gzr, gz + s, len);
  }
}

// fp32 or bf16 u (bf16: the FFN under bf16 autocast, whose up projection
// gives bf16), an fp32 bias, on the CPU. Autocast leaves a GELU in its
// input's type, as this does.
bool fast_path(const at::Tensor& u, const at::Tensor& bias) {
  return host_kernels_enabled() && u.device().is_cpu() &&
         (u.scalar_type() == at::kFloat || u.scalar_type() == at::kBFloat16) && fp32_cpu(bias);
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
void forward_rows(const c10::BFloat16* u, const float* bias, c10::BFloat16* out, int64_t rows, int64_t n) {
  const auto* ub = reinterpret_cast<const uint16_t*>(u);
  auto* ob = reinterpret_cast<uint16_t*>(out);
  for_each_row(rows, n, [&](int64_t r) { bias_gelu_row_bf16(ub + r * n, bias, ob + r * n, n); });
}

// u (..., n) of type T contiguous, out likewise.
void forward_into(const at::Tensor& u, const at::Tensor& bias, at::Tensor& out) {
  const int64_t n = u.size(-1), rows = n > 0 ? u.numel() / n : 0;
  if (u.scalar_type() == at::kBFloat16)
    forward_rows(u.data_ptr<c10::BFloat16>(), bias.data_ptr<float>(), out.data_ptr<c10::BFloat16>(), rows, n);
  else
    forward_rows(u.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), rows, n);
}

// gu = g gelu'(u + b) in u's type, into gu; returns the bias gradient (n)
// fp32, summed from the unrounded terms. u, g, gu (rows, n) contiguous.
at::Tensor backward_into(const at::Tensor& u, const at::Tensor& bias, const at::Tensor& g, at::Tensor& gu) {
  const int64_t n = u.size(-1), rows = n > 0 ? u.numel() / n : 0;
  const float* bp = bias.data_ptr<float>();
  if (u.scalar_type() == at::kFloat) {
    const float* up = u.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* out = gu.data_ptr<float>();
    return for_each_row_with_sums(rows, n, bias.options(), [&](int64_t r, float* sums) {  // (n)
      bias_gelu_backward_row(up + r * n, bp, gp + r * n, out + r * n, sums, n);
    });
  }
  const auto* up = reinterpret_cast<const uint16_t*>(u.data_ptr<c10::BFloat16>());
  const auto* gp = reinterpret_cast<const uint16_t*>(g.data_ptr<c10::BFloat16>());
  auto* out = reinterpret_cast<uint16_t*>(gu.data_ptr<c10::BFloat16>());
  return for_each_row_with_sums(rows, n, bias.options(), [&](int64_t r, float* sums) {  // (n)
    bias_gelu_backward_row_bf16(up + r * n, bp, gp + r * n, out + r * n, sums, n);
  });
}

struct BiasGelu : public torch::autograd::Function<BiasGelu> {
  // u (..., n) fp32 or bf16 contiguous, bias (n) fp32 contiguous.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& u, const at::Tensor& bias) {
    ctx->save_for_backward({u, bias});
    auto out = at::empty_like(u);
    forward_into(u, bias, out);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &u = saved[0], &bias = saved[1];
    if (torch::autograd::GradMode::is_enabled()) {
      // create_graph: a differentiable backward from libtorch's ops.
      const auto gu = at::gelu_backward(grads[0], u + bias.to(u.scalar_type()));
      return {gu, gu.reshape({-1, bias.size(0)}).sum(0).to(bias.scalar_type())};
    }
    const auto g = grads[0].to(u.scalar_type()).contiguous();  // (..., n)
    auto gu = at::empty_like(u);
    auto gb = backward_into(u, bias, g, gu);
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
  forward_into(u, bias.contiguous(), u);
  u.unsafeGetTensorImpl()->bump_version();  // written in place, as at::gelu_ would mark it
  return u;
}

}  // namespace chiar
