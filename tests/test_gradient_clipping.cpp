// The trainer's gradient clipping against libtorch's clip_grad_norm_, whose
// arithmetic it keeps bit for bit, and against the definition in float64.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/training/gradient_clipping.h"
#include "support/fixtures.h"

using chiar::engine::clip_gradient_norm;
using chiar::test::rel_error;

namespace {

// Parameters of the given shapes with seeded gradients of scale `scale`, and
// one more parameter without a gradient (it must be left alone).
std::vector<at::Tensor> make_params(const std::vector<std::vector<int64_t>>& shapes, double scale,
                                    at::ScalarType dtype = at::kFloat) {
  at::manual_seed(21);
  std::vector<at::Tensor> params;
  for (const auto& shape : shapes) {
    auto p = at::randn(shape, at::TensorOptions().dtype(dtype)).requires_grad_(true);
    p.mutable_grad() = at::randn(shape, at::TensorOptions().dtype(dtype)) * scale;
    params.push_back(p);
  }
  params.push_back(at::randn({5}, at::TensorOptions().dtype(dtype)).requires_grad_(true));
  return params;
}

// A copy with copies of the gradients.
std::vector<at::Tensor> copy_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> copy;
  for (const auto& p : params) {
    auto c = p.detach().clone().requires_grad_(true);
    if (p.grad().defined()) c.mutable_grad() = p.grad().clone();
    copy.push_back(c);
  }
  return copy;
}

// Whether every gradient has the same bits (NaN included) in both sets.
bool same_gradients(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].grad().defined() != b[i].grad().defined()) return false;
    if (!a[i].grad().defined()) continue;
    const auto bits = a[i].scalar_type() == at::kDouble ? at::kLong : at::kInt;
    if (!at::equal(a[i].grad().view(bits), b[i].grad().view(bits))) return false;
  }
  return true;
}

const std::vector<std::vector<int64_t>> kShapes = {{37}, {300, 100}, {64}};

}  // namespace

TEST_CASE("gradient clipping equals libtorch's clip_grad_norm_ bit for bit", "[clip]") {
  const auto dtype = GENERATE(at::kFloat, at::kDouble);
  // 10: the norm is ~1,750 and every gradient is scaled; 1e-4: the norm is
  // below the limit and the gradients must come back unchanged.
  const double scale = GENERATE(10.0, 1e-4);
  CAPTURE(dtype, scale);
  auto ours = make_params(kShapes, scale, dtype);
  auto theirs = copy_of(ours);
  const auto before = copy_of(ours);
  const auto norm = clip_gradient_norm(ours, 1.0);
  const double expected = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
  CHECK(norm.dim() == 0);
  CHECK(norm.item<double>() == expected);
  CHECK(same_gradients(ours, theirs));
  CHECK(!ours.back().grad().defined());
  if (scale < 1) CHECK(same_gradients(ours, before));
}

TEST_CASE("gradient clipping of one parameter takes its norm as the whole norm, as libtorch does", "[clip]") {
  auto ours = make_params({{300, 100}}, 10.0);
  auto theirs = copy_of(ours);
  const auto norm = clip_gradient_norm(ours, 0.5);
  CHECK(norm.item<double>() == torch::nn::utils::clip_grad_norm_(theirs, 0.5));
  CHECK(same_gradients(ours, theirs));
}

TEST_CASE("gradient clipping matches its definition in float64", "[clip]") {
  auto params = make_params(kShapes, 10.0);
  double sum = 0;
  std::vector<at::Tensor> wide;  // the gradients before, in float64
  for (size_t i = 0; i < kShapes.size(); ++i) {
    wide.push_back(params[i].grad().to(at::kDouble));
    sum += wide.back().pow(2).sum().item<double>();
  }
  const double total = std::sqrt(sum), max_norm = 2.0;
  const auto norm = clip_gradient_norm(params, max_norm);
  CHECK(std::abs(norm.item<double>() - total) <= 1e-6 * total);
  const double coef = max_norm / (total + 1e-6);
  REQUIRE(coef < 1);
  double clipped = 0;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    CHECK(rel_error(params[i].grad(), wide[i] * coef) < 1e-6);
    clipped += params[i].grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  CHECK(std::abs(std::sqrt(clipped) - max_norm) < 1e-5);
}

TEST_CASE("gradient clipping with a NaN gradient makes every gradient NaN, as libtorch does", "[clip]") {
  auto ours = make_params(kShapes, 1.0);
  ours[1].grad()[7][3] = std::numeric_limits<float>::quiet_NaN();
  auto theirs = copy_of(ours);
  CHECK(std::isnan(clip_gradient_norm(ours, 1.0).item<double>()));
  (void)torch::nn::utils::clip_grad_norm_(theirs, 1.0);
  CHECK(same_gradients(ours, theirs));
  for (size_t i = 0; i < kShapes.size(); ++i) CHECK(ours[i].grad().isnan().all().item<bool>());
}

TEST_CASE("gradient clipping without gradients changes nothing and gives norm 0", "[clip]") {
  std::vector<at::Tensor> params{at::ones({3}).requires_grad_(true)};
  const auto norm = clip_gradient_norm(params, 1.0);
  CHECK(norm.item<double>() == 0.0);
  CHECK(!params[0].grad().defined());
}

TEST_CASE("cuda: gradient clipping on a GPU agrees with libtorch's and leaves unclipped gradients exact", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const auto on_gpu = [](const std::vector<at::Tensor>& params) {
    std::vector<at::Tensor> moved;
    for (const auto& p : params) {
      auto m = p.detach().to(at::kCUDA).requires_grad_(true);
      if (p.grad().defined()) m.mutable_grad() = p.grad().to(at::kCUDA);
      moved.push_back(m);
    }
    return moved;
  };
  for (const double scale : {10.0, 1e-4}) {
    CAPTURE(scale);
    const auto host = make_params(kShapes, scale);
    auto ours = on_gpu(host), theirs = on_gpu(host);
    const auto before = copy_of(ours);
    const auto norm = clip_gradient_norm(ours, 1.0);
    CHECK(norm.is_cuda());
    // libtorch's multi-tensor norm sums in another order than its
    // per-parameter one: equal to fp32's rounding, not bit for bit.
    const double expected = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
    CHECK(std::abs(norm.item<double>() - expected) <= 1e-6 * expected);
    for (size_t i = 0; i < kShapes.size(); ++i) CHECK(rel_error(ours[i].grad().cpu(), theirs[i].grad().cpu()) < 1e-6);
    if (scale < 1) CHECK(same_gradients(ours, before));
  }
}
