// chiar::model::blend_outputs and choose_outputs (a routed layer's dense
// combination of its operators' outputs) against the same values and
// gradients written out per token in float64 loops.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>

#include <vector>

#include "model/route_mix.h"
#include "support/fixtures.h"

using namespace chiar;
using test::rel_error;

namespace {

constexpr int64_t kB = 3, kT = 7, kD = 37, kK = 3;  // d not a multiple of the vector width

struct Case {
  std::vector<at::Tensor> outputs;  // K x (B, T, d), requiring grad
  at::Tensor logits;                // (B, T, K), requiring grad
  at::Tensor choice;                // (B, T) int64
  at::Tensor probe;                 // (B, T, d): the loss is <y, probe>
};

// strided: the outputs are transposed views, not contiguous tensors.
Case make_case(at::ScalarType dtype, uint64_t seed, bool strided = false) {
  at::manual_seed(seed);
  const auto options = at::TensorOptions().dtype(dtype);
  Case c;
  for (int64_t k = 0; k < kK; ++k)
    c.outputs.push_back(strided ? at::randn({kB, kD, kT}, options).requires_grad_(true).transpose(1, 2)
                                : at::randn({kB, kT, kD}, options).requires_grad_(true));
  c.logits = at::randn({kB, kT, kK}, options).requires_grad_(true);
  c.choice = at::randint(kK, {kB, kT}, at::TensorOptions().dtype(at::kLong));
  c.choice[0][0] = 0, c.choice[0][1] = 1, c.choice[0][2] = 2;  // every operator chosen somewhere
  c.probe = at::randn({kB, kT, kD}, options);
  return c;
}

struct Expected {
  at::Tensor y;                  // (B, T, d)
  std::vector<at::Tensor> gout;  // K x (B, T, d)
  at::Tensor gw;                 // (B, T, K)
};

// Per token r, in float64: y_r = out_{c_r, r} (chosen) or sum_k w_{r,k} out_{k,r};
// dL/dout_{k,r} = g_r [c_r = k] or w_{r,k} g_r; dL/dw_{r,k} = <g_r, out_{k,r}>, g = probe.
Expected reference(const Case& c, const at::Tensor& w, bool chosen) {
  const auto g = c.probe.to(at::kDouble).reshape({-1, kD});
  const auto wd = w.detach().to(at::kDouble).reshape({-1, kK});
  const auto choice = c.choice.reshape({-1});
  std::vector<at::Tensor> outs;
  for (const auto& o : c.outputs) outs.push_back(o.detach().to(at::kDouble).reshape({-1, kD}));
  const int64_t rows = g.size(0);
  Expected e{at::zeros({rows, kD}, g.options()), {}, at::zeros({rows, kK}, g.options())};
  for (int64_t k = 0; k < kK; ++k) e.gout.push_back(at::zeros({rows, kD}, g.options()));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pick = choice[r].item<int64_t>();
    for (int64_t k = 0; k < kK; ++k) {
      const double wk = wd[r][k].item<double>();
      if (chosen) {
        if (k == pick) {
          e.y[r].copy_(outs[static_cast<size_t>(k)][r]);
          e.gout[static_cast<size_t>(k)][r].copy_(g[r]);
        }
      } else {
        e.y[r] += wk * outs[static_cast<size_t>(k)][r];
        e.gout[static_cast<size_t>(k)][r].copy_(wk * g[r]);
      }
      e.gw[r][k] = (g[r] * outs[static_cast<size_t>(k)][r]).sum();
    }
  }
  return e;
}

void check(const Case& c, const at::Tensor& w, const at::Tensor& y, bool chosen, double tol) {
  const auto e = reference(c, w, chosen);
  CHECK(rel_error(y.reshape({-1, kD}), e.y) < tol);
  std::vector<at::Tensor> inputs(c.outputs.begin(), c.outputs.end());
  inputs.push_back(w);
  const auto grads = torch::autograd::grad({(y * c.probe).sum()}, inputs);
  for (int64_t k = 0; k < kK; ++k) {
    INFO("output " << k);
    CHECK(rel_error(grads[static_cast<size_t>(k)].reshape({-1, kD}), e.gout[static_cast<size_t>(k)]) < tol);
  }
  CHECK(rel_error(grads.back().reshape({-1, kK}), e.gw) < tol);
}

}  // namespace

