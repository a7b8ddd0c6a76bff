// The kernel policy (chiar/kernels.h): every fast path computed under Auto
// (the host kernels, for fp32 CPU tensors) and under Compositions (the
// libtorch compositions a GPU run takes) on identical inputs, outputs and
// gradients compared. Index 0 of every pair is Auto, index 1 Compositions;
// errors are normalised by the compositions' result.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "chiar/adamw.h"
#include "chiar/cross_entropy.h"
#include "chiar/error.h"
#include "chiar/gelu.h"
#include "chiar/kernels.h"
#include "chiar/layer_norm.h"
#include "chiar/linear.h"
#include "chiar/operator.h"
#include "chiar/router.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"
#include "model/mixing_layer.h"
#include "model/model.h"
#include "model/route_mix.h"
#include "support/fixtures.h"
#include "support/skip.h"

using namespace chiar;

namespace {

constexpr KernelPolicy kPolicies[] = {KernelPolicy::Auto, KernelPolicy::Compositions};

// max |a - b| / max(max |b|, 1e-30) in float64: the error relative to the
// largest element of the reference (test::rel_error is the same ratio in L2
// norms). Infinite for tensors of different shapes or definedness; NaN (so
// every `< tol` fails) where either holds a NaN.
double max_error(const at::Tensor& a, const at::Tensor& b) {
  const double inf = std::numeric_limits<double>::infinity();
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0.0 : inf;
  if (a.sizes() != b.sizes()) return inf;
  if (b.numel() == 0) return 0.0;
  const auto da = a.detach().to(at::kDouble), db = b.detach().to(at::kDouble);
  const double num = (da - db).abs().max().item<double>();
  return num / std::max(db.abs().max().item<double>(), 1e-30);
}

// Exactly equal: same definedness, dtype, shape and values.
bool same(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

// Each tensor of `got` against the same-placed one of `want`, to tol.
void check_all(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = max_error(got[i], want[i]);
    CAPTURE(i, error);
    REQUIRE(got[i].defined() == want[i].defined());
    if (want[i].defined()) CHECK(error < tol);
  }
}

// Fresh leaves requiring grad, one per tensor; undefined stays undefined.
std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& from) {
  std::vector<at::Tensor> out;
  for (const auto& t : from) out.push_back(t.defined() ? t.detach().clone().requires_grad_(true) : at::Tensor());
  return out;
}

// The gradients of leaves, copied; undefined where a leaf is or has none.
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() && t.grad().defined() ? t.grad().clone() : at::Tensor());
  return out;
}

// The GEMM library whose host path the policy switches off: oneDNN where the
// build has it (linear's fast path needs it), else the BLAS.
GemmBackend fast_gemm() { return onednn_available() ? GemmBackend::OneDnn : GemmBackend::Blas; }

// The real rows of out (..., d) under valid (...) bool, flattened; all of
// out when valid is undefined. Outputs at padding positions are unspecified.
at::Tensor real_rows(const at::Tensor& out, const at::Tensor& valid) {
  return valid.defined() ? out.masked_select(valid.unsqueeze(-1)) : out;
}

Params rbf_params() { return Params().set("features", int64_t{16}).set("chunk", int64_t{3}); }

}  // namespace

TEST_CASE("kernel policy: names, the unknown-name error, and scoped policies", "[kernels][kernel_policy]") {
  CHECK(std::string(chiar::to_string(KernelPolicy::Auto)) == "auto");
  CHECK(std::string(chiar::to_string(KernelPolicy::Compositions)) == "aten");
  for (const auto p : kPolicies) CHECK(kernel_policy_from_string(chiar::to_string(p)) == p);
  CHECK_THROWS_WITH(kernel_policy_from_string("gpu"), "unknown kernel policy 'gpu' (known: auto, aten)");
  CHECK_THROWS_AS(kernel_policy_from_string("gpu"), UserError);
  CHECK_THROWS_AS(kernel_policy_from_string("Auto"), UserError);
  CHECK_THROWS_AS(kernel_policy_from_string("compositions"), UserError);
  CHECK_THROWS_AS(kernel_policy_from_string(""), UserError);

  const KernelPolicy before = kernel_policy();
  {
    ScopedKernelPolicy outer(KernelPolicy::Compositions);
    CHECK(kernel_policy() == KernelPolicy::Compositions);
    CHECK_FALSE(host_kernels_enabled());
    {
      ScopedKernelPolicy inner(KernelPolicy::Auto);
      CHECK(kernel_policy() == KernelPolicy::Auto);
      CHECK(host_kernels_enabled());
    }
    CHECK(kernel_policy() == KernelPolicy::Compositions);
    CHECK_FALSE(host_kernels_enabled());
  }
  CHECK(kernel_policy() == before);
  // Restored when the scope ends by an exception, too.
  try {
    ScopedKernelPolicy scope(before == KernelPolicy::Auto ? KernelPolicy::Compositions : KernelPolicy::Auto);
    throw std::runtime_error("leaving the scope");
  } catch (const std::runtime_error&) {
  }
  CHECK(kernel_policy() == before);
  // set_kernel_policy inside a scope is undone by the scope.
  {
    ScopedKernelPolicy scope(before);
    set_kernel_policy(KernelPolicy::Compositions);
    CHECK(kernel_policy() == KernelPolicy::Compositions);
    CHECK_FALSE(host_kernels_enabled());
    set_kernel_policy(KernelPolicy::Auto);
    CHECK(host_kernels_enabled());
  }
  CHECK(kernel_policy() == before);
}

