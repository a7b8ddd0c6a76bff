// bias_gelu (the FFN's bias and activation in one pass) against GELU and its
// derivative written out from the definition in float64, erf from libm.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <vector>

#include "chiar/error.h"
#include "chiar/gelu.h"
#include "chiar/kernels.h"
#include "support/fixtures.h"

using namespace chiar;
using test::rel_error;

namespace {

struct Expected {
  at::Tensor out, grad_u, grad_bias;  // (rows, n), (rows, n), (n) float64
};

// gelu(z) = z Phi(z), Phi(z) = (1 + erf(z / sqrt 2)) / 2; gelu'(z) = Phi(z) +
// z exp(-z^2 / 2) / sqrt(2 pi); z = u + b per row; the bias gradient is the
// column sum of the input gradient.
Expected reference(const at::Tensor& u, const at::Tensor& bias, const at::Tensor& grad_out) {
  const auto ud = u.to(at::kDouble).reshape({-1, u.size(-1)}).contiguous();
  const auto bd = bias.to(at::kDouble).contiguous();
  const auto gd = grad_out.to(at::kDouble).reshape({-1, u.size(-1)}).contiguous();
  const int64_t rows = ud.size(0), n = ud.size(1);
  Expected e;
  e.out = at::empty({rows, n}, ud.options());
  e.grad_u = at::empty({rows, n}, ud.options());
  e.grad_bias = at::zeros({n}, ud.options());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const double z = ud.data_ptr<double>()[r * n + j] + bd.data_ptr<double>()[j];
      const double cdf = 0.5 * (1 + std::erf(z / std::sqrt(2.0)));
      const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
      const double g = gd.data_ptr<double>()[r * n + j] * (cdf + z * pdf);
      e.out.data_ptr<double>()[r * n + j] = z * cdf;
      e.grad_u.data_ptr<double>()[r * n + j] = g;
      e.grad_bias.data_ptr<double>()[j] += g;
    }
  return e;
}

}  // namespace

TEST_CASE("bias_gelu matches the float64 definition, forward and both gradients", "[gelu]") {
  struct Case {
    std::vector<int64_t> shape;
    double scale, tol;
  };
  // Tolerances: the erfc approximation's 1.5e-7 absolute error, fp32 rounding,
  // and the bias sums over up to 2048 rows.
  const std::vector<Case> cases = {
      {{1, 1}, 1.0, 1e-6},      {{3, 17}, 2.0, 1e-6},      {{2, 5, 33}, 3.0, 1e-6},
      {{257, 1000}, 2.0, 1e-6}, {{2048, 1024}, 1.5, 2e-6}, {{64, 48}, 12.0, 1e-6},
  };
  for (const auto& c : cases) {
    CAPTURE(c.shape, c.scale);
    at::manual_seed(21);
    const int64_t n = c.shape.back();
    auto u = (at::randn(c.shape) * c.scale).requires_grad_(true);
    auto bias = (at::randn({n}) * 0.5).requires_grad_(true);
    const auto grad_out = at::randn(c.shape);
    const auto want = reference(u.detach(), bias.detach(), grad_out);
    auto out = bias_gelu(u, bias);
    out.backward(grad_out);
    CHECK(rel_error(out.detach().reshape({-1, n}), want.out) < c.tol);
    CHECK(rel_error(u.grad().reshape({-1, n}), want.grad_u) < c.tol);
    CHECK(rel_error(bias.grad(), want.grad_bias) < c.tol);
    // In place, without autograd: the same values.
    auto inplace = u.detach().clone();
    bias_gelu_(inplace, bias.detach());
    CHECK(rel_error(inplace.reshape({-1, n}), want.out) < c.tol);
  }
}

