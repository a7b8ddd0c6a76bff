#include "chiar/linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <atomic>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autocast_compat.h"
#include "chiar/error.h"
#include "chiar/gelu.h"
#include "chiar/kernels.h"
#include "chiar/row_kernels.h"
#include "row_passes.h"
#include "chiar_build_info.h"

#if CHIAR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace chiar {

namespace {

std::atomic<GemmBackend> g_backend{CHIAR_HAVE_ONEDNN ? GemmBackend::OneDnn : GemmBackend::Blas};

bool autocasting() { return autocast::any_enabled(); }

bool onednn_selected() { return g_backend.load(std::memory_order_relaxed) == GemmBackend::OneDnn; }

// What oneDNN's sgemm takes: fp32 in host memory (undefined counts as absent).
bool fp32_cpu_or_absent(const at::Tensor& t) {
  return !t.defined() || (t.device().is_cpu() && t.scalar_type() == at::kFloat);
}

bool takes_fast_path(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& addend) {
  if (!onednn_selected() || autocasting() || !host_kernels_enabled()) return false;
  return x.defined() && weight.defined() && fp32_cpu_or_absent(x) && fp32_cpu_or_absent(weight) &&
         fp32_cpu_or_absent(bias) && fp32_cpu_or_absent(addend) && x.dim() >= 1 && weight.dim() == 2;
}

#if CHIAR_HAVE_ONEDNN
// How dnnl_sgemm reads one operand: a matrix per batch entry at data +
// offsets[g], row-major ('N') or column-major ('T') with leading dimension ld.
// A tensor whose matrices are neither is copied first.
struct Operand {
  at::Tensor t;  // (..., rows, cols) as the product sees it; keeps a copy alive
  char trans = 'N';
  int64_t ld = 1;
  std::vector<int64_t> offsets;  // elements from data_ptr to each batch entry's matrix
};

bool layout_of(const at::Tensor& m, Operand& o) {
  const int64_t rows = m.size(-2), cols = m.size(-1), sr = m.stride(-2), sc = m.stride(-1);
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= std::max<int64_t>(1, cols))) {
    o.trans = 'N';
    o.ld = rows == 1 ? std::max<int64_t>(1, cols) : sr;
    return true;
  }
  if ((rows == 1 || sr == 1) && (cols == 1 || sc >= std::max<int64_t>(1, rows))) {
    o.trans = 'T';
    o.ld = cols == 1 ? std::max<int64_t>(1, rows) : sc;
    return true;
  }
  return false;
}

Operand operand(const at::Tensor& m) {
  Operand o;
  o.t = layout_of(m, o) ? m : m.contiguous();
  if (!o.t.is_same(m)) layout_of(o.t, o);
  const int64_t batch_dims = o.t.dim() - 2;
  int64_t count = 1;
  for (int64_t i = 0; i < batch_dims; ++i) count *= o.t.size(i);
  o.offsets.resize(static_cast<size_t>(count));
  for (int64_t g = 0; g < count; ++g) {
    int64_t rest = g, offset = 0;
    for (int64_t i = batch_dims - 1; i >= 0; --i) {
      offset += (rest % o.t.size(i)) * o.t.stride(i);
      rest /= o.t.size(i);
    }
    o.offsets[static_cast<size_t>(g)] = offset;
  }
  return o;
}

// c (..., m, n), contiguous = a (..., m, k) b (..., k, n) + beta c, batch
// shapes equal. Many small products run side by side, one thread each; few
// large ones one after another, each on every thread.
void onednn_gemm(at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float beta) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Operand A = operand(a), B = operand(b);
  const float* pa = A.t.data_ptr<float>();
  const float* pb = B.t.data_ptr<float>();
  float* pc = c.data_ptr<float>();
  const int64_t count = static_cast<int64_t>(A.offsets.size());
  const auto one = [&](int64_t g) {
    const dnnl_status_t status =
        dnnl_sgemm(A.trans, B.trans, m, n, k, 1.f, pa + A.offsets[static_cast<size_t>(g)], A.ld,
                   pb + B.offsets[static_cast<size_t>(g)], B.ld, beta, pc + g * m * n, std::max<int64_t>(1, n));
    TORCH_CHECK(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status), " on (", m, ", ", k,
                ") x (", k, ", ", n, ")");
  };
  if (count >= 2 * at::get_num_threads())
    at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) one(g);
    });
  else
    for (int64_t g = 0; g < count; ++g) one(g);
}
#endif

