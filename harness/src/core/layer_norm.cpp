#include "chiar/layer_norm.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autocast_compat.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/row_kernels.h"  // CHIAR_ROW_KERNEL
#include "row_passes.h"

namespace chiar {

namespace {

// y = (x - mean) rstd w + b for one row; returns mean and rstd. Two passes
// for the moments (the row is in L1), so the variance does not cancel.
CHIAR_ROW_KERNEL void norm_row(const float* __restrict x, const float* __restrict w, const float* __restrict b,
                               float* __restrict y, int64_t n, float eps, float* mean_out, float* rstd_out) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const float mean = sum / static_cast<float>(n);
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < n; ++j) {
    const float c = x[j] - mean;
    squares += c * c;
  }
  const float rstd = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mean) * rstd * w[j] + b[j];
  *mean_out = mean;
  *rstd_out = rstd;
}

// With xhat = (x - mean) rstd and g = dy w:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),
// and the row's dy xhat and dy added to the weight and bias sums.
CHIAR_ROW_KERNEL void norm_backward_row(const float* __restrict x, const float* __restrict dy,
                                        const float* __restrict w, float mean, float rstd, float* __restrict dx,
                                        float* __restrict dw, float* __restrict db, int64_t n) {
  float g_sum = 0.f, gx_sum = 0.f;
#pragma omp simd reduction(+ : g_sum, gx_sum)
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    const float g = dy[j] * w[j];
    g_sum += g;
    gx_sum += g * xhat;
    dw[j] += dy[j] * xhat;
    db[j] += dy[j];
  }
  const float g_mean = g_sum / static_cast<float>(n), gx_mean = gx_sum / static_cast<float>(n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (dy[j] * w[j] - g_mean - xhat * gx_mean);
  }
}

// x (..., n), weight (n), bias (n) fp32 contiguous -> y (..., n); *stats
// (2, rows): each row's mean and 1 / sqrt(var + eps).
at::Tensor normalize_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps,
                          at::Tensor* stats) {
  const int64_t n = x.size(-1), rows = n > 0 ? x.numel() / n : 0;
  auto y = at::empty_like(x);
  *stats = at::empty({2, rows}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* mean = stats->data_ptr<float>();
  float* rstd = mean + rows;
  for_each_row(rows, n, [&](int64_t r) {
    norm_row(xp + r * n, wp, bp, yp + r * n, n, static_cast<float>(eps), mean + r, rstd + r);
  });
  return y;
}

struct FusedLayerNorm : public torch::autograd::Function<FusedLayerNorm> {
  // x (..., n), weight (n), bias (n): fp32 contiguous.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    at::Tensor stats;  // (2, rows): mean, rstd
    auto y = normalize_rows(x, weight, bias, eps, &stats);
    ctx->save_for_backward({x, weight, bias, stats});
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &stats = saved[3];
    const int64_t n = x.size(-1), rows = n > 0 ? x.numel() / n : 0;
    if (torch::autograd::GradMode::is_enabled()) {
      // create_graph: the same gradients from differentiable ops.
      const double eps = ctx->saved_data["eps"].toDouble();
      const auto& dy = grads[0];
      const auto centred = x - x.mean(-1, true);
      const auto rstd = (centred.pow(2).mean(-1, true) + eps).rsqrt();
      const auto xhat = centred * rstd;
      const auto g = dy * weight;
      const auto dx = rstd * (g - g.mean(-1, true) - xhat * (g * xhat).mean(-1, true));
      return {dx, (dy * xhat).reshape({-1, n}).sum(0), dy.reshape({-1, n}).sum(0), at::Tensor()};
    }
    const auto dy = grads[0].contiguous();
    auto dx = at::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* dyp = dy.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* mean = stats.data_ptr<float>();
    const float* rstd = mean + rows;
    float* dxp = dx.data_ptr<float>();
    // The weight's sums, then the bias's: (2 n).
    const auto sums = for_each_row_with_sums(rows, 2 * n, x.options(), [&](int64_t r, float* dw_db) {
      norm_backward_row(xp + r * n, dyp + r * n, wp, mean[r], rstd[r], dxp + r * n, dw_db, dw_db + n, n);
    });
    return {dx, sums.narrow(0, 0, n), sums.narrow(0, n, n), at::Tensor()};
  }
};

}  // namespace

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  RECORD_FUNCTION("chiar::layer_norm", std::vector<c10::IValue>({x, weight, bias}));
  if (!x.defined() || !weight.defined() || !bias.defined() || x.dim() < 1 || weight.dim() != 1 || bias.dim() != 1 ||
      weight.size(0) != x.size(-1) || bias.size(0) != x.size(-1))
    throw UserError("layer_norm: input " + (x.defined() ? c10::str(x.sizes()) : std::string("undefined")) +
                    ", weight " + (weight.defined() ? c10::str(weight.sizes()) : std::string("undefined")) +
                    " and bias " + (bias.defined() ? c10::str(bias.sizes()) : std::string("undefined")) +
                    " are not (..., n), (n) and (n)");
  // Under autocast too: autocast runs a LayerNorm of fp32 input in fp32 (the
  // residual stream a bf16 step keeps in fp32), which is what this computes.
  if (!host_kernels_enabled() || !fp32_cpu(x) || !fp32_cpu(weight) || !fp32_cpu(bias) || x.size(-1) == 0)
    return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
  count_host_kernel();
  const bool wants_grad =
      torch::autograd::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || bias.requires_grad());
  if (!wants_grad) {
    // Inference: the kernel alone, without autograd's per-call bookkeeping
    // (a routed layer runs a LayerNorm per operator).
    at::Tensor stats;
    return normalize_rows(x.contiguous(), weight.contiguous(), bias.contiguous(), eps, &stats);
  }
  return FusedLayerNorm::apply(x.contiguous(), weight.contiguous(), bias.contiguous(), eps);
}

}  // namespace chiar