TEST_CASE("bias_gelu on bf16 input: fp32 inside, one rounding out, the bias gradient summed in fp32", "[gelu][bf16]") {
  // Against the definition at the bf16 input and fp32 bias (what the kernel
  // reads): the output and the input gradient are rounded to bf16 once, so
  // each element is off by at most 2^-8 of itself (bf16 keeps 8 significant bits) plus what the fp32 kernel
  // errs by (the erfc approximation's 1.5e-7, times |g| for the gradient:
  // below 1e-5 for these values); the bias gradient sums the unrounded terms
  // in fp32 over 2048 rows.
  const double rounding = std::ldexp(1.0, -8), kernel_error = 1e-5, sum_tol = 2e-6;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 17}, std::vector<int64_t>{2048, 1024}}) {
    CAPTURE(shape);
    at::manual_seed(23);
    const int64_t n = shape.back();
    auto u = (at::randn(shape) * 2.0).to(at::kBFloat16).requires_grad_(true);
    auto bias = (at::randn({n}) * 0.5).requires_grad_(true);
    const auto grad_out = at::randn(shape).to(at::kBFloat16);
    const auto want = reference(u.detach(), bias.detach(), grad_out);
    const uint64_t before = host_kernel_count();
    auto out = bias_gelu(u, bias);
    CHECK(host_kernel_count() == before + 1);
    REQUIRE(out.scalar_type() == at::kBFloat16);
    out.backward(grad_out);
    REQUIRE(u.grad().scalar_type() == at::kBFloat16);
    REQUIRE(bias.grad().scalar_type() == at::kFloat);
    // The largest error beyond the rounding's share of each element.
    const auto excess = [&](const at::Tensor& got, const at::Tensor& ref) {
      return ((got.to(at::kDouble) - ref).abs() - rounding * ref.abs()).max().item<double>();
    };
    CHECK(excess(out.detach().reshape({-1, n}), want.out) <= kernel_error);
    CHECK(excess(u.grad().reshape({-1, n}), want.grad_u) <= kernel_error);
    CHECK(rel_error(bias.grad(), want.grad_bias) < sum_tol);
    auto inplace = u.detach().clone();
    bias_gelu_(inplace, bias.detach());
    CHECK(at::equal(inplace, out.detach()));
  }
}

TEST_CASE("bias_gelu's error bound in the tails; special values", "[gelu]") {
  // The erfc approximation is good to 1.5e-7 absolute, so gelu(z) = z Phi(z)
  // to 0.75e-7 |z|: in the negative tail, where gelu is tinier than that,
  // only the bound holds (a relative error there would need a different erfc).
  // The sign is never wrong: Phi is computed, not 1 - Phi cancelled.
  const auto u = at::tensor({-30.f, -12.f, -8.f, -5.f, 0.f, 5.f, 40.f, std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()});
  const auto bias = at::zeros({9});
  const auto out = bias_gelu(u, bias);
  for (int64_t j = 0; j < 6; ++j) {
    const double z = u[j].item<double>(), got = out[j].item<double>();
    const double want = z * 0.5 * std::erfc(-z / std::sqrt(2.0));
    CAPTURE(z, got, want);
    CHECK(std::abs(got - want) <= 0.75e-7 * std::abs(z) + 1e-7 * std::abs(want));
    CHECK((z >= 0 ? got >= 0 : got <= 0));
  }
  CHECK(out[6].item<float>() == 40.f);
  CHECK(std::isinf(out[7].item<float>()));
  CHECK(std::isnan(out[8].item<float>()));
}

TEST_CASE("bias_gelu's backward stays differentiable under create_graph", "[gelu]") {
  at::manual_seed(22);
  auto u = at::randn({4, 6}, at::kDouble).requires_grad_(true);
  auto bias = at::randn({6}, at::kDouble).requires_grad_(true);
  // Float64 takes libtorch's path; fp32 its own backward, which must hand
  // create_graph to libtorch too.
  auto u32 = u.detach().to(at::kFloat).requires_grad_(true);
  auto b32 = bias.detach().to(at::kFloat).requires_grad_(true);
  auto y = bias_gelu(u32, b32).sum();
  auto gu = torch::autograd::grad({y}, {u32}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  REQUIRE(gu.requires_grad());
  auto second = torch::autograd::grad({gu.sum()}, {u32})[0];  // sum_j gelu''(z)
  const auto z = (u + bias).detach();
  const auto pdf = at::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
  const auto want = pdf * (2 - z * z);  // gelu''(z) = phi(z) (2 - z^2)
  CHECK(rel_error(second.to(at::kDouble), want) < 1e-5);
}

TEST_CASE("bias_gelu names the shapes it cannot take", "[gelu]") {
  const auto u = at::zeros({2, 3});
  CHECK_THROWS_WITH(bias_gelu(u, at::zeros({4})), "bias_gelu: input [2, 3] and bias [4] are not (..., n) and (n)");
  CHECK_THROWS_AS(bias_gelu(u, at::zeros({3, 1})), UserError);
}
