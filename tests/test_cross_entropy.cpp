// linear_cross_entropy (the language model's fused head and loss) against
// the loss and both gradients written out from the definition in float64
// loops, on every GEMM library this build has.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <limits>
#include <vector>

#include "chiar/cross_entropy.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/linear.h"
#include "chiar/linear.h"
#include "core/autocast_compat.h"
#include "support/fixtures.h"

using namespace chiar;
using test::rel_error;

namespace {

struct Expected {
  double loss = 0;
  at::Tensor grad_hidden, grad_weight;  // (N, d), (V, d) float64
};

// loss = sum_i w_i (log sum_j exp z_ij - z_it), z = h W^T; d loss / d z_ij =
// w_i (softmax_ij - [j == t_i]); dh = dz W, dW = dz^T h. w_i = 1/N when
// weights is undefined.
Expected reference(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                   const at::Tensor& weights) {
  const auto h = hidden.to(at::kDouble).contiguous(), w = weight.to(at::kDouble).contiguous();
  const int64_t N = h.size(0), d = h.size(1), V = w.size(0);
  const double* hp = h.data_ptr<double>();
  const double* wp = w.data_ptr<double>();
  Expected e;
  e.grad_hidden = at::zeros({N, d}, h.options());
  e.grad_weight = at::zeros({V, d}, h.options());
  double* gh = e.grad_hidden.data_ptr<double>();
  double* gw = e.grad_weight.data_ptr<double>();
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t i = 0; i < N; ++i) {
    const double wi = weights.defined() ? weights[i].item<double>() : 1.0 / static_cast<double>(N);
    const int64_t t = targets[i].item<int64_t>();
    double top = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < V; ++j) {
      double s = 0;
      for (int64_t k = 0; k < d; ++k) s += hp[i * d + k] * wp[j * d + k];
      z[static_cast<size_t>(j)] = s;
      top = std::max(top, s);
    }
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[static_cast<size_t>(j)] - top);
    e.loss += wi * (top + std::log(sum) - z[static_cast<size_t>(t)]);
    for (int64_t j = 0; j < V; ++j) {
      const double dz = wi * (std::exp(z[static_cast<size_t>(j)] - top) / sum - (j == t ? 1.0 : 0.0));
      for (int64_t k = 0; k < d; ++k) {
        gh[i * d + k] += dz * wp[j * d + k];
        gw[j * d + k] += dz * hp[i * d + k];
      }
    }
  }
  return e;
}

enum class Weights { Mean, Mask, Random };

struct Case {
  int64_t N, d, V;
  Weights weights;
  int64_t rows_per_pass;  // 0: automatic
  double tol;
};

at::Tensor token_weights(Weights kind, int64_t N) {
  if (kind == Weights::Mean) return {};
  if (kind == Weights::Random) return at::rand({N});
  auto valid = (at::arange(N) % 3 != 1).to(at::kFloat);  // every third token padding
  return valid / valid.sum().clamp_min(1.0);
}

}  // namespace

TEST_CASE("linear_cross_entropy matches the float64 definition, loss and both gradients", "[cross_entropy][linear]") {
  // (N, d, V, weights, rows per pass, tolerance): single rows, odd sizes, the
  // anchor's vocabulary with a pass split mid-batch, GPT-2's vocabulary.
  const std::vector<Case> cases{{1, 3, 2, Weights::Mean, 0, 1e-5},        {7, 5, 11, Weights::Mask, 0, 1e-5},
                                {64, 16, 1000, Weights::Random, 0, 1e-5}, {300, 32, 8192, Weights::Mean, 0, 2e-5},
                                {300, 32, 8192, Weights::Mask, 37, 2e-5}, {65, 8, 50257, Weights::Mean, 16, 2e-5}};
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    for (const auto& c : cases) {
      CAPTURE(to_string(backend), c.N, c.d, c.V, static_cast<int>(c.weights), c.rows_per_pass);
      at::manual_seed(11);
      auto hidden = at::randn({c.N, c.d}).requires_grad_(true);
      auto weight = (at::randn({c.V, c.d}) * 0.5).requires_grad_(true);
      const auto targets = at::randint(c.V, {c.N}, at::TensorOptions().dtype(at::kLong));
      const auto w = token_weights(c.weights, c.N);
      const auto expected = reference(hidden.detach(), weight.detach(), targets, w);
      auto loss = linear_cross_entropy(hidden, weight, targets, w, c.rows_per_pass);
      REQUIRE(loss.dim() == 0);
      REQUIRE(loss.scalar_type() == at::kFloat);
      CHECK(std::abs(loss.item<double>() - expected.loss) <= c.tol * std::max(1.0, std::abs(expected.loss)));
      (loss * 0.5).backward();  // backward scales by the incoming gradient
      CHECK(rel_error(hidden.grad(), expected.grad_hidden * 0.5) < c.tol);
      CHECK(rel_error(weight.grad(), expected.grad_weight * 0.5) < c.tol);
      // Without gradients: the same value, nothing kept for backward.
      at::NoGradGuard no_grad;
      CHECK(linear_cross_entropy(hidden, weight, targets, w, c.rows_per_pass).item<double>() ==
            Approx(loss.item<double>()).epsilon(1e-6));
    }
  }
}

