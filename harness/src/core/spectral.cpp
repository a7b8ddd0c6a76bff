#include "chiar/spectral.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "autocast_compat.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/linear.h"
#include "chiar_build_info.h"
#include "entropy_rows.h"
#if CHIAR_CUDA_KERNELS
#include "cuda_routing.h"
#endif

namespace chiar {
namespace {

// The auto choice's crossover: the DCT by GEMM is faster below this width
// and the FFT from it on, on either GEMM library (chiar_bench: dct2/gemm/*,
// dct2/fft/*).
constexpr int64_t kFftFromD = 1024;

at::TensorOptions real_options(const at::Tensor& x) {
  return at::TensorOptions().dtype(x.scalar_type()).device(x.device());
}

// Makhoul's even/odd reordering: v = [x0, x2, x4, ..., x5, x3, x1]. Cached
// per (d, device), as the basis is: built in host memory, it would otherwise
// be a host-to-device copy on every call on a GPU.
at::Tensor makhoul_permutation(int64_t d, at::Device device) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, std::string>, at::Tensor> cache;
  const auto key = std::make_pair(d, device.str());
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto idx = at::empty({d}, at::TensorOptions().dtype(at::kLong));  // (d,)
  auto* p = idx.data_ptr<int64_t>();
  int64_t j = 0;
  for (int64_t n = 0; n < d; n += 2) p[j++] = n;
  for (int64_t n = (d % 2 == 0) ? d - 1 : d - 2; n >= 1; n -= 2) p[j++] = n;
  return cache.emplace(key, idx.to(device)).first->second;
}

// s_k: sqrt(1/d) for k = 0, sqrt(2/d) otherwise, as a (d,) tensor.
at::Tensor orthonormal_scale(int64_t d, const at::TensorOptions& opts) {
  auto s = at::full({d}, std::sqrt(2.0 / static_cast<double>(d)), opts);
  s.index_put_({0}, std::sqrt(1.0 / static_cast<double>(d)));
  return s;
}

at::Tensor dct2_fft(const at::Tensor& x) {
  const int64_t d = x.size(-1);
  const auto opts = real_options(x);
  auto v = x.index_select(-1, makhoul_permutation(d, x.device()));
  auto V = at::fft_fft(v, c10::nullopt, -1);
  // Re(exp(-i a_k) V_k) with a_k = pi k / (2d).
  auto a = at::arange(d, opts) * (M_PI / (2.0 * static_cast<double>(d)));
  auto re = at::real(V) * at::cos(a) + at::imag(V) * at::sin(a);
  return re * orthonormal_scale(d, opts);
}

at::Tensor idct2_fft(const at::Tensor& c) {
  const int64_t d = c.size(-1);
  const auto opts = real_options(c);
  auto X = c / orthonormal_scale(d, opts);  // unnormalised DCT-II coefficients
  // Xr[k] = X[d - k] for k >= 1, Xr[0] = 0.
  auto Xr = at::cat({at::zeros_like(X.narrow(-1, 0, 1)), X.narrow(-1, 1, d - 1).flip(-1)}, -1);
  // V_k = exp(i a_k) (X_k - i Xr_k), the spectrum of Makhoul's reordered sequence.
  auto a = at::arange(d, opts) * (M_PI / (2.0 * static_cast<double>(d)));
  auto cos_a = at::cos(a), sin_a = at::sin(a);
  auto V = at::complex(X * cos_a + Xr * sin_a, X * sin_a - Xr * cos_a);
  auto v = at::real(at::fft_ifft(V, c10::nullopt, -1));
  auto perm = makhoul_permutation(d, c.device());
  auto inverse = at::empty_like(perm);
  inverse.index_put_({perm}, at::arange(d, perm.options()));
  return v.index_select(-1, inverse);
}

void check_input(const at::Tensor& x, const char* what) {
  if (!x.defined() || x.dim() < 1 || x.size(-1) < 1)
    throw UserError(std::string(what) + ": expected a tensor with a non-empty last axis");
  if (!at::isFloatingType(x.scalar_type())) throw UserError(std::string(what) + ": expected a floating-point tensor");
}

}  // namespace

const char* to_string(DctImpl impl) {
  switch (impl) {
    case DctImpl::Auto: return "auto";
    case DctImpl::Gemm: return "gemm";
    case DctImpl::Fft: return "fft";
  }
  return "?";
}