TEST_CASE("blend_outputs: the weighted sum and its gradients, per token", "[route_mix]") {
  for (const auto& [dtype, tol] : {std::pair<at::ScalarType, double>{at::kDouble, 1e-14}, {at::kFloat, 1e-6}}) {
    INFO(dtype);
    const auto c = make_case(dtype, 1);
    const auto w = c.logits.softmax(-1);
    check(c, w, model::blend_outputs(c.outputs, w), /*chosen=*/false, tol);
  }
}

TEST_CASE("blend_outputs and choose_outputs take strided outputs", "[route_mix]") {
  const auto c = make_case(at::kDouble, 5, /*strided=*/true);
  REQUIRE_FALSE(c.outputs[0].is_contiguous());
  const auto w = c.logits.softmax(-1);
  check(c, w, model::blend_outputs(c.outputs, w), /*chosen=*/false, 1e-14);
  check(c, w, model::choose_outputs(c.outputs, c.choice, w), /*chosen=*/true, 1e-14);
}

TEST_CASE("choose_outputs: exactly the chosen output; straight-through gradients", "[route_mix]") {
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    INFO(dtype);
    const auto c = make_case(dtype, 2);
    const auto w = c.logits.softmax(-1);
    const auto y = model::choose_outputs(c.outputs, c.choice, w);
    // Bit for bit: the value is a copy, not 1.0 * y.
    const auto stacked = at::stack(c.outputs, -1).detach();
    CHECK(at::equal(y.detach(),
                    stacked.gather(-1, c.choice.unsqueeze(-1).unsqueeze(-1).expand({kB, kT, kD, 1})).squeeze(-1)));
    check(c, w, y, /*chosen=*/true, dtype == at::kDouble ? 1e-14 : 1e-6);
  }
  // Without weights (hard routing): gradients reach the chosen outputs only.
  const auto c = make_case(at::kDouble, 3);
  const auto y = model::choose_outputs(c.outputs, c.choice, at::Tensor());
  const auto grads = torch::autograd::grad({(y * c.probe).sum()}, c.outputs);
  const auto e = reference(c, c.logits.softmax(-1), true);
  for (int64_t k = 0; k < kK; ++k)
    CHECK(rel_error(grads[static_cast<size_t>(k)].reshape({-1, kD}), e.gout[static_cast<size_t>(k)]) < 1e-15);
}

TEST_CASE("route mixing: second derivatives match the tensor-op formulation", "[route_mix]") {
  // A gradient penalty differentiates the mix's backward: it must stay a graph.
  for (bool chosen : {false, true}) {
    INFO("chosen " << chosen);
    const auto c = make_case(at::kDouble, 4);
    const auto penalty = [&](bool fused) {
      const auto w = c.logits.softmax(-1);
      at::Tensor y;
      if (fused) {
        y = chosen ? model::choose_outputs(c.outputs, c.choice, w) : model::blend_outputs(c.outputs, w);
      } else if (chosen) {
        const auto stacked = at::stack(c.outputs, -1);
        y = stacked.gather(-1, c.choice.unsqueeze(-1).unsqueeze(-1).expand({kB, kT, kD, 1})).squeeze(-1) +
            (stacked * (w - w.detach()).unsqueeze(2)).sum(-1);
      } else {
        y = c.outputs[0] * w.select(-1, 0).unsqueeze(-1);
        for (int64_t k = 1; k < kK; ++k) y = y + c.outputs[static_cast<size_t>(k)] * w.select(-1, k).unsqueeze(-1);
      }
      std::vector<at::Tensor> inputs(c.outputs.begin(), c.outputs.end());
      inputs.push_back(c.logits);
      const auto first = torch::autograd::grad({(y * c.probe).sum()}, inputs, {}, true, true);
      at::Tensor norm = at::zeros({}, c.logits.options());
      for (const auto& g : first) norm = norm + g.pow(2).sum();
      return torch::autograd::grad({norm}, inputs, {}, false, false, /*allow_unused=*/true);
    };
    const auto want = penalty(false), got = penalty(true);
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("input " << i);
      REQUIRE(want[i].defined() == got[i].defined());
      if (want[i].defined()) CHECK(rel_error(got[i], want[i]) < 1e-13);
    }
  }
}