// At an incoming gradient of 1 (loss.backward()) backward hands autograd the
// gradients forward saved, not scaled copies: a second backward over the kept
// graph must find them unchanged by the first's accumulation into .grad.
TEST_CASE("linear_cross_entropy at an incoming gradient of 1: the saved gradients, unchanged over a kept graph",
          "[cross_entropy][linear]") {
  at::manual_seed(17);
  auto hidden = at::randn({40, 16}).requires_grad_(true);
  auto weight = (at::randn({300, 16}) * 0.5).requires_grad_(true);
  const auto targets = at::randint(300, {40}, at::TensorOptions().dtype(at::kLong));
  const auto expected = reference(hidden.detach(), weight.detach(), targets, at::Tensor());
  auto loss = linear_cross_entropy(hidden, weight, targets, at::Tensor(), 0);
  loss.backward({}, /*retain_graph=*/true);
  CHECK(rel_error(hidden.grad(), expected.grad_hidden) < 1e-5);
  CHECK(rel_error(weight.grad(), expected.grad_weight) < 1e-5);
  const auto first_hidden = hidden.grad().clone(), first_weight = weight.grad().clone();
  loss.backward({}, /*retain_graph=*/true);
  CHECK(at::equal(hidden.grad(), 2 * first_hidden));
  CHECK(at::equal(weight.grad(), 2 * first_weight));
  loss.backward();
  CHECK(at::equal(hidden.grad(), 3 * first_hidden));
  CHECK(at::equal(weight.grad(), 3 * first_weight));
}

TEST_CASE("linear_cross_entropy under bf16 autocast on the CPU: the fused head's bf16 products, fp32 sums",
          "[cross_entropy][linear][bf16]") {
  // Against the definition of the operands rounded to bf16 (what autocast
  // multiplies): a product of two bf16 values is exact in fp32, so the loss
  // is off by fp32 sums only; the gradients by the logits' gradient rounded
  // to bf16 once for the backward products, at most 2^-8 of each term (bf16
  // keeps 8 significant bits).
  const double grad_tol = std::ldexp(1.0, -8) + 1e-5;
  const std::vector<Case> cases{{7, 5, 11, Weights::Mask, 0, 1e-5},
                                {64, 16, 1000, Weights::Random, 0, 1e-5},
                                {300, 32, 8192, Weights::Mask, 37, 2e-5},
                                {65, 8, 50257, Weights::Mean, 16, 2e-5},
                                {96, 32, 1024, Weights::Random, 32, 1e-5}};
  for (const auto& c : cases) {
    CAPTURE(c.N, c.d, c.V, static_cast<int>(c.weights), c.rows_per_pass);
    at::manual_seed(13);
    auto hidden = at::randn({c.N, c.d}).requires_grad_(true);
    auto weight = (at::randn({c.V, c.d}) * 0.5).requires_grad_(true);
    const auto targets = at::randint(c.V, {c.N}, at::TensorOptions().dtype(at::kLong));
    const auto w = token_weights(c.weights, c.N);
    const auto expected = reference(hidden.detach().to(at::kBFloat16), weight.detach().to(at::kBFloat16), targets, w);
    const uint64_t before = host_kernel_count(), reads_before = gemm_bf16_packed_b_reads();
    at::Tensor loss;
    {
      const autocast::Bf16Scope cast(true, hidden.device());
      loss = linear_cross_entropy(hidden, weight, targets, w, c.rows_per_pass);
    }
    CHECK(host_kernel_count() == before + 1);  // the fused head, not the (N, V) logits
    // Blocks of multiples of 32 rows, at widths of multiples of 32, read the
    // weight packed: the logits' product and the hidden gradient's, per block.
    const bool packs = gemm_bf16_native() && c.rows_per_pass > 0 && c.rows_per_pass % 32 == 0 &&
                       c.N % c.rows_per_pass == 0 && c.d % 32 == 0 && c.V % 32 == 0;
    CHECK(gemm_bf16_packed_b_reads() - reads_before ==
          (packs ? 2u * static_cast<uint64_t>(c.N / c.rows_per_pass) : 0u));
    REQUIRE(loss.scalar_type() == at::kFloat);
    CHECK(std::abs(loss.item<double>() - expected.loss) <= c.tol * std::max(1.0, std::abs(expected.loss)));
    loss.backward();
    REQUIRE(weight.grad().scalar_type() == at::kFloat);
    CHECK(rel_error(hidden.grad(), expected.grad_hidden) < grad_tol);
    CHECK(rel_error(weight.grad(), expected.grad_weight) < grad_tol);
  }
}