void gemm_checked(at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float beta) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(1) == b.size(0) && c.size(0) == a.size(0) &&
                  c.size(1) == b.size(1),
              "gemm_into: shapes ", a.sizes(), " x ", b.sizes(), " -> ", c.sizes(), " do not match");
  TORCH_CHECK(c.is_contiguous(), "gemm_into: the output must be contiguous");
  if (c.numel() == 0) return;
  if (a.size(1) == 0) {  // an empty sum: c = beta c
    c.mul_(beta);
    return;
  }
#if CHIAR_HAVE_ONEDNN
  if (onednn_selected() && fp32_cpu_or_absent(a) && fp32_cpu_or_absent(b) && fp32_cpu_or_absent(c)) {
    onednn_gemm(c, a, b, beta);
    return;
  }
#endif
  if (beta == 0.f)
    at::mm_out(c, a, b);
  else
    at::addmm_out(c, c, a, b, beta, 1.0);
}

// Copies derived from a weight, kept per weight and refreshed when it
// changes (its version counter, storage or shape), so that training makes
// each once per step and inference never again. Two kinds:
// - row-major copies of W^T for weights whose product x W^T reads W in the
//   slow layout: with k > n (the FFN's down projection, 1024 -> 256) oneDNN
//   runs x W^T well below the rate of x (W^T as its own row-major matrix)
//   (chiar_bench: product/onednn/2048/1024/256/0; docs/performance.md, 'GEMM
//   libraries'); 1 MB for the anchor FFN;
// - bf16 copies of W for the bf16 products under autocast
//   (Bf16LinearFunction), which forward and backward both read, and the
//   same packed as oneDNN's kernels read W^T (forward) and W (backward), so
//   that the products do not pack them again on every call (gemm_bf16_pack_b).
// The storage is compared by identity, not address: set_data (Module::to, a
// checkpoint read onto another device) keeps the version counter, and a new
// storage may land where a freed one was.
class WeightCopies {
 public:
  using Derive = at::Tensor (*)(const at::Tensor&);
  explicit WeightCopies(Derive derive) : derive_(derive) {}

  // weight (n, k) contiguous -> derive(weight)
  at::Tensor get(const at::Tensor& weight) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* impl = weight.unsafeGetTensorImpl();
    auto it = entries_.find(impl);
    if (it != entries_.end() && !it->second.owner.expired() && it->second.version == weight._version() &&
        it->second.storage._unsafe_get_target() == weight.storage().unsafeGetStorageImpl() &&
        it->second.data == weight.data_ptr() && it->second.sizes == weight.sizes())
      return it->second.copy;
    for (auto e = entries_.begin(); e != entries_.end();) e = e->second.owner.expired() ? entries_.erase(e) : ++e;
    at::NoGradGuard no_grad;
    Entry entry{c10::weak_intrusive_ptr<c10::TensorImpl>(weight.getIntrusivePtr()),
                weight.storage().getWeakStorageImpl(),
                weight._version(),
                weight.data_ptr(),
                weight.sizes().vec(),
                derive_(weight)};
    entries_.insert_or_assign(impl, entry);
    return entry.copy;
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> owner;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // held: its address cannot be reused meanwhile
    int64_t version;
    const void* data;
    std::vector<int64_t> sizes;
    at::Tensor copy;
  };
  Derive derive_;
  std::mutex mutex_;
  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
};

// Never destroyed: weights may outlive static destruction.
WeightCopies& transposed_weights() {
  static auto* cache = new WeightCopies([](const at::Tensor& w) { return w.t().contiguous(); });  // (k, n)
  return *cache;
}
WeightCopies& bf16_weights() {
  static auto* cache = new WeightCopies([](const at::Tensor& w) { return to_bf16(w); });
  return *cache;
}
// W (n, k) as forward's op(B) = W^T (k, n), or as backward's op(B) = W.
WeightCopies& packed_bf16_weights(bool transposed) {
  static auto* for_forward = new WeightCopies([](const at::Tensor& w) {
    const auto wb = bf16_weights().get(w);  // (n, k)
    return gemm_bf16_pack_b(/*trans_b=*/true, w.size(0), w.size(1), wb.data_ptr<c10::BFloat16>(), w.size(1));
  });
  static auto* for_backward = new WeightCopies([](const at::Tensor& w) {
    const auto wb = bf16_weights().get(w);  // (n, k)
    return gemm_bf16_pack_b(/*trans_b=*/false, w.size(1), w.size(0), wb.data_ptr<c10::BFloat16>(), w.size(1));
  });
  return transposed ? *for_forward : *for_backward;
}

