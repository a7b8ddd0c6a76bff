// chiar::layer_norm against LayerNorm and its gradients written out from the
// definition in float64 loops.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "chiar/error.h"
#include "chiar/layer_norm.h"
#include "support/fixtures.h"

using namespace chiar;
using test::rel_error;

namespace {

struct Expected {
  at::Tensor y, dx, dw, db;  // (rows, n), (rows, n), (n), (n) float64
};

// y = xhat w + b, xhat = (x - mean) / sqrt(var + eps) (biased variance);
// dx = (1/sigma) (g - mean(g) - xhat mean(g xhat)), g = dy w; dw = sum dy xhat, db = sum dy.
Expected reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& dy, double eps) {
  const int64_t n = x.size(-1);
  const auto xd = x.to(at::kDouble).reshape({-1, n}).contiguous(),
             dyd = dy.to(at::kDouble).reshape({-1, n}).contiguous();
  const auto wd = w.to(at::kDouble).contiguous(), bd = b.to(at::kDouble).contiguous();
  const int64_t rows = xd.size(0);
  Expected e{at::empty({rows, n}, xd.options()), at::empty({rows, n}, xd.options()), at::zeros({n}, xd.options()),
             at::zeros({n}, xd.options())};
  const double *xp = xd.data_ptr<double>(), *gp = dyd.data_ptr<double>(), *wp = wd.data_ptr<double>(),
               *bp = bd.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) mean += xp[r * n + j] / static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) var += (xp[r * n + j] - mean) * (xp[r * n + j] - mean) / static_cast<double>(n);
    const double rstd = 1 / std::sqrt(var + eps);
    double g_mean = 0, gx_mean = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double xhat = (xp[r * n + j] - mean) * rstd, g = gp[r * n + j] * wp[j];
      e.y.data_ptr<double>()[r * n + j] = xhat * wp[j] + bp[j];
      g_mean += g / static_cast<double>(n);
      gx_mean += g * xhat / static_cast<double>(n);
      e.dw.data_ptr<double>()[j] += gp[r * n + j] * xhat;
      e.db.data_ptr<double>()[j] += gp[r * n + j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const double xhat = (xp[r * n + j] - mean) * rstd;
      e.dx.data_ptr<double>()[r * n + j] = rstd * (gp[r * n + j] * wp[j] - g_mean - xhat * gx_mean);
    }
  }
  return e;
}

}  // namespace

TEST_CASE("layer_norm matches the float64 definition, forward and all gradients", "[layer_norm]") {
  struct Case {
    std::vector<int64_t> shape;
    double offset, scale, eps, tol;
  };
  // Offsets far from zero check that the variance does not cancel; a row of
  // constants has zero variance and leans on eps.
  const std::vector<Case> cases = {
      {{1, 1}, 0.0, 1.0, 1e-5, 1e-5},        {{3, 7}, 0.0, 1.0, 1e-5, 1e-5},       {{2, 5, 33}, 3.0, 2.0, 1e-5, 1e-5},
      {{4, 256, 256}, 0.0, 1.0, 1e-5, 1e-5}, {{17, 1000}, 100.0, 0.5, 1e-5, 2e-5}, {{8, 64}, 0.0, 1e-4, 1e-3, 1e-5},
  };
  for (const auto& c : cases) {
    CAPTURE(c.shape, c.offset, c.scale);
    at::manual_seed(31);
    const int64_t n = c.shape.back();
    auto x = (at::randn(c.shape) * c.scale + c.offset).requires_grad_(true);
    auto w = (1 + 0.3 * at::randn({n})).requires_grad_(true);
    auto b = (0.2 * at::randn({n})).requires_grad_(true);
    const auto dy = at::randn(c.shape);
    const auto want = reference(x.detach(), w.detach(), b.detach(), dy, c.eps);
    auto y = layer_norm(x, w, b, c.eps);
    y.backward(dy);
    CHECK(rel_error(y.detach().reshape({-1, n}), want.y) < c.tol);
    if (n > 1)
      CHECK(rel_error(x.grad().reshape({-1, n}), want.dx) < c.tol * 10);
    else  // one feature: dx is exactly 0; fused multiply-adds leave rounding noise
      CHECK(x.grad().abs().max().item<double>() < 1e-6 * (dy.abs().max().item<double>() + 1));
    CHECK(rel_error(w.grad(), want.dw) < c.tol);
    CHECK(rel_error(b.grad(), want.db) < c.tol);
  }
}

TEST_CASE("layer_norm: a constant row, create_graph, the module wrapper, bad shapes", "[layer_norm]") {
  SECTION("a constant row normalises to the bias") {
    const auto x = at::full({2, 16}, 3.5f);
    const auto b = at::arange(16, at::kFloat);
    CHECK(rel_error(layer_norm(x, at::ones({16}), b, 1e-5), b.expand({2, 16})) == 0);
  }
  SECTION("create_graph: second derivatives agree with libtorch's") {
    at::manual_seed(32);
    const auto x0 = at::randn({3, 8});
    const auto w0 = at::randn({8}), b0 = at::randn({8});
    auto second = [&](bool ours) {
      auto x = x0.clone().requires_grad_(true);
      auto y = ours ? layer_norm(x, w0, b0, 1e-5) : at::layer_norm(x, {8}, w0, b0, 1e-5);
      auto g = torch::autograd::grad({(y * y * y).sum()}, {x}, {}, true, true)[0];
      return torch::autograd::grad({g.square().sum()}, {x})[0];
    };
    CHECK(rel_error(second(true), second(false)) < 1e-4);
  }
  SECTION("apply_layer_norm() runs a module's parameters, or the module itself without an affine part") {
    at::manual_seed(33);
    torch::nn::LayerNorm affine(torch::nn::LayerNormOptions({12}));
    const auto x = at::randn({5, 12});
    CHECK(rel_error(apply_layer_norm(affine, x), affine->forward(x)) < 1e-5);
    torch::nn::LayerNorm plain(torch::nn::LayerNormOptions({12}).elementwise_affine(false));
    CHECK(rel_error(apply_layer_norm(plain, x), plain->forward(x)) == 0);
  }
  SECTION("shapes") {
    CHECK_THROWS_WITH(layer_norm(at::zeros({2, 3}), at::ones({4}), at::zeros({3}), 1e-5),
                      "layer_norm: input [2, 3], weight [4] and bias [3] are not (..., n), (n) and (n)");
  }
}