TEST_CASE("linear_cross_entropy outside fp32 takes libtorch's path with the same value", "[cross_entropy][linear]") {
  at::manual_seed(12);
  auto hidden = at::randn({9, 6}, at::TensorOptions().dtype(at::kDouble)).requires_grad_(true);
  auto weight = at::randn({13, 6}, at::TensorOptions().dtype(at::kDouble)).requires_grad_(true);
  const auto targets = at::randint(13, {9}, at::TensorOptions().dtype(at::kLong));
  const auto w = at::rand({9}, at::TensorOptions().dtype(at::kDouble));
  const auto expected = reference(hidden.detach(), weight.detach(), targets, w);
  auto loss = linear_cross_entropy(hidden, weight, targets, w);
  REQUIRE(loss.scalar_type() == at::kDouble);
  CHECK(loss.item<double>() == Approx(expected.loss).epsilon(1e-12));
  loss.backward();
  CHECK(rel_error(hidden.grad(), expected.grad_hidden) < 1e-12);
  CHECK(rel_error(weight.grad(), expected.grad_weight) < 1e-12);
}

TEST_CASE("linear_cross_entropy: a row with a non-finite logit makes the loss NaN", "[cross_entropy][linear]") {
  at::manual_seed(13);
  auto hidden = at::randn({5, 4});
  hidden[2][1] = std::numeric_limits<float>::quiet_NaN();
  const auto weight = at::randn({10, 4});
  const auto targets = at::randint(10, {5}, at::TensorOptions().dtype(at::kLong));
  CHECK(std::isnan(linear_cross_entropy(hidden, weight, targets).item<double>()));
  hidden[2][1] = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(linear_cross_entropy(hidden, weight, targets).item<double>()));
  // libtorch agrees on both.
  CHECK(std::isnan(at::cross_entropy_loss(at::matmul(hidden, weight.t()), targets).item<double>()));
}

TEST_CASE("linear_cross_entropy of no rows: the mean is NaN, a weighted sum 0, fused or not",
          "[cross_entropy][linear]") {
  for (const auto policy : {KernelPolicy::Auto, KernelPolicy::Compositions}) {
    ScopedKernelPolicy scope(policy);
    CAPTURE(policy == KernelPolicy::Auto ? "fused host kernel" : "libtorch's path");
    auto weight = at::randn({10, 4}).requires_grad_(true);
    auto hidden = at::zeros({0, 4}).requires_grad_(true);
    const auto targets = at::zeros({0}, at::TensorOptions().dtype(at::kLong));
    CHECK(std::isnan(linear_cross_entropy(hidden, weight, targets).item<double>()));
    const auto loss = linear_cross_entropy(hidden, weight, targets, at::zeros({0}));
    CHECK(loss.item<double>() == 0.0);
    loss.backward();
    CHECK(at::equal(weight.grad(), at::zeros({10, 4})));
    CHECK(hidden.grad().sizes() == at::IntArrayRef({0, 4}));
  }
}