// W^T as the product reads it: the kept row-major copy where that layout is
// the fast one (oneDNN, k > n, enough rows to repay a copy), else a view.
at::Tensor weight_transposed(const at::Tensor& weight, int64_t rows) {
  const int64_t n = weight.size(0), k = weight.size(1);
  if (onednn_selected() && k > n && rows >= 256 && weight.is_contiguous()) return transposed_weights().get(weight);
  return weight.t();
}

// A product's output (rows, n), contiguous in `options`, holding bias +
// addend2 (either may be undefined) for the product to accumulate onto (beta
// 1): one pass over the output fewer than adding them afterwards; empty when
// neither is given.
at::Tensor output_onto(int64_t rows, int64_t n, const at::Tensor& bias, const at::Tensor& addend2,
                       const at::TensorOptions& options) {
  if (addend2.defined()) {
    const auto a2 = addend2.to(options.dtype());
    return (bias.defined() ? at::add(a2, bias) : a2.clone()).contiguous();
  }
  auto y = at::empty({rows, n}, options);
  // copy_ of the broadcast row, not expand().contiguous(), which was many
  // times slower (docs/performance.md, 'GEMM libraries').
  if (bias.defined()) y.copy_(bias.expand({rows, n}));
  return y;
}

// y (M, n) = x2 (M, k) W^T + bias + addend2, no autograd.
at::Tensor forward_product(const at::Tensor& x2, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& addend2) {
  const int64_t rows = x2.size(0);
  at::Tensor y = output_onto(rows, weight.size(0), bias, addend2, x2.options());  // (M, n)
  gemm_checked(y, x2, weight_transposed(weight, rows), (addend2.defined() || bias.defined()) ? 1.f : 0.f);
  return y;
}

std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> out(sizes.begin(), sizes.end());
  out.back() = last;
  return out;
}

// The shapes the harness's own paths rely on (libtorch's path checks its own).
void check_shapes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& addend) {
  TORCH_CHECK(x.size(-1) == weight.size(1), "linear: input ", x.sizes(), " and weight ", weight.sizes(),
              " do not match");
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "linear: bias ", bias.sizes(),
              " does not match weight ", weight.sizes());
  TORCH_CHECK(!addend.defined() || addend.sizes() == at::IntArrayRef(with_last(x.sizes(), weight.size(0))),
              "linear: addend ", addend.sizes(), " does not match the output's shape");
}

// libtorch 1.13's Function::apply cannot take undefined tensors, so an absent
// bias or addend travels as an empty tensor beside a flag saying so.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias_or_empty, const at::Tensor& addend_or_empty, bool has_bias,
                            bool has_addend) {
    const auto bias = has_bias ? bias_or_empty : at::Tensor();
    const auto addend = has_addend ? addend_or_empty : at::Tensor();
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias"] = has_bias;
    ctx->saved_data["addend"] = has_addend;
    const int64_t k = x.size(-1), n = weight.size(0);
    const auto x2 = x.reshape({-1, k});
    const auto a2 = addend.defined() ? addend.reshape({-1, n}) : at::Tensor();
    return forward_product(x2, weight, bias, a2).view(with_last(x.sizes(), n));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];       // (..., k)
    const auto& weight = saved[1];  // (n, k)
    const int64_t k = x.size(-1), n = weight.size(0);
    const auto gy = grads[0].reshape({-1, n}).contiguous();  // (M, n)
    // Through linear() itself, so that a backward with create_graph (grad
    // mode on here) stays differentiable, on the same library.
    at::Tensor gx, gw, gb, ga;
    if (ctx->needs_input_grad(0)) gx = chiar::linear(gy, weight.t()).view(x.sizes());  // (M, k) = gy W
    if (ctx->needs_input_grad(1)) gw = chiar::linear(gy.t(), x.reshape({-1, k}).t());  // (n, k) = gy^T x
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) gb = gy.sum(0);
    if (ctx->saved_data["addend"].toBool() && ctx->needs_input_grad(3)) ga = grads[0];
    return {gx, gw, gb, ga, at::Tensor(), at::Tensor()};
  }
};