TEST_CASE("kernel policy: linear and batch_matmul agree, forward and backward", "[kernels][kernel_policy]") {
  // Without oneDNN, linear() takes libtorch's path under either policy.
  if (!onednn_available())
    CHIAR_SKIP("[kernel_policy]", "this build has no oneDNN: linear's only path is libtorch's, nothing to compare");
  test::BackendScope gemm(GemmBackend::OneDnn);

  struct LinearCase {
    std::vector<int64_t> x_shape;
    int64_t n;
    bool bias, addend;
  };
  // 3-D inputs with a bias, with a bias and an addend; more inputs than
  // outputs (oneDNN's kept transposed weight); 2-D with an addend alone.
  const std::vector<LinearCase> cases{{{2, 9, 16}, 24, true, false},
                                      {{2, 9, 16}, 24, true, true},
                                      {{3, 40, 48}, 8, true, true},
                                      {{7, 5}, 3, false, true}};
  for (const auto& c : cases) {
    INFO("x " << at::IntArrayRef(c.x_shape) << ", n " << c.n << ", bias " << c.bias << ", addend " << c.addend);
    at::manual_seed(41);
    std::vector<int64_t> out_shape = c.x_shape;
    out_shape.back() = c.n;
    const auto x0 = at::randn(c.x_shape), w0 = at::randn({c.n, c.x_shape.back()});
    const auto b0 = c.bias ? at::randn({c.n}) : at::Tensor();
    const auto a0 = c.addend ? at::randn(out_shape) : at::Tensor();
    const auto g = at::randn(out_shape);
    std::vector<at::Tensor> y(2), inference(2);
    std::vector<std::vector<at::Tensor>> grads(2);
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      auto in = leaves({x0, w0, b0, a0});
      auto out = chiar::linear(in[0], in[1], in[2], in[3]);
      out.backward(g);
      y[i] = out.detach();
      grads[i] = grads_of(in);
      at::NoGradGuard no_grad;
      inference[i] = chiar::linear(x0, w0, b0, a0);
    }
    CHECK(max_error(y[0], y[1]) < 1e-5);
    CHECK(max_error(inference[0], inference[1]) < 1e-5);
    check_all(grads[0], grads[1], 1e-5);  // x, weight, bias, addend
  }

  // batch_matmul: attention's q k^T with the keys a narrowed, transposed
  // view (read in place), and many small products with a column-major b.
  at::manual_seed(42);
  const auto q0 = at::randn({3, 2, 7, 8}), k0 = at::randn({3, 2, 12, 8});
  const auto p0 = at::randn({40, 5, 6}), m0 = at::randn({40, 3, 6});
  const auto g_scores = at::randn({3, 2, 7, 9}), g_packed = at::randn({40, 5, 3});
  for (int which = 0; which < 2; ++which) {
    INFO((which == 0 ? "q k^T over a narrowed key view" : "packed products, column-major b"));
    std::vector<at::Tensor> y(2), inference(2);
    std::vector<std::vector<at::Tensor>> grads(2);
    const auto product = [&](const at::Tensor& a, const at::Tensor& b) {
      return which == 0 ? chiar::batch_matmul(a, b.narrow(2, 0, 9).transpose(-2, -1))  // (3, 2, 7, 9)
                        : chiar::batch_matmul(a, b.transpose(1, 2));                   // (40, 5, 3)
    };
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      auto in = which == 0 ? leaves({q0, k0}) : leaves({p0, m0});
      auto out = product(in[0], in[1]);
      out.backward(which == 0 ? g_scores : g_packed);
      y[i] = out.detach();
      grads[i] = grads_of(in);
      at::NoGradGuard no_grad;
      inference[i] = which == 0 ? product(q0, k0) : product(p0, m0);
    }
    CHECK(max_error(y[0], y[1]) < 1e-5);
    CHECK(max_error(inference[0], inference[1]) < 1e-5);
    check_all(grads[0], grads[1], 1e-5);
  }
}

TEST_CASE("kernel policy: layer_norm agrees, forward and every gradient", "[kernels][kernel_policy]") {
  struct NormCase {
    std::vector<int64_t> shape;
    double offset, scale;
  };
  for (const auto& c : std::vector<NormCase>{{{3, 7}, 0.0, 1.0}, {{2, 5, 33}, 3.0, 2.0}, {{4, 33, 256}, 0.0, 1.0}}) {
    CAPTURE(c.shape, c.offset, c.scale);
    at::manual_seed(31);
    const int64_t n = c.shape.back();
    const auto x0 = at::randn(c.shape) * c.scale + c.offset;
    const auto w0 = 1 + 0.3 * at::randn({n}), b0 = 0.2 * at::randn({n});
    const auto dy = at::randn(c.shape);
    std::vector<at::Tensor> y(2), inference(2);
    std::vector<std::vector<at::Tensor>> grads(2);
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      auto in = leaves({x0, w0, b0});
      auto out = chiar::layer_norm(in[0], in[1], in[2], 1e-5);
      out.backward(dy);
      y[i] = out.detach();
      grads[i] = grads_of(in);
      at::NoGradGuard no_grad;
      inference[i] = chiar::layer_norm(x0, w0, b0, 1e-5);
    }
    CHECK(max_error(y[0], y[1]) < 1e-5);
    CHECK(max_error(inference[0], inference[1]) < 1e-5);
    // dx subtracts the row means of g and of g xhat from g: that cancellation
    // leaves each path's fp32 rounding at a few 1e-6 of the largest element.
    CHECK(max_error(grads[0][0], grads[1][0]) < 3e-5);
    CHECK(max_error(grads[0][1], grads[1][1]) < 1e-5);  // weight
    CHECK(max_error(grads[0][2], grads[1][2]) < 1e-5);  // bias
  }
}