TEST_CASE("linear_cross_entropy rejects targets outside the vocabulary and mismatched shapes",
          "[cross_entropy][linear]") {
  const auto hidden = at::zeros({4, 3}), weight = at::zeros({11, 3});
  auto targets = at::tensor(std::vector<int64_t>{0, 10, 11, 2});
  REQUIRE_THROWS_WITH(linear_cross_entropy(hidden, weight, targets),
                      "linear_cross_entropy: target 11 of row 2 is outside the vocabulary [0, 11)");
  targets = at::tensor(std::vector<int64_t>{-1, 0, 0, 0});
  REQUIRE_THROWS_WITH(linear_cross_entropy(hidden, weight, targets),
                      "linear_cross_entropy: target -1 of row 0 is outside the vocabulary [0, 11)");
  REQUIRE_THROWS_WITH(linear_cross_entropy(hidden, at::zeros({11, 4}), targets),
                      "linear_cross_entropy: hidden [4, 3] and weight [11, 4] are not (N, d) and (V, d)");
  REQUIRE_THROWS_WITH(linear_cross_entropy(hidden, weight, at::zeros({4}, at::TensorOptions().dtype(at::kInt))),
                      "linear_cross_entropy: targets must be (4,) int64, found [4] Int");
  REQUIRE_THROWS_WITH(
      linear_cross_entropy(hidden, weight, at::zeros({4}, at::TensorOptions().dtype(at::kLong)), at::ones({3})),
      "linear_cross_entropy: token_weights must be (4,), found [3]");
}

namespace {

// chunked_linear_cross_entropy's loss and gradients against the float64
// definition, the gradients through a backward that scales them by 0.5.
void check_chunked(const at::Tensor& hidden0, const at::Tensor& weight0, const at::Tensor& targets, const at::Tensor& w,
                   at::ScalarType compute, int64_t rows_per_pass, const Expected& expected, double tol) {
  auto hidden = hidden0.detach().clone().requires_grad_(true);
  auto weight = weight0.detach().clone().requires_grad_(true);
  auto loss = chunked_linear_cross_entropy(hidden, weight, targets, w, compute, rows_per_pass);
  REQUIRE(loss.dim() == 0);
  REQUIRE(loss.scalar_type() == hidden.scalar_type());
  CHECK(std::abs(loss.item<double>() - expected.loss) <= tol * std::max(1.0, std::abs(expected.loss)));
  (loss * 0.5).backward();
  REQUIRE(hidden.grad().scalar_type() == hidden.scalar_type());
  REQUIRE(weight.grad().scalar_type() == weight.scalar_type());
  CHECK(rel_error(hidden.grad().cpu(), expected.grad_hidden * 0.5) < tol);
  CHECK(rel_error(weight.grad().cpu(), expected.grad_weight * 0.5) < tol);
  at::NoGradGuard no_grad;  // the same value without gradients
  CHECK(chunked_linear_cross_entropy(hidden, weight, targets, w, compute, rows_per_pass).item<double>() ==
        Approx(loss.item<double>()).epsilon(1e-6));
}

// Cases around the padding of V to 64 rows and blocks that split the batch.
const std::vector<Case> kChunkedCases{{1, 3, 2, Weights::Mean, 0, 0},
                                      {7, 5, 11, Weights::Mask, 3, 0},
                                      {64, 16, 1000, Weights::Random, 0, 0},
                                      {130, 16, 8192, Weights::Mask, 64, 0},
                                      {65, 8, 50257, Weights::Mean, 16, 0}};

}  // namespace