DctImpl dct_impl_from_string(const std::string& name) {
  if (name == "auto") return DctImpl::Auto;
  if (name == "gemm") return DctImpl::Gemm;
  if (name == "fft") return DctImpl::Fft;
  throw UserError("unknown DCT implementation '" + name + "' (known: auto, gemm, fft)");
}

DctImpl resolve_dct_impl(DctImpl impl, int64_t d) {
  if (impl != DctImpl::Auto) return impl;
  return d >= kFftFromD ? DctImpl::Fft : DctImpl::Gemm;
}

namespace {

// B, or B^T contiguous, per (d, dtype, device), built once in float64.
at::Tensor cached_basis(int64_t d, at::ScalarType dtype, at::Device device, bool transposed) {
  using Key = std::tuple<int64_t, int, std::string, bool>;
  static std::mutex mutex;
  static std::map<Key, at::Tensor> cache;
  const Key key{d, static_cast<int>(dtype), device.str(), transposed};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;

  auto basis = at::empty({d, d}, at::TensorOptions().dtype(at::kDouble));  // (d, d) = B
  auto acc = basis.accessor<double, 2>();
  const double dd = static_cast<double>(d);
  for (int64_t k = 0; k < d; ++k) {
    const double s = std::sqrt((k == 0 ? 1.0 : 2.0) / dd);
    for (int64_t n = 0; n < d; ++n) acc[k][n] = s * std::cos(M_PI * static_cast<double>((2 * n + 1) * k) / (2.0 * dd));
  }
  auto out = (transposed ? basis.t() : basis).to(device, dtype).contiguous();
  cache.emplace(key, out);
  return out;
}

}  // namespace

at::Tensor dct_basis(int64_t d, at::ScalarType dtype, at::Device device) {
  return cached_basis(d, dtype, device, /*transposed=*/false);
}

at::Tensor idct_basis(int64_t d, at::ScalarType dtype, at::Device device) {
  return cached_basis(d, dtype, device, /*transposed=*/true);
}

at::Tensor dct2(const at::Tensor& x, DctImpl impl) {
  check_input(x, "dct2");
  const int64_t d = x.size(-1);
  if (resolve_dct_impl(impl, d) == DctImpl::Fft) return dct2_fft(x);
  return chiar::linear(x, dct_basis(d, x.scalar_type(), x.device()));
}

// From a bf16 product's rounded operands the entropy moved by up to 5e-4
// (median 7e-5, at d 128 and 256), enough to send a token near a routing
// threshold to the other operator.
at::Tensor dct2_exact(const at::Tensor& x, DctImpl impl) {
  check_input(x, "dct2_exact");
  const autocast::Fp32Scope fp32(x.device());
  return dct2(x.scalar_type() == at::kDouble ? x : x.to(at::kFloat), impl);  // (..., d)
}

at::Tensor idct2(const at::Tensor& c, DctImpl impl) {
  check_input(c, "idct2");
  const int64_t d = c.size(-1);
  if (resolve_dct_impl(impl, d) == DctImpl::Fft) return idct2_fft(c);
  return chiar::linear(c, idct_basis(d, c.scalar_type(), c.device()));
}