// Under bf16 autocast on a CPU with bf16 kernels: bf16 operands, products
// summed in fp32 (gemm_bf16), output fp32. Autocast's own linear rounds the
// output to bf16, which the residual stream, LayerNorm, GELU and attention's
// fused core then widen again, and rounds the weight's gradient to bf16
// before it reaches the fp32 master weight; this keeps both in fp32 and
// saves those casts (bench-train --compare-precision fp32,bf16).
bool takes_bf16_path(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& addend) {
  if (!cpu_bf16_products()) return false;
  const auto float_or_bf16 = [](const at::Tensor& t) {
    return !t.defined() || (t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16));
  };
  return x.defined() && weight.defined() && x.dim() >= 1 && weight.dim() == 2 && float_or_bf16(x) &&
         fp32_cpu_or_absent(weight) && fp32_cpu_or_absent(bias) && float_or_bf16(addend);
}

// c (m, n) contiguous = a (m, k) op(w): a bf16 contiguous, w the weight
// (n, k) fp32, read through its bf16 copies; op(w) is w^T (forward) or w
// (backward's gy W). An fp32 c takes beta c added (gemm_bf16's beta); a bf16
// c gets each entry rounded once as it is written, bias (n) fp32 added
// first where defined, and with gelu the GELU after it
// (gemm_bf16_packed_b_rounded; what c held is ignored).
void bf16_product(const at::Tensor& a, const at::Tensor& weight, bool w_transposed, at::Tensor& c, float beta = 0.f,
                  const at::Tensor& bias = {}, bool gelu = false) {
  const int64_t m = a.size(0), k = a.size(1), n = c.size(1);
  const auto w = weight.contiguous();
  const auto wb = bf16_weights().get(w);  // (n, k) of the weight
  const auto& packed = packed_bf16_weights(w_transposed).get(w);
  const auto* ap = a.data_ptr<c10::BFloat16>();
  const auto* bp = wb.data_ptr<c10::BFloat16>();
  if (c.scalar_type() == at::kBFloat16) {
    const auto b = bias.defined() ? bias.contiguous() : bias;
    gemm_bf16_packed_b_rounded(false, w_transposed, m, n, k, ap, k, bp, wb.size(1), packed,
                               b.defined() ? b.data_ptr<float>() : nullptr, gelu, c.data_ptr<c10::BFloat16>(), n);
  } else {
    gemm_bf16_packed_b(false, w_transposed, m, n, k, 1.f, ap, k, bp, wb.size(1), packed, beta, c.data_ptr<float>(), n);
  }
}

// gy's column sums (n) in fp32: a bias's gradient. A bf16 gy (M, n) on the
// CPU (linear_bf16_out's gradient) is widened a row at a time into the
// threads' partial sums (libtorch's sum over bf16: bench-train --op-times,
// aten::sum inside Bf16LinearFunction backward, docs/performance.md).
at::Tensor column_sums(const at::Tensor& gy) {
  if (gy.scalar_type() != at::kBFloat16 || !gy.device().is_cpu() || gy.dim() != 2)
    return at::sum(gy, {0}, false, at::kFloat);
  const auto g = gy.contiguous();  // (M, n)
  const int64_t M = g.size(0), n = g.size(1);
  const auto* in = reinterpret_cast<const uint16_t*>(g.data_ptr<c10::BFloat16>());
  return for_each_row_with_sums(M, n, g.options().dtype(at::kFloat),
                                [&](int64_t r, float* part) { add_widened_bf16(in + r * n, part, n); });
}

// gy (M, n) fp32 rounded to bf16 for the products and, from the same read,
// its column sums (a bias's gradient, (n) fp32, summed as the fused GELU and
// LayerNorm sum theirs): one pass over gy instead of a cast and a sum.
std::pair<at::Tensor, at::Tensor> as_bf16_with_column_sums(const at::Tensor& gy) {
  const auto g = gy.contiguous();  // (M, n)
  const int64_t M = g.size(0), n = g.size(1);
  auto gb = at::empty({M, n}, g.options().dtype(at::kBFloat16));  // (M, n)
  const float* in = g.data_ptr<float>();
  auto* out = reinterpret_cast<uint16_t*>(gb.data_ptr());
  auto sums = for_each_row_with_sums(M, n, g.options(), [&](int64_t r, float* part) {  // (n)
    round_to_bf16_adding(in + r * n, out + r * n, part, n);
  });
  return {gb, sums};
}