TEST_CASE("kernel policy: bias_gelu and bias_gelu_ agree, values and gradients", "[kernels][kernel_policy]") {
  struct GeluCase {
    std::vector<int64_t> shape;
    double scale;
  };
  // The host kernel's erfc approximation is good to 1.5e-7 absolute
  // (test_gelu.cpp): far inside 1e-5 of the largest output.
  for (const auto& c : std::vector<GeluCase>{{{3, 17}, 2.0}, {{2, 5, 33}, 3.0}, {{64, 48}, 12.0}}) {
    CAPTURE(c.shape, c.scale);
    at::manual_seed(21);
    const int64_t n = c.shape.back();
    const auto u0 = at::randn(c.shape) * c.scale, b0 = at::randn({n}) * 0.5;
    const auto dy = at::randn(c.shape);
    std::vector<at::Tensor> y(2), inplace(2);
    std::vector<std::vector<at::Tensor>> grads(2);
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      auto in = leaves({u0, b0});
      auto out = chiar::bias_gelu(in[0], in[1]);
      out.backward(dy);
      y[i] = out.detach();
      grads[i] = grads_of(in);
      at::NoGradGuard no_grad;
      auto u = u0.clone();
      chiar::bias_gelu_(u, b0);
      inplace[i] = u;
    }
    CHECK(max_error(y[0], y[1]) < 1e-5);
    CHECK(max_error(inplace[0], inplace[1]) < 1e-5);
    check_all(grads[0], grads[1], 1e-5);  // u, bias
  }
}

TEST_CASE("kernel policy: linear_cross_entropy agrees, loss and both gradients", "[kernels][kernel_policy]") {
  struct LossCase {
    int64_t N, d, V;
    int weights;            // 0: the mean (undefined), 1: random, 2: every third token masked
    int64_t rows_per_pass;  // 0: automatic
  };
  const std::vector<LossCase> cases{
      {7, 5, 11, 2, 0}, {64, 16, 1000, 0, 0}, {64, 16, 1000, 1, 0}, {300, 32, 2048, 2, 37}};
  // The fused path runs on whichever GEMM library is selected, oneDNN or not.
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope gemm(backend);
    for (const auto& c : cases) {
      CAPTURE(chiar::to_string(backend), c.N, c.d, c.V, c.weights, c.rows_per_pass);
      at::manual_seed(11);
      const auto h0 = at::randn({c.N, c.d}), w0 = at::randn({c.V, c.d}) * 0.5;
      const auto targets = at::randint(c.V, {c.N}, at::TensorOptions().dtype(at::kLong));
      at::Tensor token_weights;
      if (c.weights == 1) token_weights = at::rand({c.N});
      if (c.weights == 2) {
        const auto valid = (at::arange(c.N) % 3 != 1).to(at::kFloat);
        token_weights = valid / valid.sum().clamp_min(1.0);
      }
      double loss[2], inference[2];
      std::vector<std::vector<at::Tensor>> grads(2);
      for (size_t i = 0; i < 2; ++i) {
        ScopedKernelPolicy policy(kPolicies[i]);
        auto in = leaves({h0, w0});
        auto l = chiar::linear_cross_entropy(in[0], in[1], targets, token_weights, c.rows_per_pass);
        REQUIRE(l.dim() == 0);
        REQUIRE(l.scalar_type() == at::kFloat);
        (l * 0.5).backward();
        loss[i] = l.item<double>();
        grads[i] = grads_of(in);
        at::NoGradGuard no_grad;
        inference[i] = chiar::linear_cross_entropy(h0, w0, targets, token_weights, c.rows_per_pass).item<double>();
      }
      CAPTURE(loss[0], loss[1]);
      CHECK(std::abs(loss[0] - loss[1]) <= 1e-5 * std::max(std::abs(loss[1]), 1e-30));
      CHECK(std::abs(inference[0] - inference[1]) <= 1e-5 * std::max(std::abs(inference[1]), 1e-30));
      // The gradients sum V (hidden) or N (weight) terms, each path in its
      // own order: a little looser than a single product.
      check_all(grads[0], grads[1], 2e-5);  // hidden, weight
    }
  }
}