TEST_CASE("chunked_linear_cross_entropy (a GPU's blocks) matches the float64 definition on the CPU",
          "[cross_entropy][chunked]") {
  for (const auto& c : kChunkedCases) {
    CAPTURE(c.N, c.d, c.V, static_cast<int>(c.weights), c.rows_per_pass);
    at::manual_seed(21);
    const auto hidden = at::randn({c.N, c.d}, at::TensorOptions().dtype(at::kDouble));
    const auto weight = at::randn({c.V, c.d}, at::TensorOptions().dtype(at::kDouble)) * 0.5;
    const auto targets = at::randint(c.V, {c.N}, at::TensorOptions().dtype(at::kLong));
    const auto w = token_weights(c.weights, c.N);
    {
      INFO("float64 products");
      const auto w64 = w.defined() ? w.to(at::kDouble) : w;
      check_chunked(hidden, weight, targets, w64, at::kDouble, c.rows_per_pass, reference(hidden, weight, targets, w64),
                    1e-10);
    }
    const auto h32 = hidden.to(at::kFloat), w32 = weight.to(at::kFloat);
    {
      INFO("fp32 products");
      check_chunked(h32, w32, targets, w, at::kFloat, c.rows_per_pass, reference(h32, w32, targets, w), 2e-5);
    }
    {
      // bf16 products from fp32 tensors, as under autocast: against the
      // definition of the rounded operands, within what bf16 logits and
      // gradients (8 bits) leave.
      INFO("bf16 products");
      const auto expected = reference(h32.to(at::kBFloat16), w32.to(at::kBFloat16), targets, w);
      check_chunked(h32, w32, targets, w, at::kBFloat16, c.rows_per_pass, expected, 3e-2);
    }
  }
}

TEST_CASE("chunked_linear_cross_entropy: non-finite rows and targets outside the vocabulary give NaN, no exception",
          "[cross_entropy][chunked]") {
  at::manual_seed(22);
  const auto weight = at::randn({70, 4});
  auto hidden = at::randn({5, 4});
  auto targets = at::randint(70, {5}, at::TensorOptions().dtype(at::kLong));
  CHECK(std::isfinite(chunked_linear_cross_entropy(hidden, weight, targets, {}, at::kFloat).item<double>()));
  for (const int64_t outside : {int64_t{70}, int64_t{-1}}) {
    auto bad = targets.clone();
    bad[3] = outside;
    CHECK(std::isnan(chunked_linear_cross_entropy(hidden, weight, bad, {}, at::kFloat, 2).item<double>()));
  }
  hidden[1][0] = std::numeric_limits<float>::infinity();
  auto h = hidden.clone().requires_grad_(true);
  const auto loss = chunked_linear_cross_entropy(h, weight, targets, {}, at::kFloat, 2);
  CHECK(std::isnan(loss.item<double>()));
  loss.backward();
  CHECK(h.grad()[1].isnan().all().item<bool>());
  CHECK(h.grad()[0].isfinite().all().item<bool>());
  // The mean of no rows is NaN; a weighted sum over none is 0.
  const auto none = at::zeros({0, 4});
  const auto no_targets = at::zeros({0}, at::TensorOptions().dtype(at::kLong));
  CHECK(std::isnan(chunked_linear_cross_entropy(none, weight, no_targets, {}, at::kFloat).item<double>()));
  CHECK(chunked_linear_cross_entropy(none, weight, no_targets, at::zeros({0}), at::kFloat).item<double>() == 0.0);
}

TEST_CASE("chunked_linear_cross_entropy: one gradient when one input wants it; exact messages for bad input",
          "[cross_entropy][chunked]") {
  at::manual_seed(25);
  const auto hidden = at::randn({9, 6}, at::TensorOptions().dtype(at::kDouble));
  const auto weight = at::randn({70, 6}, at::TensorOptions().dtype(at::kDouble));
  const auto targets = at::randint(70, {9}, at::TensorOptions().dtype(at::kLong));
  const auto expected = reference(hidden, weight, targets, {});
  auto w = weight.clone().requires_grad_(true);
  chunked_linear_cross_entropy(hidden, w, targets, {}, at::kDouble, 4).backward();
  CHECK(rel_error(w.grad(), expected.grad_weight) < 1e-10);
  auto h = hidden.clone().requires_grad_(true);
  chunked_linear_cross_entropy(h, weight, targets, {}, at::kDouble, 4).backward();
  CHECK(rel_error(h.grad(), expected.grad_hidden) < 1e-10);
  REQUIRE_THROWS_WITH(chunked_linear_cross_entropy(hidden, weight, targets, {}, at::kHalf),
                      "chunked_linear_cross_entropy: products in Half are not supported (fp64, fp32 or bf16)");
  REQUIRE_THROWS_WITH(chunked_linear_cross_entropy(hidden, weight.narrow(1, 0, 5), targets, {}, at::kDouble),
                      "chunked_linear_cross_entropy: hidden [9, 6] and weight [70, 5] are not (N, d) and (V, d)");
  REQUIRE_THROWS_WITH(chunked_linear_cross_entropy(hidden, weight, targets.narrow(0, 0, 8), {}, at::kDouble),
                      "chunked_linear_cross_entropy: targets must be (9,) int64, found [8] Long");
  REQUIRE_THROWS_WITH(chunked_linear_cross_entropy(hidden, weight, targets, at::ones({3}), at::kDouble),
                      "chunked_linear_cross_entropy: token_weights must be (9,), found [3]");
}