struct Bf16LinearFunction : public torch::autograd::Function<Bf16LinearFunction> {
  // x (..., k) fp32 or bf16, weight (n, k) fp32, bias (n) fp32, addend
  // (..., n) fp32 or bf16 (or empty with the flags false) -> (..., n) fp32,
  // or bf16 with rounded_output (and no addend).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias_or_empty, const at::Tensor& addend_or_empty, bool has_bias,
                            bool has_addend, bool rounded_output) {
    const int64_t k = x.size(-1), n = weight.size(0);
    const auto xb = to_bf16(x.reshape({-1, k}));  // (M, k)
    const int64_t M = xb.size(0);
    at::Tensor y;  // (M, n)
    if (rounded_output) {
      y = at::empty({M, n}, weight.options().dtype(at::kBFloat16));
      if (M > 0) bf16_product(xb, weight, /*w_transposed=*/true, y, 0.f, has_bias ? bias_or_empty : at::Tensor());
    } else {
      y = output_onto(M, n, has_bias ? bias_or_empty : at::Tensor(),
                      has_addend ? addend_or_empty.reshape({-1, n}) : at::Tensor(), weight.options());
      if (M > 0) bf16_product(xb, weight, /*w_transposed=*/true, y, has_bias || has_addend ? 1.f : 0.f);
    }
    // x itself for a gradient of the gradient (create_graph), the rounded
    // copy for the weight's gradient.
    ctx->save_for_backward({x, xb, weight});
    ctx->saved_data["bias"] = has_bias;
    ctx->saved_data["addend"] = has_addend;
    return y.view(with_last(x.sizes(), n));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];       // (..., k) fp32 or bf16
    const auto& xb = saved[1];      // (M, k) bf16
    const auto& weight = saved[2];  // (n, k) fp32
    const int64_t M = xb.size(0), k = xb.size(1), n = weight.size(0);
    const auto gy = grads[0].reshape({-1, n});  // (M, n)
    const bool bias_grad = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    at::Tensor gx, gw, gb, ga;
    if (torch::autograd::GradMode::is_enabled()) {
      // create_graph: differentiable fp32 products of x (rounded as forward
      // rounded it: the rounding passes gradients through) and the weight,
      // so that a gradient of the gradient reaches both. Autocast off: a
      // backward called inside its scope would run these in bf16.
      const c10::impl::ExcludeDispatchKeyGuard fp32(c10::autocast_dispatch_keyset);
      const auto x2 = x.reshape({-1, k}).to(at::kBFloat16).to(at::kFloat);  // (M, k)
      if (ctx->needs_input_grad(0)) gx = at::mm(gy.to(at::kFloat), weight).view(x.sizes()).to(x.scalar_type());
      if (ctx->needs_input_grad(1)) gw = at::mm(gy.to(at::kFloat).t(), x2);
    } else {
      at::Tensor gyb;  // (M, n)
      if (bias_grad && gy.scalar_type() == at::kFloat)
        std::tie(gyb, gb) = as_bf16_with_column_sums(gy);
      else
        gyb = to_bf16(gy);
      if (ctx->needs_input_grad(0)) {
        // gy W, written in x's type: a bf16 x (an activation only products
        // read) gets its gradient rounded as the product writes it.
        gx = at::empty({M, k}, weight.options().dtype(x.scalar_type()));  // (M, k)
        if (M > 0) bf16_product(gyb, weight, /*w_transposed=*/false, gx);
        gx = gx.view(x.sizes());
      }
      if (ctx->needs_input_grad(1)) {
        gw = at::empty({n, k}, weight.options());  // gy^T x, summed over the M rows in fp32
        // On the any-size primitive: with A transposed, oneDNN's jit gemm
        // ran 1.03-1.29x the shape's own brgemm kernels at the anchor's
        // weight shapes (chiar_bench product_bf16/{gemm_bf16,any_size}/2048/*/2).
        gemm_bf16_any_size(true, false, n, k, M, 1.f, gyb.data_ptr<c10::BFloat16>(), n, xb.data_ptr<c10::BFloat16>(), k,
                           0.f, gw.data_ptr<float>(), k);
      }
    }
    if (bias_grad && !gb.defined()) gb = column_sums(gy);  // not summed while rounding gy
    if (ctx->saved_data["addend"].toBool() && ctx->needs_input_grad(3)) ga = grads[0];
    return {gx, gw, gb, ga, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// linear() or linear_bf16_out() on the bf16 path (takes_bf16_path).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& addend,
                       bool rounded_output) {
  check_shapes(x, weight, bias, addend);
  count_host_kernel();
  const auto none = at::empty({0}, weight.options());
  return Bf16LinearFunction::apply(x, weight, bias.defined() ? bias : none, addend.defined() ? addend : none,
                                   bias.defined(), addend.defined(), rounded_output);
}