TEST_CASE("kernel policy: FusedAdamW's loop and libtorch's AdamW step reach the same parameters",
          "[kernels][kernel_policy]") {
  at::manual_seed(61);
  // A vector remainder (37), a parameter split across threads (30,000), a bias.
  const std::vector<at::Tensor> init{at::randn({37}), at::randn({300, 100}), at::randn({64})};
  std::vector<std::vector<at::Tensor>> steps(3);
  for (auto& step : steps)
    for (const auto& p : init) step.push_back(at::randn(p.sizes()) * 0.1);
  const auto options = torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  std::vector<at::Tensor> trained[2];
  for (size_t i = 0; i < 2; ++i) {
    INFO("policy " << chiar::to_string(kPolicies[i]));
    ScopedKernelPolicy policy(kPolicies[i]);
    auto params = leaves(init);
    // Two groups, as the trainer makes them: matrices decayed, vectors not.
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{params[1]}, std::make_unique<torch::optim::AdamWOptions>(options));
    groups.emplace_back(
        std::vector<at::Tensor>{params[0], params[2]},
        std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0.0)));
    FusedAdamW opt(std::move(groups));
    for (const auto& step : steps) {
      for (size_t j = 0; j < params.size(); ++j) params[j].mutable_grad() = step[j].clone();
      opt.step();
      // Auto takes the fused loop; Compositions hands every step to libtorch.
      CHECK(opt.last_step_fused() == (kPolicies[i] == KernelPolicy::Auto));
    }
    for (const auto& p : params) trained[i].push_back(p.detach().clone());
  }
  for (size_t j = 0; j < init.size(); ++j) {
    CAPTURE(j);
    // The same update, rounded in a different order.
    CHECK(max_error(trained[0][j], trained[1][j]) < 1e-6);
    // Three steps moved the parameters by far more than that.
    CHECK(max_error(trained[1][j], init[j]) > 1e-4);
  }
}

TEST_CASE("kernel policy: group_rows gives identical groups; pack_rows and unpack_rows round trip",
          "[kernels][kernel_policy]") {
  at::manual_seed(71);
  const auto long_options = at::TensorOptions().dtype(at::kLong);
  // Sorted random keys with gaps (multiples of 3, values skipped), and
  // edge cases: empty, one row, one group, every row its own group, a
  // strided (non-contiguous) view.
  const auto random = std::get<0>((at::randint(0, 40, {200}, long_options) * 3).sort());
  const std::vector<std::pair<const char*, at::Tensor>> keys{
      {"random with gaps", random},
      {"empty", at::empty({0}, long_options)},
      {"one row", at::full({1}, 5, long_options)},
      {"one group", at::full({9}, 7, long_options)},
      {"all distinct", at::arange(0, 50, 2, long_options)},
      {"strided view", random.slice(/*dim=*/0, /*start=*/0, /*end=*/random.size(0), /*step=*/2)}};
  for (const auto& [name, key] : keys) {
    INFO(name);
    RowGroups g[2];
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      g[i] = chiar::group_rows(key);
    }
    CHECK(g[0].count == g[1].count);
    CHECK(g[0].width == g[1].width);
    CHECK(same(g[0].keys, g[1].keys));
    CHECK(same(g[0].group, g[1].group));
    CHECK(same(g[0].slot, g[1].slot));
    if (g[1].count == 0) continue;
    const auto values = at::randn({key.size(0), 3});
    at::Tensor packed[2];
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      packed[i] = chiar::pack_rows(values, g[i]);
      CHECK(same(chiar::unpack_rows(packed[i], g[i]), values));
    }
    CHECK(same(packed[0], packed[1]));
  }
}

TEST_CASE("kernel policy: spectral entropy agrees, from coefficients and from vectors", "[kernels][kernel_policy]") {
  test::BackendScope gemm(fast_gemm());
  at::manual_seed(81);
  for (const int64_t d : {16, 37, 64}) {
    INFO("d " << d);
    auto x = at::randn({3, 7, d});
    x[0][0].zero_();                     // a zero vector: H = 0 on both paths
    const auto coeffs = chiar::dct2(x);  // computed once: the entropy kernel alone is compared
    at::Tensor from_coeffs[2], from_x[2];
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      from_coeffs[i] = chiar::spectral_entropy_from_coeffs(coeffs);
      from_x[i] = chiar::spectral_entropy(x);  // the DCT's product too
    }
    CHECK(max_error(from_coeffs[0], from_coeffs[1]) < 1e-5);
    CHECK(max_error(from_x[0], from_x[1]) < 1e-5);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(from_coeffs[i][0][0].item<float>() == 0.f);
      CHECK(from_coeffs[i].min().item<float>() >= 0.f);
      CHECK(from_coeffs[i].max().item<float>() <= 1.f);
    }
  }
}

