#include "chunked_cross_entropy.h"

#include "chiar/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar_build_info.h"
#if CHIAR_CUDA_KERNELS
#include "cuda_head.h"
#endif

namespace chiar {
namespace {

constexpr int64_t kBlockBytes = int64_t{256} << 20;
constexpr int64_t kPadRows = 64;  // the weight's rows as the products see them: a multiple of this

// The type a block's softmax and loss are computed in.
at::ScalarType accumulation_type(at::ScalarType compute) { return compute == at::kDouble ? at::kDouble : at::kFloat; }

// a b in their type, summed in fp32 when that is bf16, as a GPU's tensor
// cores sum (cuBLAS may add split-K partial sums in bf16). Without AVX-512,
// libtorch 1.13's CPU bf16 GEMM sums in bf16 unless b is transposed (512
// products of ones give 256), so on the CPU a bf16 product runs as the fp32
// product of the same values, rounded back. An fp32 operand is taken as it
// is: the bf16 weight widened once per call, not once per block.
at::Tensor product(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kBFloat16 && a.device().is_cpu())
    return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(at::kBFloat16);
  return at::mm(a, b);
}

struct ChunkedLinearCrossEntropy : public torch::autograd::Function<ChunkedLinearCrossEntropy> {
  // hidden (N, d), weight (V, d), targets (N,) int64, token_weights (N,)
  // unless `mean`; `compute` as an int64 (autograd's argument types); which
  // gradients to make.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, const at::Tensor& token_weights, bool mean, int64_t compute_type,
                            int64_t rows_per_pass, bool want_hidden, bool want_weight) {
    // The types below are chosen here, not by autocast.
    const c10::impl::ExcludeDispatchKeyGuard exact_types(c10::autocast_dispatch_keyset);
    const auto compute = static_cast<at::ScalarType>(compute_type);
    const auto acc = accumulation_type(compute);
    const bool want_grads = want_hidden || want_weight;
    const int64_t N = hidden.size(0), d = hidden.size(1), V = weight.size(0);
    const int64_t padded = (V + kPadRows - 1) / kPadRows * kPadRows;
    at::Tensor w = weight.to(compute).contiguous();  // (V, d)
    if (padded != V) {
      auto zero_padded = at::zeros({padded, d}, w.options());  // (Vp, d)
      zero_padded.narrow(0, 0, V).copy_(w);
      w = zero_padded;
    }
    // What product() multiplies by: on the CPU in bf16, the same values in fp32, once.
    const auto wp = compute == at::kBFloat16 && w.device().is_cpu() ? w.to(at::kFloat) : w;  // (Vp, d)
    const auto h = hidden.to(compute).contiguous();                                          // (N, d)
    const auto acc_options = hidden.options().dtype(acc);
    const auto tw = mean ? at::full({N}, N > 0 ? 1.0 / static_cast<double>(N) : 0.0, acc_options)
                         : token_weights.to(acc).contiguous();  // (N,)
    at::Tensor grad_hidden, grad_weight;  // (N, d) in hidden's type, (Vp, d) in the accumulation type
    if (want_hidden) grad_hidden = at::empty({N, d}, hidden.options());
    if (want_weight) grad_weight = at::zeros({padded, d}, weight.options().dtype(acc));
    auto nll = at::empty({N}, acc_options);  // (N,)
    const int64_t rows =
        rows_per_pass > 0
            ? rows_per_pass
            : std::max<int64_t>(1, kBlockBytes / (padded * static_cast<int64_t>(c10::elementSize(compute))));
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t n = std::min(rows, N - r0);
      const auto hc = h.narrow(0, r0, n);  // (n, d)
      auto logits = product(hc, wp.t());   // (n, Vp); the padded columns are 0
      nll.narrow(0, r0, n).copy_(softmax_cross_entropy_block(logits.narrow(1, 0, V), targets.narrow(0, r0, n),
                                                             tw.narrow(0, r0, n), want_grads));
      if (!want_grads) continue;
      // logits now hold d loss / d logits; their padded columns meet the
      // zero rows of w, and the padded rows of grad_weight are dropped.
      if (want_hidden) grad_hidden.narrow(0, r0, n).copy_(product(logits, wp));  // (n, d)
      if (!want_weight) continue;
      if (compute == acc)
        grad_weight.addmm_(logits.t(), hc);
      else
        grad_weight.add_(product(logits.t(), hc));  // (Vp, d): products in `compute`, summed over blocks in acc
    }
    at::Tensor loss = (tw * nll).sum();
    if (N == 0 && mean) loss.fill_(std::numeric_limits<double>::quiet_NaN());  // the mean of nothing
    ctx->save_for_backward(
        {grad_hidden, want_weight ? grad_weight.narrow(0, 0, V).to(weight.scalar_type()) : at::Tensor()});
    return loss.to(hidden.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return scale_saved_gradients(ctx, grads, 9);
  }
};

}  // namespace

