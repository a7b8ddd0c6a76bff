#include "chiar/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "autocast_compat.h"
#include "chunked_cross_entropy.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/linear.h"
#include "chiar/row_kernels.h"
#include "row_passes.h"

namespace chiar {

namespace {

constexpr int64_t kBufferBytes = int64_t{256} << 20;

// The head's three products on the block's operands: fp32 on the process's
// GEMM library, or bf16 operands summed in fp32 (gemm_bf16). In the bf16 case
// the logits' gradient is rounded to bf16 once, per row, for the two
// backward products; the logits, their softmax and the weight's gradient,
// summed over blocks, stay fp32. packed_b: B packed for the bf16 kernels
// (gemm_bf16_pack_b), or undefined.
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc, const at::Tensor& /*packed_b*/ = {}) {
  sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
}
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const c10::BFloat16* a, int64_t lda,
             const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc, const at::Tensor& packed_b = {}) {
  gemm_bf16_packed_b(ta, tb, m, n, k, 1.f, a, lda, b, ldb, packed_b, beta, c, ldc);
}

// The block loop of the fused head on operands of type In (float or bf16):
// the loss's terms into nll, and the gradients (fp32) when they are defined.
//   h (N, d), w (V, d) of type In, contiguous; grad_hidden (N, d), grad_weight (V, d) fp32
template <typename In>
void fused_head_blocks(const In* h, const In* w, int64_t N, int64_t d, int64_t V, const int64_t* target,
                       const float* tw, float mean_weight, int64_t rows, std::vector<float>& nll,
                       at::Tensor& grad_hidden, at::Tensor& grad_weight) {
  constexpr bool fp32 = std::is_same<In, float>::value;
  const bool want_grads = grad_hidden.defined();
  auto buffer = at::empty({rows, V}, at::kFloat);  // (rows, V) logits, then their gradient
  float* logits = buffer.data_ptr<float>();
  // (rows, V): the gradient in In for the backward products (bf16 only).
  const auto rounded = fp32 || !want_grads ? at::Tensor() : at::empty({rows, V}, at::kBFloat16);
  const In* g = fp32 ? reinterpret_cast<const In*>(logits)
                     : (rounded.defined() ? reinterpret_cast<const In*>(rounded.data_ptr()) : nullptr);
  // bf16: w packed once as the logits' product reads it (w^T) and as the
  // hidden gradient's does (w), instead of by each product
  // (chiar_bench product_bf16/packed_b/2048/256/8192/*: 1.23x and 1.12x).
  // Only a block of multiples of 32 rows reads them (gemm_bf16_packed_b).
  at::Tensor w_for_logits, w_for_hidden;
  if constexpr (!fp32) {
    if (rows % 32 == 0) {
      w_for_logits = gemm_bf16_pack_b(/*trans_b=*/true, V, d, w, d);
      if (want_grads) w_for_hidden = gemm_bf16_pack_b(/*trans_b=*/false, d, V, w, d);
    }
  }
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    product(false, true, n, V, d, h + r0 * d, d, w, d, 0.f, logits, V, w_for_logits);
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* row = logits + i * V;
        // (V,) the row's gradient as the bf16 products read it (bf16 only)
        uint16_t* row_bf16 = rounded.defined() ? reinterpret_cast<uint16_t*>(rounded.data_ptr()) + i * V : nullptr;
        const int64_t r = r0 + i;
        bool finite = true;
        const float top = row_max(row, V, &finite);
        if (!finite) {
          nll[static_cast<size_t>(r)] = std::numeric_limits<float>::quiet_NaN();
          if (want_grads) std::fill(row, row + V, std::numeric_limits<float>::quiet_NaN());
          if (row_bf16) round_to_bf16(row, row_bf16, V);
        } else {
          const int64_t t = target[r];
          const float picked = row[t];
          const float sum = exp_shifted(row, V, top, 0.f);  // row = exp(logit - top)
          nll[static_cast<size_t>(r)] = (top - picked) + std::log(sum);
          if (want_grads) {  // d loss / d logits = w_r (softmax - one-hot)
            const float wr = tw ? tw[r] : mean_weight, scale = wr / sum;
            if (row_bf16) {  // normalised and rounded in one pass; the target's entry after
              scale_to_bf16(row, scale, row_bf16, V);
              const float at_target = row[t] * scale - wr;
              round_to_bf16(&at_target, row_bf16 + t, 1);
            } else {
              scale_row(row, V, scale);
              row[t] -= wr;
            }
          }
        }
      }
    });
    if (want_grads) {
      product(false, false, n, d, V, g, V, w, d, 0.f, grad_hidden.data_ptr<float>() + r0 * d, d, w_for_hidden);
      product(true, false, V, d, n, g, V, h + r0 * d, d, r0 > 0 ? 1.f : 0.f, grad_weight.data_ptr<float>(), d);
    }
  }
}