TEST_CASE("kernel policy: route mixing (blend and choose) agrees, values and gradients", "[kernels][kernel_policy]") {
  constexpr int64_t B = 3, T = 7, D = 37, K = 3;  // d not a multiple of the vector width
  // Both fp32 and float64 take the host kernels under Auto.
  for (const auto& [dtype, tol] : {std::pair<at::ScalarType, double>{at::kFloat, 1e-5}, {at::kDouble, 1e-12}}) {
    INFO(dtype);
    at::manual_seed(91);
    const auto options = at::TensorOptions().dtype(dtype);
    std::vector<at::Tensor> outs0;
    for (int64_t k = 0; k < K; ++k) outs0.push_back(at::randn({B, T, D}, options));
    const auto logits0 = at::randn({B, T, K}, options);
    auto choice = at::randint(K, {B, T}, at::TensorOptions().dtype(at::kLong));
    choice[0][0] = 0, choice[0][1] = 1, choice[0][2] = 2;  // every operator chosen somewhere
    const auto probe = at::randn({B, T, D}, options);
    // 0: the soft blend; 1: the chosen output with straight-through weights;
    // 2: the chosen output without weights (hard routing).
    for (int mode = 0; mode < 3; ++mode) {
      INFO("mode " << (mode == 0 ? "blend" : mode == 1 ? "choose, straight-through" : "choose, hard"));
      at::Tensor y[2];
      std::vector<std::vector<at::Tensor>> grads(2);  // K outputs, then the logits
      for (size_t i = 0; i < 2; ++i) {
        ScopedKernelPolicy policy(kPolicies[i]);
        auto in = leaves(outs0);
        in.push_back(logits0.detach().clone().requires_grad_(true));
        const std::vector<at::Tensor> outs(in.begin(), in.begin() + K);
        const auto w = in.back().softmax(-1);
        const auto out = mode == 0   ? chiar::model::blend_outputs(outs, w)
                         : mode == 1 ? chiar::model::choose_outputs(outs, choice, w)
                                     : chiar::model::choose_outputs(outs, choice, at::Tensor());
        (out * probe).sum().backward();
        y[i] = out.detach();
        grads[i] = grads_of(in);
      }
      if (mode == 0) {
        CHECK(max_error(y[0], y[1]) < (dtype == at::kFloat ? 1e-6 : 1e-14));
      } else {
        CHECK(same(y[0], y[1]));  // the chosen output itself, bit for bit, on both paths
      }
      // The outputs' gradients are w_k g or g on the chosen tokens; the
      // weights' are <g, out_k> per token, through the softmax.
      check_all(grads[0], grads[1], tol);
      if (mode == 2) CHECK_FALSE(grads[1].back().defined());  // no weights: nothing reaches the logits
    }
  }
}