bool batch_shapes_match(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() >= 2 && a.dim() == b.dim() && a.size(-1) == b.size(-2) &&
         a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2);
}

// (..., m, k) x (..., k, n) -> (..., m, n) on oneDNN, no autograd.
at::Tensor batched_product(const at::Tensor& a, const at::Tensor& b) {
  std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
  shape.back() = b.size(-1);
  auto c = at::empty(shape, a.options());
  if (c.numel() == 0) return c;
  if (a.size(-1) == 0) return c.zero_();
#if CHIAR_HAVE_ONEDNN
  onednn_gemm(c, a, b, 0.f);
#else
  at::matmul_out(c, a, b);  // unreachable: the backend cannot be oneDNN without it
#endif
  return c;
}

struct MatmulFunction : public torch::autograd::Function<MatmulFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return batched_product(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &b = saved[1];  // (..., m, k), (..., k, n)
    const auto& g = grads[0];                 // (..., m, n)
    at::Tensor ga, gb;
    // batch_matmul itself: differentiable again under create_graph.
    if (ctx->needs_input_grad(0)) ga = batch_matmul(g, b.transpose(-2, -1));  // (..., m, k)
    if (ctx->needs_input_grad(1)) gb = batch_matmul(a.transpose(-2, -1), g);  // (..., k, n)
    return {ga, gb};
  }
};

}  // namespace

bool cpu_bf16_products() {
  return autocast::enabled_dtype(at::kCPU) == at::kBFloat16 && host_kernels_enabled() && gemm_bf16_native();
}

const char* to_string(GemmBackend backend) { return backend == GemmBackend::OneDnn ? "onednn" : "blas"; }

GemmBackend gemm_backend_from_string(const std::string& name) {
  if (name == "blas") return GemmBackend::Blas;
  if (name == "onednn") return GemmBackend::OneDnn;
  throw UserError("unknown gemm backend '" + name + "' (known: blas, onednn)");
}

bool onednn_available() { return CHIAR_HAVE_ONEDNN != 0; }

std::string onednn_description() {
#if CHIAR_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  std::string isa;
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: isa = "sse41"; break;
    case dnnl_cpu_isa_avx: isa = "avx"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    default: isa = "code " + std::to_string(static_cast<int>(dnnl_get_effective_cpu_isa()));
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " sgemm, ISA " + isa;
#else
  return "";
#endif
}

void set_gemm_backend(GemmBackend backend) {
  if (backend == GemmBackend::OneDnn && !onednn_available())
    throw UserError(
        "gemm backend 'onednn': this build has no oneDNN "
        "(configure with libdnnl-dev installed and CHIAR_WITH_ONEDNN=ON)");
  g_backend.store(backend);
}

GemmBackend gemm_backend() { return g_backend.load(); }

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: C = beta C (oneDNN leaves C as it was)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
#if CHIAR_HAVE_ONEDNN
  if (onednn_selected()) {
    const dnnl_status_t status =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    TORCH_CHECK(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status), " on (", m, ", ", k,
                ") x (", k, ", ", n, ")");
    return;
  }
