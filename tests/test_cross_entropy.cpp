// linear_cross_entropy (the language model's fused head and loss) against
// the loss and both gradients written out from the definition in float64
// loops, on every GEMM library this build has.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <vector>

#include "chiar/cross_entropy.h"
#include "chiar/error.h"
#include "chiar/linear.h"
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
  const std::vector<Case> cases{
      {1, 3, 2, Weights::Mean, 0, 1e-5},      {7, 5, 11, Weights::Mask, 0, 1e-5},
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

TEST_CASE("linear_cross_entropy rejects targets outside the vocabulary and mismatched shapes", "[cross_entropy][linear]") {
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
  REQUIRE_THROWS_WITH(linear_cross_entropy(hidden, weight, at::zeros({4}, at::TensorOptions().dtype(at::kLong)),
                                           at::ones({3})),
                      "linear_cross_entropy: token_weights must be (4,), found [3]");
}