torch::autograd::variable_list scale_saved_gradients(torch::autograd::AutogradContext* ctx,
                                                     const torch::autograd::variable_list& grads, size_t inputs) {
  const auto saved = ctx->get_saved_variables();
  const auto& g = grads[0];  // ()
  torch::autograd::variable_list out(inputs);
  // A loss differentiated as it is (loss.backward(): g is 1) takes the saved
  // gradients themselves, which times 1 they are exactly: no pass over the
  // head's (V, d) and (N, d). Read only on the host, where it costs no wait.
  const bool unit =
      g.device().is_cpu() && !torch::autograd::GradMode::is_enabled() && g.numel() == 1 && g.item<double>() == 1.0;
  for (size_t i = 0; i < 2; ++i)
    if (saved[i].defined()) out[i] = unit ? saved[i] : saved[i] * g;
  return out;
}

void check_head_inputs(const std::string& function, const at::Tensor& hidden, const at::Tensor& weight,
                       const at::Tensor& targets, const at::Tensor& token_weights) {
  const std::string name = function + ": ";
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1))
    throw UserError(name + "hidden " + c10::str(hidden.sizes()) + " and weight " + c10::str(weight.sizes()) +
                    " are not (N, d) and (V, d)");
  if (targets.dim() != 1 || targets.size(0) != hidden.size(0) || targets.scalar_type() != at::kLong)
    throw UserError(name + "targets must be (" + std::to_string(hidden.size(0)) + ",) int64, found " +
                    c10::str(targets.sizes()) + " " + c10::str(targets.scalar_type()));
  if (token_weights.defined() && (token_weights.dim() != 1 || token_weights.size(0) != hidden.size(0)))
    throw UserError(name + "token_weights must be (" + std::to_string(hidden.size(0)) + ",), found " +
                    c10::str(token_weights.sizes()));
}

at::Tensor softmax_cross_entropy_composed(const at::Tensor& logits, const at::Tensor& targets,
                                          const at::Tensor& weights, bool write_grads) {
  const int64_t V = logits.size(1);
  const auto acc = accumulation_type(logits.scalar_type());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Targets clamped for the gather (a GPU would assert on one outside), the
  // rows they spoil marked NaN below, as the kernel marks them.
  const auto usable = logits.isfinite().all(1) & (targets >= 0) & (targets < V);         // (n,)
  const auto t = targets.clamp(0, V - 1).unsqueeze(1);                                   // (n, 1)
  auto logp = at::log_softmax(logits, 1, acc);                                           // (n, V)
  auto nll = logp.gather(1, t).squeeze(1).neg().masked_fill(usable.logical_not(), nan);  // (n,)
  if (write_grads) {
    const auto w = weights.to(acc).unsqueeze(1);  // (n, 1)
    auto g = logp.exp_().mul_(w);                 // (n, V)
    g.scatter_add_(1, t, w.neg());
    g.masked_fill_(usable.logical_not().unsqueeze(1), nan);
    logits.copy_(g);
  }
  return nll;
}

at::Tensor softmax_cross_entropy_block(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& weights,
                                       bool write_grads) {
#if CHIAR_CUDA_KERNELS
  if (cuda_kernels_enabled() && logits.is_cuda() && cuda_head_takes(logits) && cuda_kernels_usable())
    return softmax_cross_entropy_cuda(logits, targets, weights.to(at::kFloat), write_grads);
#endif
  return softmax_cross_entropy_composed(logits, targets, weights, write_grads);
}

at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                        const at::Tensor& token_weights, at::ScalarType compute,
                                        int64_t rows_per_pass) {
  RECORD_FUNCTION("chiar::chunked_linear_cross_entropy", std::vector<c10::IValue>({hidden, weight}));
  check_head_inputs("chunked_linear_cross_entropy", hidden, weight, targets, token_weights);
  const std::string name = "chunked_linear_cross_entropy: ";
  // The kernel reads targets and weights through device pointers.
  for (const at::Tensor* t : {&weight, &targets, &token_weights})
    if (t->defined() && t->device() != hidden.device())
      throw UserError(name + "every tensor must be on hidden's device (" + hidden.device().str() + "), found one on " +
                      t->device().str());
  // fp16's range cannot hold a mean's per-token gradients: w (softmax - onehot)
  // at w = 1/N and p ~ 1/V falls below its smallest subnormal.
  if (compute != at::kDouble && compute != at::kFloat && compute != at::kBFloat16)
    throw UserError(name + "products in " + c10::str(compute) + " are not supported (fp64, fp32 or bf16)");
  const bool grads = torch::autograd::GradMode::is_enabled();
  const bool mean = !token_weights.defined();
  return ChunkedLinearCrossEntropy::apply(
      hidden, weight, targets.contiguous(), mean ? at::empty({0}, hidden.options()) : token_weights, mean,
      static_cast<int64_t>(compute), rows_per_pass, grads && hidden.requires_grad(), grads && weight.requires_grad());
}

}  // namespace chiar