namespace {

// What computes H for c: one of the kernels (one pass per row), or the chain
// of libtorch ops, which is also the reference the kernels are tested against
// (KernelPolicy::Compositions).
enum class EntropyPath { CudaKernel, HostKernel, Composition };

EntropyPath entropy_path(const at::Tensor& c) {
  const int64_t d = c.size(-1);
  if (d < 2) return EntropyPath::Composition;
#if CHIAR_CUDA_KERNELS
  if (cuda_kernels_enabled() && c.is_cuda() && cuda_entropy_takes(c) && cuda_kernels_usable())
    return EntropyPath::CudaKernel;
#endif
  const auto type = c.scalar_type();
  if (host_kernels_enabled() && c.device().is_cpu() &&
      (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf))
    return EntropyPath::HostKernel;
  return EntropyPath::Composition;
}

double smallest_normal(at::ScalarType type) {
  return type == at::kDouble ? std::numeric_limits<double>::min()
                             : static_cast<double>(std::numeric_limits<float>::min());
}

// c in fp32 at least, whatever its storage: bf16 or fp16 coefficients
// (autocast) are widened, as the kernels widen them, so that every path
// compares the same H against thresholds calibrated in fp32, and fp16's
// range does not flush the floor below to 0.
at::Tensor widened(const at::Tensor& c) { return c.scalar_type() == at::kDouble ? c : c.to(at::kFloat); }

// Each row's total energy S = sum_j c_j^2, taken as 1 for a zero vector, so
// that its p = 0 and H = 0 with finite gradients.
at::Tensor safe_totals(const at::Tensor& energy) {
  const auto total = energy.sum(-1, /*keepdim=*/true);       // (..., 1)
  return at::where(total > 0, total, at::ones_like(total));  // (..., 1)
}

// H by one of the kernels, without autograd.
at::Tensor entropy_by_kernel(const at::Tensor& c, EntropyPath path) {
#if CHIAR_CUDA_KERNELS
  if (path == EntropyPath::CudaKernel) return spectral_entropy_cuda(c);  // it reads bf16 and fp16 as they are
#endif
  (void)path;
  const int64_t d = c.size(-1);
  const auto rows = c.to(at::kFloat).contiguous();  // (..., d) widened as the composition widens
  auto h = at::empty(rows.sizes().slice(0, rows.dim() - 1), rows.options());  // (...)
  count_host_kernel();
  spectral_entropy_rows(rows.data_ptr<float>(), h.numel(), d, h.data_ptr<float>());
  return h;
}

// H by the chain of libtorch ops, differentiated by autograd when c needs it.
at::Tensor entropy_by_composition(const at::Tensor& c, bool differentiable) {
  const auto wide = widened(c);  // (..., d)
  const int64_t d = wide.size(-1);
  if (d == 1) return at::zeros(wide.sizes().slice(0, wide.dim() - 1), wide.options());
  // The smallest normal number keeps 0 * log 0 at 0.
  const double tiny = smallest_normal(wide.scalar_type());
  auto energy = wide.square();                  // (..., d)
  const auto safe_total = safe_totals(energy);  // (..., 1)
  at::Tensor plogp;                             // (..., d)
  if (differentiable) {
    auto p = energy / safe_total;
    plogp = p * p.clamp_min(tiny).log();
  } else {
    // The same values in two (..., d) buffers instead of four.
    auto p = energy.div_(safe_total);
    plogp = p.clamp_min(tiny).log_().mul_(p);
  }
  return (-plogp.sum(-1) / std::log(static_cast<double>(d))).clamp(0.0, 1.0);
}

// dH/dc from its closed form, as autograd differentiates the composition:
// with p_j = c_j^2 / S and g_j = dH/dp_j = -(log max(p_j, tiny) + [p_j >= tiny]) / log d,
//   dH/dc_i = (2 c_i / S) (g_i - sum_j p_j g_j),
// S taken as 1 for a zero vector (whose gradient is then 0), and nothing
// through H's clamp to [0, 1] where it binds.
at::Tensor entropy_gradient(const at::Tensor& c, const at::Tensor& grad_h) {
  const auto wide = widened(c);  // (..., d)
  const auto type = wide.scalar_type();
  const double tiny = smallest_normal(type);
  const double log_d = std::log(static_cast<double>(wide.size(-1)));
  const auto energy = wide.square();                                               // (..., d)
  const auto safe_total = safe_totals(energy);                                     // (..., 1)
  const auto p = energy / safe_total;                                              // (..., d)
  const auto log_p = p.clamp_min(tiny).log();                                      // (..., d)
  const auto g = (log_p + (p >= tiny).to(type)).neg_().div_(log_d);                // (..., d)
  const auto raw_h = (p * log_p).sum(-1, /*keepdim=*/true).neg_().div_(log_d);     // (..., 1)
  const auto inside = (raw_h >= 0).logical_and_(raw_h <= 1);                       // (..., 1)
  const auto upstream = grad_h.unsqueeze(-1).to(type).mul(inside.to(type));        // (..., 1)
  const auto mean_g = (p * g).sum(-1, /*keepdim=*/true);                           // (..., 1)
  return (upstream * 2.0 * wide / safe_total * (g - mean_g)).to(c.scalar_type());  // (..., d)
}

// H through a kernel in training too: the forward is the kernel's one pass
// per row, the backward the closed form above. The composition's autograd
// graph would hold four (..., d) buffers per routed layer and, where only a
// hard decision reads H (threshold routing), run a chain of launches whose
// gradient is never asked for.
struct SpectralEntropyFunction : torch::autograd::Function<SpectralEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& c, int64_t path) {
    ctx->save_for_backward({c});
    return entropy_by_kernel(c, static_cast<EntropyPath>(path));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = ctx->get_saved_variables()[0];
    return {entropy_gradient(c, grads[0]), at::Tensor()};
  }
};

}  // namespace