#endif
  // libtorch's path on views of the same memory (its BLAS wrapper is not
  // exported): a few microseconds of tensor set-up per call.
  at::NoGradGuard no_grad;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto view = [&](const float* p, bool trans, int64_t rows, int64_t cols, int64_t ld) {
    auto t = at::from_blob(const_cast<float*>(p), {trans ? cols : rows, trans ? rows : cols}, {ld, 1}, f32);
    return trans ? t.t() : t;
  };
  auto out = at::from_blob(c, {m, n}, {ldc, 1}, f32);
  at::addmm_out(out, out, view(a, trans_a, m, k, lda), view(b, trans_b, k, n, ldb), beta, alpha);
}

void gemm_into(at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float beta) {
  at::NoGradGuard no_grad;
  gemm_checked(c, a, b, beta);
}

at::Tensor batch_matmul(const at::Tensor& a, const at::Tensor& b) {
  RECORD_FUNCTION("chiar::batch_matmul", std::vector<c10::IValue>({a, b}));
  if (!onednn_selected() || autocasting() || !host_kernels_enabled() || !fp32_cpu_or_absent(a) ||
      !fp32_cpu_or_absent(b) || !batch_shapes_match(a, b))
    return at::matmul(a, b);
  count_host_kernel();
  if (torch::autograd::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad()))
    return MatmulFunction::apply(a, b);
  return batched_product(a, b);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& addend) {
  RECORD_FUNCTION("chiar::linear", std::vector<c10::IValue>({x, weight}));
  if (takes_bf16_path(x, weight, bias, addend)) return bf16_linear(x, weight, bias, addend, /*rounded_output=*/false);
  if (!takes_fast_path(x, weight, bias, addend)) {
    // libtorch's path. The addend rides in addmm when nothing differs in type
    // (under autocast addmm would run in bf16 and drag an fp32 addend down).
    if (addend.defined() && !autocasting() && x.dim() >= 1 && weight.dim() == 2 &&
        addend.scalar_type() == x.scalar_type() && weight.scalar_type() == x.scalar_type() &&
        addend.device() == x.device()) {
      const int64_t k = x.size(-1), n = weight.size(0);
      auto y = at::addmm(addend.reshape({-1, n}), x.reshape({-1, k}), weight.t());  // (M, n)
      if (bias.defined()) y.add_(bias);
      return y.view(with_last(x.sizes(), n));
    }
    auto y = at::linear(x, weight, bias);
    return addend.defined() ? y + addend : y;
  }
  count_host_kernel();
  check_shapes(x, weight, bias, addend);
  const bool grad = torch::autograd::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()) ||
                     (addend.defined() && addend.requires_grad()));
  if (grad) {
    const auto none = at::empty({0}, x.options());
    return LinearFunction::apply(x, weight, bias.defined() ? bias : none, addend.defined() ? addend : none,
                                 bias.defined(), addend.defined());
  }
  const int64_t k = x.size(-1), n = weight.size(0);
  const auto a2 = addend.defined() ? addend.reshape({-1, n}) : at::Tensor();
  return forward_product(x.reshape({-1, k}), weight, bias, a2).view(with_last(x.sizes(), n));
}

at::Tensor linear_bf16_out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!takes_bf16_path(x, weight, bias, {})) return linear(x, weight, bias);
  RECORD_FUNCTION("chiar::linear_bf16_out", std::vector<c10::IValue>({x, weight}));
  return bf16_linear(x, weight, bias, {}, /*rounded_output=*/true);
}

at::Tensor linear_bias_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (torch::autograd::GradMode::is_enabled()) return bias_gelu(linear_bf16_out(x, weight), bias);
  if (!takes_bf16_path(x, weight, bias, {}) || !bias.defined()) {
    auto u = linear_bf16_out(x, weight);
    return bias_gelu_(u, bias);
  }
  RECORD_FUNCTION("chiar::linear_bias_gelu", std::vector<c10::IValue>({x, weight}));
  check_shapes(x, weight, bias, {});
  count_host_kernel();
  const int64_t k = x.size(-1), n = weight.size(0);
  const auto xb = to_bf16(x.reshape({-1, k}));                                 // (M, k)
  auto y = at::empty({xb.size(0), n}, weight.options().dtype(at::kBFloat16));  // (M, n)
  if (xb.size(0) > 0) bf16_product(xb, weight, /*w_transposed=*/true, y, 0.f, bias, /*gelu=*/true);
  return y.view(with_last(x.sizes(), n));
}

}  // namespace chiar