// The loss and, when wanted, its gradients, computed in forward (see the
// header); backward scales them by the incoming gradient.
struct FusedLinearCrossEntropy : public torch::autograd::Function<FusedLinearCrossEntropy> {
  // hidden (N, d), weight (V, d) contiguous, fp32 (bf16 too with
  // bf16_products); targets (N,) int64 contiguous in range; token_weights
  // (N,) fp32 contiguous, or empty with mean set. bf16_products: hidden and
  // weight rounded to bf16 for the products (bf16 autocast); the loss, sums
  // and gradients fp32 (autograd gives a bf16 input its gradient in bf16).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, const at::Tensor& token_weights, bool mean,
                            int64_t rows_per_pass, bool want_grads, bool bf16_products) {
    const int64_t N = hidden.size(0), d = hidden.size(1), V = weight.size(0);
    const int64_t* target = targets.data_ptr<int64_t>();
    const float* tw = mean ? nullptr : token_weights.data_ptr<float>();
    const float mean_weight = N > 0 ? 1.f / static_cast<float>(N) : 0.f;
    at::Tensor grad_hidden, grad_weight;  // (N, d), (V, d)
    if (want_grads) {
      grad_hidden = at::empty({N, d}, hidden.options().dtype(at::kFloat));
      grad_weight = N > 0 ? at::empty({V, d}, weight.options().dtype(at::kFloat))
                          : at::zeros({V, d}, weight.options().dtype(at::kFloat));
    }
    std::vector<float> nll(static_cast<size_t>(N));
    const int64_t rows = std::max<int64_t>(1, std::min(N, rows_per_pass));
    if (bf16_products) {
      const auto h = to_bf16(hidden), w = to_bf16(weight);  // (N, d), (V, d)
      fused_head_blocks(h.data_ptr<c10::BFloat16>(), w.data_ptr<c10::BFloat16>(), N, d, V, target, tw, mean_weight,
                        rows, nll, grad_hidden, grad_weight);
    } else {
      fused_head_blocks(hidden.data_ptr<float>(), weight.data_ptr<float>(), N, d, V, target, tw, mean_weight, rows, nll,
                        grad_hidden, grad_weight);
    }
    double loss = 0;
    for (int64_t r = 0; r < N; ++r) loss += static_cast<double>(tw ? tw[r] : mean_weight) * nll[static_cast<size_t>(r)];
    if (N == 0 && mean)
      loss = std::numeric_limits<double>::quiet_NaN();  // the mean of nothing; a sum over nothing is 0
    ctx->save_for_backward({grad_hidden, grad_weight});
    return at::full({}, loss, hidden.options().dtype(at::kFloat));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return scale_saved_gradients(ctx, grads, 8);
  }
};

// Every target in [0, V): libtorch's loss would read outside its row (and
// assert on a GPU). The GPU's block pass skips this (and its host round
// trip): it gives such a row NaN.
void check_targets(const at::Tensor& weight, const at::Tensor& targets) {
  const int64_t V = weight.size(0);
  const auto outside = ((targets < 0) | (targets >= V)).nonzero();  // (k, 1)
  if (outside.numel() > 0) {
    const int64_t row = outside[0][0].item<int64_t>();
    throw UserError("linear_cross_entropy: target " + std::to_string(targets[row].item<int64_t>()) + " of row " +
                    std::to_string(row) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
}

// Under bf16 autocast on the CPU the fused head takes bf16 products (what
// autocast would give the logits' product) with fp32 sums, softmax and
// gradients, instead of libtorch's plain path and its (N, V) logits.
bool bf16_autocast_on_cpu(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                          const at::Tensor& token_weights) {
  const auto float_or_bf16 = [](const at::Tensor& t) {
    return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  };
  return host_kernels_enabled() && autocast::enabled_dtype(at::kCPU) == at::kBFloat16 && float_or_bf16(hidden) &&
         float_or_bf16(weight) && targets.device().is_cpu() && (!token_weights.defined() || fp32_cpu(token_weights));
}

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                const at::Tensor& token_weights, int64_t rows_per_pass) {
  RECORD_FUNCTION("chiar::linear_cross_entropy", std::vector<c10::IValue>({hidden, weight}));
  check_head_inputs("linear_cross_entropy", hidden, weight, targets, token_weights);
  if (hidden.is_cuda() && kernel_policy() == KernelPolicy::Auto) {
    // A GPU's blocks of rows, the products in autocast's type where it is on
    // (which, like autocast, leaves fp64 alone); fp16 keeps the plain path,
    // whose logits' gradient a loss scale reaches.
    const at::ScalarType cast = autocast::enabled_dtype(at::kCUDA);
    const at::ScalarType compute =
        cast == at::ScalarType::Undefined || hidden.scalar_type() == at::kDouble ? hidden.scalar_type() : cast;
    if (compute != at::kHalf)
      return chunked_linear_cross_entropy(hidden, weight, targets, token_weights, compute, rows_per_pass);
  }
  check_targets(weight, targets);
  const bool bf16_products = bf16_autocast_on_cpu(hidden, weight, targets, token_weights);
  if (!bf16_products && (!host_kernels_enabled() || !fp32_cpu(hidden) || !fp32_cpu(weight) ||
                         (token_weights.defined() && !fp32_cpu(token_weights)) || !targets.device().is_cpu() ||
                         autocast::any_enabled())) {
    // fp64 stays fp64; anything else is normalised in fp32.
    auto logits = chiar::linear(hidden, weight);  // (N, V)
    if (logits.scalar_type() != at::kDouble) logits = logits.to(at::kFloat);
    auto nll = at::cross_entropy_loss(logits, targets, {}, at::Reduction::None);  // (N,)
    auto loss = token_weights.defined() ? (nll * token_weights.to(nll.scalar_type())).sum() : nll.mean();
    return loss.to(hidden.scalar_type());
  }
  const int64_t V = std::max<int64_t>(weight.size(0), 1);
  if (rows_per_pass <= 0)
    rows_per_pass = std::max<int64_t>(1, kBufferBytes / (V * static_cast<int64_t>(sizeof(float))));
  const bool want_grads = torch::autograd::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  count_host_kernel();
  return FusedLinearCrossEntropy::apply(
      hidden.contiguous(), weight.contiguous(), targets.contiguous(),
      token_weights.defined() ? token_weights.contiguous() : at::empty({0}, hidden.options().dtype(at::kFloat)),
      !token_weights.defined(), rows_per_pass, want_grads, bf16_products);
}

}  // namespace chiar