at::Tensor spectral_entropy_from_coeffs(const at::Tensor& c) {
  check_input(c, "spectral_entropy");
  const bool differentiable = torch::autograd::GradMode::is_enabled() && c.requires_grad();
  const EntropyPath path = entropy_path(c);
  if (path == EntropyPath::Composition) return entropy_by_composition(c, differentiable);
  if (differentiable) return SpectralEntropyFunction::apply(c, static_cast<int64_t>(path));
  return entropy_by_kernel(c, path);
}

at::Tensor spectral_entropy(const at::Tensor& x, DctImpl impl) {
  return spectral_entropy_from_coeffs(dct2_exact(x, impl));
}

namespace {

// A threshold moved out of a cluster of entropies. Tokens of one type have
// one entropy in exact arithmetic when the layers below mix no tokens (a DCT
// layer first), but fp32 gives them values a few ulps apart, by their place
// in the batch tensor. A quantile inside such a cluster would route the type
// by those ulps, so by the batch's shape: its padding, or a rank's half of
// the batch (the data-parallel test's routed ListOps run routed otherwise in
// two processes than in one). The cluster is every value within the
// tolerance of the sample value nearest tau, not a chain of close
// neighbours, so a dense sample cannot grow it. It goes wholly to the side
// that keeps the share nearer its target, ties to the cheaper side (as
// H > tau sends exactly equal values); the threshold sits halfway to the
// neighbouring value. sorted[lo] <= tau <= sorted[hi], hi <= lo + 1.
double off_cluster(const at::TensorAccessor<double, 1>& sorted, int64_t lo, int64_t hi, double tau,
                   double target_share) {
  constexpr double kTolerance = 1e-5;  // fp32 entropies in [0, 1]: an ulp is at most 6e-8
  const int64_t n = sorted.size(0);
  const int64_t nearest = tau - sorted[lo] <= sorted[hi] - tau ? lo : hi;
  const double anchor = sorted[nearest];
  if (std::abs(tau - anchor) > kTolerance) return tau;  // no value near the threshold
  int64_t first = nearest, last = nearest;
  while (first > 0 && sorted[first - 1] >= anchor - kTolerance) --first;
  while (last + 1 < n && sorted[last + 1] <= anchor + kTolerance) ++last;
  const double share_cheap = static_cast<double>(last + 1) / static_cast<double>(n);
  const double share_dear = static_cast<double>(first) / static_cast<double>(n);
  const bool cheap = std::abs(share_cheap - target_share) <= std::abs(share_dear - target_share);
  if (cheap) return last + 1 < n ? 0.5 * (sorted[last] + sorted[last + 1]) : sorted[last] + kTolerance;
  return first > 0 ? 0.5 * (sorted[first - 1] + sorted[first]) : sorted[first] - kTolerance;
}

}  // namespace

std::vector<double> calibrate_thresholds(const at::Tensor& h, const std::vector<double>& shares) {
  if (shares.size() < 2)
    throw UserError("threshold calibration: need at least 2 shares, found " + std::to_string(shares.size()));
  double sum = 0;
  for (double s : shares) {
    if (!(s >= 0.0 && s <= 1.0))
      throw UserError("threshold calibration: every share must lie in [0, 1], found " + std::to_string(s));
    sum += s;
  }
  if (std::abs(sum - 1.0) > 1e-6)
    throw UserError("threshold calibration: shares must sum to 1, found " + std::to_string(sum));
  if (!h.defined() || h.numel() == 0) throw UserError("threshold calibration: the entropy sample is empty");

  auto sorted = std::get<0>(h.detach().to(at::kCPU, at::kDouble).reshape({-1}).sort());
  auto values = sorted.accessor<double, 1>();
  const int64_t n = sorted.size(0);
  std::vector<double> out;
  double cumulative = 0;
  for (size_t i = 0; i + 1 < shares.size(); ++i) {
    cumulative += shares[i];
    // Linear interpolation between order statistics, as numpy's default quantile.
    const double pos = std::min(1.0, cumulative) * static_cast<double>(n - 1);
    const auto lo = static_cast<int64_t>(std::floor(pos));
    const int64_t hi = std::min(lo + 1, n - 1);
    const double frac = pos - static_cast<double>(lo);
    out.push_back(off_cluster(values, lo, hi, values[lo] + frac * (values[hi] - values[lo]), cumulative));
  }
  return out;
}

}  // namespace chiar