namespace {

// Forward (or forward_rows) and backward of <out, probe> from a fresh input
// leaf; then the same call again without autograd.
struct OperatorRun {
  at::Tensor out, inference;
  std::vector<at::Tensor> grads;  // the input's, then every parameter's
};

OperatorRun run_operator(Operator& op, const at::Tensor& x, const OpContext& ctx, const at::Tensor& rows,
                         const at::Tensor& probe) {
  OperatorRun r;
  auto input = x.detach().clone().requires_grad_(true);
  op.zero_grad();
  auto out = rows.defined() ? op.forward_rows(input, rows, ctx) : op.forward(input, ctx);
  (out * probe).sum().backward();
  r.out = out.detach();
  r.grads.push_back(input.grad().clone());
  for (const auto& p : op.parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  at::NoGradGuard no_grad;
  r.inference = rows.defined() ? op.forward_rows(x, rows, ctx) : op.forward(x, ctx);
  return r;
}

}  // namespace

TEST_CASE("kernel policy: operators agree through forward and forward_rows, causal and padded",
          "[kernels][kernel_policy]") {
  test::BackendScope gemm(fast_gemm());
  struct OperatorCase {
    const char* name;
    Params params;
  };
  // Attention: the fused core under Auto, SDPA or the chunked core under
  // Compositions; in one query block and in several. RBF: its scans over
  // several chunks. DCT: its products and LayerNorm.
  const std::vector<OperatorCase> cases{{"attention", Params()},
                                        {"attention", Params().set("block", int64_t{4})},
                                        {"rbf", rbf_params()},
                                        {"dct", Params()}};
  const int64_t T = 11;
  for (const auto& c : cases)
    for (const bool causal : {true, false}) {
      INFO(c.name << " " << c.params.describe() << (causal ? ", causal" : ", padded, not causal"));
      // One instance for both policies: the same parameters by construction.
      auto op = test::make_op(c.name, 16, 2, c.params, /*float64=*/false, /*seed=*/31);
      at::manual_seed(32);
      const auto x = at::randn({3, T, 16});
      OpContext ctx;
      ctx.causal = causal;
      if (!causal) ctx.valid = test::padding_mask(T, {0, 4, 1});
      // Padding outputs stay out of the loss and the comparisons.
      const auto keep = ctx.valid.defined() ? ctx.valid.unsqueeze(-1).to(at::kFloat) : at::ones({3, T, 1});
      const auto probe = at::randn({3, T, 16}) * keep;
      auto pick = at::rand({3, T}) < 0.4;
      pick[1][T - 1] = true;  // at least one row, at a sequence's end
      const auto rows = test::rows_where(pick);
      const auto probe_rows = probe.view({-1, 16}).index_select(0, rows);
      const auto row_valid = ctx.valid.defined() ? ctx.valid.reshape({-1}).index_select(0, rows) : at::Tensor();
      for (const bool by_rows : {false, true}) {
        INFO((by_rows ? "forward_rows" : "forward"));
        OperatorRun run[2];
        for (size_t i = 0; i < 2; ++i) {
          ScopedKernelPolicy policy(kPolicies[i]);
          run[i] = run_operator(*op, x, ctx, by_rows ? rows : at::Tensor(), by_rows ? probe_rows : probe);
        }
        const at::Tensor valid = by_rows ? row_valid : ctx.valid;
        CHECK(max_error(real_rows(run[0].out, valid), real_rows(run[1].out, valid)) < 1e-5);
        CHECK(max_error(real_rows(run[0].inference, valid), real_rows(run[1].inference, valid)) < 1e-5);
        // Gradients pass through the projections, the mixing and LayerNorm's
        // backward (whose cancellation loses digits): the tolerance that
        // test_operators.cpp's check_core gives fp32 cores against float64.
        check_all(run[0].grads, run[1].grads, 1e-4);
      }
    }
}

TEST_CASE("kernel policy: the threshold router decides identically", "[kernels][kernel_policy]") {
  at::manual_seed(101);
  const auto x = at::randn({4, 20, 16});
  // One entropy tensor for both policies: the decisions alone are compared.
  const auto h = chiar::spectral_entropy(x);
  struct RouterCase {
    std::vector<std::string> operators;
    std::vector<double> tau;
  };
  // The median is a token's own entropy: the H == tau edge is taken.
  const std::vector<RouterCase> cases{
      {{"dct", "attention"}, {h.median().item<double>()}},
      {{"dct", "rbf", "attention"}, {h.quantile(0.3).item<double>(), h.quantile(0.6).item<double>()}}};
  for (const auto& c : cases)
    for (const auto dtype : {at::kFloat, at::kDouble}) {
      INFO(c.operators.size() << " operators, " << dtype);
      RouterSpec spec;
      spec.d_model = 16;
      spec.operators = c.operators;
      spec.params = Params().set("tau", c.tau);
      auto router = test::plugins().make_router("threshold", spec);
      const auto xs = x.to(dtype), hs = h.to(dtype);
      RouteResult r[2];
      for (size_t i = 0; i < 2; ++i) {
        ScopedKernelPolicy policy(kPolicies[i]);
        r[i] = router->route(xs, hs, OpContext{});
      }
      CHECK(r[0].mode == r[1].mode);
      CHECK(same(r[0].choice, r[1].choice));
      CHECK(same(r[0].weights, r[1].weights));
      for (int64_t k = 0; k < static_cast<int64_t>(c.operators.size()); ++k)
        CHECK(r[1].choice.eq(k).any().item<bool>());
    }
}

TEST_CASE("kernel policy: a routed layer's sparse execution agrees (rows per operator, scatter)",
          "[kernels][kernel_policy]") {
  test::BackendScope gemm(fast_gemm());
  const std::vector<std::string> names{"dct", "rbf", "attention"};
  std::vector<std::shared_ptr<Operator>> ops;
  for (const auto& n : names)
    ops.push_back(test::make_op(n, 16, 2, n == "rbf" ? rbf_params() : Params(), /*float64=*/false, /*seed=*/92));
  at::manual_seed(93);
  const int64_t T = 13;
  const auto x = at::randn({3, T, 16});
  // Thresholds halfway between two neighbouring tokens' entropies (float64
  // here, fp32 in the layer): no token sits on one, so rounding differences
  // between the policies' spectra cannot move a token across it.
  const auto sorted = std::get<0>(chiar::spectral_entropy(x.to(at::kDouble)).reshape({-1}).sort());
  const int64_t n = sorted.size(0);
  const auto between = [&](int64_t i) { return 0.5 * (sorted[i - 1].item<double>() + sorted[i].item<double>()); };
  RouterSpec spec;
  spec.d_model = 16;
  spec.operators = names;
  spec.params = Params().set("tau", std::vector<double>{between(n / 3), between(2 * n / 3)});
  model::MixingLayer layer(1, names, ops, test::plugins().make_router("threshold", spec));
  layer.set_execution(model::Execution::Sparse);
  for (const bool causal : {true, false}) {
    INFO((causal ? "causal" : "padded, not causal"));
    OpContext ctx;
    ctx.causal = causal;
    if (!causal) ctx.valid = test::padding_mask(T, {0, 5, 2});
    const auto keep = ctx.valid.defined() ? ctx.valid.unsqueeze(-1).to(at::kFloat) : at::ones({3, T, 1});
    const auto probe = at::randn({3, T, 16}) * keep;
    at::Tensor y[2], inference[2], choice[2], inference_choice[2];
    std::vector<std::vector<at::Tensor>> grads(2);  // the input's, then every parameter's
    for (size_t i = 0; i < 2; ++i) {
      ScopedKernelPolicy policy(kPolicies[i]);
      // With autograd: rows per operator, placed by row copies (Auto) or
      // index_copy_ (Compositions).
      auto input = x.clone().requires_grad_(true);
      layer.zero_grad();
      model::LayerRouting routing;
      auto out = layer.forward(input, ctx, &routing);
      CHECK(routing.sparse);
      (out * probe).sum().backward();
      y[i] = out.detach();
      choice[i] = routing.choice;
      grads[i].push_back(input.grad().clone());
      for (const auto& p : layer.parameters()) grads[i].push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
      // Without: rows placed by the host scatter under Auto.
      at::NoGradGuard no_grad;
      model::LayerRouting eval_routing;
      inference[i] = layer.forward(x, ctx, &eval_routing);
      inference_choice[i] = eval_routing.choice;
    }
    CHECK(same(choice[0], choice[1]));
    CHECK(same(inference_choice[0], inference_choice[1]));
    for (int64_t k = 0; k < 3; ++k) CHECK(choice[1].eq(k).any().item<bool>());  // every operator has rows
    CHECK(max_error(real_rows(y[0], ctx.valid), real_rows(y[1], ctx.valid)) < 1e-5);
    CHECK(max_error(real_rows(inference[0], ctx.valid), real_rows(inference[1], ctx.valid)) < 1e-5);
    check_all(grads[0], grads[1], 1e-4);  // as for the operators above
  }
}

namespace {

// What three training steps of a tiny language model gave.
struct Trained {
  std::vector<double> thresholds;   // the routers' after calibration
  std::vector<double> losses;       // per step
  std::vector<bool> fused;          // per step: FusedAdamW took its loop
  std::vector<at::Tensor> choices;  // per step, every routed layer's
  at::Tensor eval_logits;           // after training, without autograd
  std::vector<at::Tensor> eval_choices;
  uint64_t host_kernels = 0;  // host kernel entries over all of it
};

model::ModelOptions tiny_model(std::vector<std::string> layers, const std::string& router = "threshold",
                               int64_t vocab = 50) {
  return model::ModelOptions()
      .vocab_size(vocab)
      .d_model(16)
      .n_heads(2)
      .layers(std::move(layers))
      .router(router)
      .seed(3)
      .operator_params(model::OperatorParams{{"rbf", Params().set("features", int64_t{16}).set("chunk", int64_t{4})}});
}

Trained train_tiny(const model::ModelOptions& options, bool calibrate, KernelPolicy p) {
  ScopedKernelPolicy policy(p);
  Trained t;
  const uint64_t kernels_before = host_kernel_count();
  model::ChiarModel model(test::plugins(), options);  // seeds itself: the same model under both policies
  {
    // Spread the learned gates so that every operator is chosen somewhere.
    at::NoGradGuard no_grad;
    for (auto& param : model.named_parameters())
      if (param.key().find("router") != std::string::npos) param.value().mul_(4);
  }
  if (calibrate) {
    // Distinct tokens: after a per-token first layer the thresholds fall
    // halfway between two tokens' entropies, never on one that training
    // reads, so the policies' rounding cannot move a token across one.
    at::manual_seed(111);
    const auto sample = at::randperm(options.vocab_size(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 256);
    model.calibrate_routers(sample.view({8, 32}));
    for (const auto& layer : model.mixing_layers())
      if (layer->routed())
        for (const double tau : layer->router()->thresholds()) t.thresholds.push_back(tau);
  }
  model.train();
  FusedAdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  at::manual_seed(112);
  const auto long_options = at::TensorOptions().dtype(at::kLong);
  const auto inputs = at::randint(options.vocab_size(), {3, 4, 16}, long_options);
  const auto targets = at::randint(options.vocab_size(), {3, 4, 16}, long_options);
  const auto eval_tokens = at::randint(options.vocab_size(), {4, 16}, long_options);
  for (int64_t step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    auto out = model.forward(inputs[step], {}, /*logits=*/false);
    auto loss = model.lm_loss(out, targets[step]);
    if (out.aux_loss.defined()) loss = loss + out.aux_loss;
    loss.backward();
    optimizer.step();
    t.losses.push_back(loss.item<double>());
    t.fused.push_back(optimizer.last_step_fused());
    for (const auto& r : out.routing) t.choices.push_back(r.choice);
  }
  model.eval();
  at::NoGradGuard no_grad;
  const auto out = model.forward(eval_tokens);
  t.eval_logits = out.logits;
  for (const auto& r : out.routing) t.eval_choices.push_back(r.choice);
  t.host_kernels = host_kernel_count() - kernels_before;
  return t;
}

}  // namespace

TEST_CASE("kernel policy: a tiny model trains to the same losses under both policies", "[kernels][kernel_policy]") {
  // Covers what no public entry reaches alone: the layer's spectrum and
  // entropy in context, the FFN's bias_gelu_ at evaluation, the tied head's
  // fused loss, FusedAdamW over a whole model, and sparse and dense routed
  // layers in training and at evaluation.
  test::BackendScope gemm(fast_gemm());
  struct Variant {
    const char* name;
    model::ModelOptions options;
    bool calibrate;
  };
  const std::vector<Variant> variants{
      {"baseline, all attention", tiny_model({"attn", "attn"}), false},
      // 256 tokens so that the calibration sample holds each once.
      {"dct, dct|attn, threshold, sparse",
       tiny_model({"dct", "dct|attn"}, "threshold", 256).execution(model::Execution::Sparse), true},
      {"dct, dct|rbf|attn, hard_ste", tiny_model({"dct", "dct|rbf|attn"}, "hard_ste"), false},
      {"dct, dct|rbf|attn, soft", tiny_model({"dct", "dct|rbf|attn"}, "soft"), false}};
  for (const auto& v : variants) {
    INFO(v.name);
    const Trained a = train_tiny(v.options, v.calibrate, KernelPolicy::Auto);
    const Trained b = train_tiny(v.options, v.calibrate, KernelPolicy::Compositions);
    REQUIRE(a.thresholds.size() == b.thresholds.size());
    for (size_t j = 0; j < a.thresholds.size(); ++j) CHECK(std::abs(a.thresholds[j] - b.thresholds[j]) < 1e-5);
    REQUIRE(a.losses.size() == 3u);
    REQUIRE(b.losses.size() == 3u);
    for (size_t s = 0; s < 3; ++s) {
      CAPTURE(s, a.losses[s], b.losses[s]);
      CHECK(std::isfinite(a.losses[s]));
      // Three optimiser steps on gradients that differ in rounding only.
      CHECK(std::abs(a.losses[s] - b.losses[s]) <= 1e-4 * std::abs(b.losses[s]));
      CHECK(a.fused[s]);
      CHECK_FALSE(b.fused[s]);
    }
    // A different choice would be a token within rounding of a threshold
    // or a gate's tie: change the seed, not the tolerance.
    REQUIRE(a.choices.size() == b.choices.size());
    for (size_t j = 0; j < a.choices.size(); ++j) {
      CAPTURE(j);
      CHECK(same(a.choices[j], b.choices[j]));
    }
    REQUIRE(a.eval_choices.size() == b.eval_choices.size());
    for (size_t j = 0; j < a.eval_choices.size(); ++j) {
      CAPTURE(j);
      CHECK(same(a.eval_choices[j], b.eval_choices[j]));
    }
    CHECK(max_error(a.eval_logits, b.eval_logits) < 1e-4);
    // Equal results could also mean both runs took the same path: the host
    // kernels ran under Auto, and none under Compositions.
    CHECK(a.host_kernels > 0);
    CHECK(b.host_kernels == 0);
  }
}

TEST_CASE("kernel policy: each fast path enters its host kernel under Auto and never under Compositions",
          "[kernels][kernel_policy]") {
  test::BackendScope gemm(fast_gemm());
  at::manual_seed(5);
  const auto x = at::randn({4, 6, 16});  // (B, T, d)
  const auto w = at::randn({24, 16});    // (out, d)
  const auto b = at::randn({24});
  const auto ln_w = at::randn({16}), ln_b = at::randn({16});
  const auto targets = at::randint(24, {24}, at::TensorOptions().dtype(at::kLong));
  const auto key = at::tensor(std::vector<int64_t>{0, 0, 1, 3, 3, 3}, at::TensorOptions().dtype(at::kLong));
  const auto outs = std::vector<at::Tensor>{at::randn({2, 3, 16}), at::randn({2, 3, 16})};  // (B, T, d) each
  const auto mix = at::softmax(at::randn({2, 3, 2}), -1);                                   // (B, T, K)
  const auto choice =                                                                       // (B, T)
      at::tensor(std::vector<int64_t>{0, 1, 1, 0, 1, 0}, at::TensorOptions().dtype(at::kLong)).view({2, 3});
  const std::vector<std::pair<const char*, std::function<void()>>> paths = {
      {"linear", [&] { chiar::linear(x, w, b); }},
      {"batch_matmul", [&] { chiar::batch_matmul(x, x.transpose(1, 2)); }},
      {"layer_norm", [&] { chiar::layer_norm(x, ln_w, ln_b, 1e-5); }},
      {"bias_gelu", [&] { chiar::bias_gelu(x, ln_b); }},
      {"linear_cross_entropy",
       [&] {
         chiar::linear_cross_entropy(x.reshape({-1, 16}), w, targets, {}, 0);
       }},
      {"group_rows", [&] { chiar::group_rows(key); }},
      {"spectral_entropy",
       [&] {
         at::NoGradGuard g;
         chiar::spectral_entropy_from_coeffs(x);
       }},
      {"blend_outputs", [&] { chiar::model::blend_outputs(outs, mix); }},
      {"choose_outputs", [&] { chiar::model::choose_outputs(outs, choice, {}); }},
  };
  for (const auto& [name, run] : paths) {
    INFO(name);
    for (const auto p : kPolicies) {
      ScopedKernelPolicy policy(p);
      const uint64_t before = host_kernel_count();
      run();
      if (p == KernelPolicy::Auto)
        CHECK(host_kernel_count() > before);
      else
        CHECK(host_kernel_count() == before);
    }
  }
}

TEST_CASE("cuda_kernels_state: what a run on a GPU records of the harness's CUDA kernels", "[kernels][kernel_policy]") {
  const std::string state = cuda_kernels_state();
  INFO(state);
  if (!cuda_kernels_enabled()) {
    CHECK(state == "none in this build");
    return;
  }
  // A CUDA build: on, or off with the reason (no GPU, an old driver, no code for it).
  CHECK((state.rfind("on (built with CUDA ", 0) == 0 || state.rfind("off: ", 0) == 0));
  ScopedKernelPolicy aten(KernelPolicy::Compositions);
  CHECK(cuda_kernels_state() == "off by the kernel policy");
}