TEST_CASE("cuda: the language model head on a GPU takes the blocks and the head kernel, and matches the definition",
          "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const at::Device gpu(at::kCUDA);
  for (const auto& c : kChunkedCases) {
    CAPTURE(c.N, c.d, c.V, static_cast<int>(c.weights), c.rows_per_pass);
    at::manual_seed(23);
    const auto hidden = at::randn({c.N, c.d});
    const auto weight = at::randn({c.V, c.d}) * 0.5;
    const auto targets = at::randint(c.V, {c.N}, at::TensorOptions().dtype(at::kLong));
    const auto w = token_weights(c.weights, c.N);
    const auto wg = w.defined() ? w.to(gpu) : w;
    const auto expected = reference(hidden, weight, targets, w);
    const uint64_t before = cuda_kernel_count();
    {
      INFO("fp32 through linear_cross_entropy, with the head kernel");
      check_chunked(hidden.to(gpu), weight.to(gpu), targets.to(gpu), wg, at::kFloat, c.rows_per_pass, expected, 2e-5);
      // Required as tests/test_cuda_kernels.cpp requires the others: a GPU
      // check whose build lacks them, or whose driver refuses them, fails.
      CHECK(cuda_kernels_usable());
      CHECK(cuda_kernel_count() > before);
    }
    {
      INFO("fp32 with the composition in place of the kernel");
      ScopedKernelPolicy aten(KernelPolicy::Compositions);
      const uint64_t kernels = cuda_kernel_count();
      check_chunked(hidden.to(gpu), weight.to(gpu), targets.to(gpu), wg, at::kFloat, c.rows_per_pass, expected, 2e-5);
      CHECK(cuda_kernel_count() == kernels);
    }
    {
      INFO("bf16 products");
      const auto rounded = reference(hidden.to(at::kBFloat16), weight.to(at::kBFloat16), targets, w);
      check_chunked(hidden.to(gpu), weight.to(gpu), targets.to(gpu), wg, at::kBFloat16, c.rows_per_pass, rounded, 3e-2);
    }
  }
  // A language model's loss on the GPU under autocast takes the blocks in
  // bf16: within bf16's reach of the CPU's fp32 value.
  at::manual_seed(24);
  const auto hidden = at::randn({300, 32}), weight = at::randn({8192, 32}) * 0.5;
  const auto targets = at::randint(8192, {300}, at::TensorOptions().dtype(at::kLong));
  const double cpu = linear_cross_entropy(hidden, weight, targets).item<double>();
  double cast = 0;
  {
    const autocast::Bf16Scope bf16(true, gpu);
    cast = linear_cross_entropy(hidden.to(gpu), weight.to(gpu), targets.to(gpu)).item<double>();
  }
  CHECK(cast == Approx(cpu).epsilon(2e-2));
  // Rows the kernel must mark: a non-finite logit, a target outside.
  auto bad_hidden = hidden.narrow(0, 0, 4).clone();
  bad_hidden[1][0] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(chunked_linear_cross_entropy(bad_hidden.to(gpu), weight.to(gpu), targets.narrow(0, 0, 4).to(gpu), {},
                                                at::kBFloat16)
                       .item<double>()));
  // Tensors on another device are refused by name, before any launch.
  REQUIRE_THROWS_WITH(
      chunked_linear_cross_entropy(hidden.to(gpu), weight.to(gpu), targets, {}, at::kFloat),
      "chunked_linear_cross_entropy: every tensor must be on hidden's device (cuda:0), found one on cpu");
  auto bad_targets = targets.narrow(0, 0, 4).clone();
  bad_targets[2] = 8192;
  CHECK(std::isnan(
      chunked_linear_cross_entropy(hidden.narrow(0, 0, 4).to(gpu), weight.to(gpu), bad_targets.to(gpu), {}, at::kFloat)
          .item<double>()));
}
