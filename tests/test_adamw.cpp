// FusedAdamW against AdamW written out from its definition in float64, and
// against libtorch's AdamW, whose state and checkpoints it shares.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/serialize.h>

#include <cmath>
#include <memory>
#include <vector>

#include "chiar/adamw.h"
#include "chiar/linear.h"
#include "support/fixtures.h"

using namespace chiar;
using test::rel_error;

namespace {

struct Hyper {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One parameter's trajectory under AdamW with decoupled weight decay, in
// float64: p <- p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),
// m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2.
std::vector<double> reference(std::vector<double> p, const std::vector<std::vector<double>>& grads, const Hyper& h) {
  std::vector<double> m(p.size()), v(p.size());  // zero-initialised
  for (size_t t = 1; t <= grads.size(); ++t) {
    const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[t - 1][i];
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
      p[i] = p[i] * (1 - h.lr * h.weight_decay) - h.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + h.eps);
    }
  }
  return p;
}

std::vector<double> values(const at::Tensor& t) {
  const auto d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

torch::optim::AdamWOptions options_of(const Hyper& h) {
  return torch::optim::AdamWOptions(h.lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(h.weight_decay);
}

// Shapes that cover a vector remainder (37), a multi-chunk parameter
// (300 x 100 = 30,000 elements, split across threads) and a bias.
std::vector<at::Tensor> make_params(at::ScalarType dtype = at::kFloat) {
  at::manual_seed(11);
  return {at::randn({37}, dtype), at::randn({300, 100}, dtype), at::randn({64}, dtype)};
}

// grads[step][param], fixed by the seed and shared by every optimiser.
std::vector<std::vector<at::Tensor>> make_grads(const std::vector<at::Tensor>& params, int steps) {
  at::manual_seed(12);
  std::vector<std::vector<at::Tensor>> out(static_cast<size_t>(steps));
  for (auto& step : out)
    for (const auto& p : params) step.push_back(at::randn(p.sizes(), p.options()) * 0.1);
  return out;
}

template <class Optimizer>
void run_steps(Optimizer& opt, std::vector<at::Tensor>& params, const std::vector<std::vector<at::Tensor>>& grads,
               size_t from = 0, size_t to = SIZE_MAX) {
  for (size_t s = from; s < std::min(to, grads.size()); ++s) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[s][i].clone();
    opt.step();
  }
}

std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Two groups, as `chiar run` makes them: the matrix decayed, the vectors not.
std::vector<torch::optim::OptimizerParamGroup> two_groups(std::vector<at::Tensor>& p, const Hyper& h) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(std::vector<at::Tensor>{p[1]}, std::make_unique<torch::optim::AdamWOptions>(options_of(h)));
  g.emplace_back(std::vector<at::Tensor>{p[0], p[2]},
                 std::make_unique<torch::optim::AdamWOptions>(options_of(h).weight_decay(0.0)));
  return g;
}

// `to` takes `from`'s state through a checkpoint's bytes.
void load_state(torch::optim::Optimizer& to, torch::optim::Optimizer& from) {
  torch::serialize::OutputArchive out;
  from.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  to.load(in);
}

}  // namespace

TEST_CASE("FusedAdamW follows AdamW's definition in float64", "[adamw]") {
  const Hyper h;
  const auto init = make_params();
  const int steps = 6;
  const auto grads = make_grads(init, steps);
  auto params = leaves(init);
  FusedAdamW opt(params, options_of(h));
  run_steps(opt, params, grads);
  REQUIRE(opt.last_step_fused());
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<std::vector<double>> g;
    for (const auto& step : grads) g.push_back(values(step[i]));
    const auto expected = reference(values(init[i]), g, h);
    const auto got = at::tensor(expected, at::TensorOptions().dtype(at::kDouble)).view(params[i].sizes());
    CAPTURE(i);
    CHECK(rel_error(params[i].detach(), got) < 2e-6);
    // The update moved every parameter: a no-op optimiser would fail the check above too,
    // but only by the size of six steps.
    CHECK(rel_error(params[i].detach(), init[i]) > 1e-3);
  }
}

TEST_CASE("FusedAdamW matches libtorch's AdamW and shares its state", "[adamw]") {
  const Hyper h;
  const auto init = make_params();
  const auto grads = make_grads(init, 8);
  auto fused_params = leaves(init), plain_params = leaves(init);
  auto groups = [&](std::vector<at::Tensor>& p) { return two_groups(p, h); };
  FusedAdamW fused(groups(fused_params));
  torch::optim::AdamW plain(groups(plain_params));

  SECTION("same parameters and moments step by step, a parameter without gradient untouched") {
    for (size_t s = 0; s < grads.size(); ++s) {
      for (size_t i = 0; i < init.size(); ++i) {
        // The bias gets no gradient in step 2: both optimisers skip it there.
        const bool skip = i == 2 && s == 2;
        fused_params[i].mutable_grad() = skip ? at::Tensor() : grads[s][i].clone();
        plain_params[i].mutable_grad() = skip ? at::Tensor() : grads[s][i].clone();
      }
      fused.step();
      plain.step();
      REQUIRE(fused.last_step_fused());
      for (size_t i = 0; i < init.size(); ++i) {
        CAPTURE(s, i);
        CHECK(rel_error(fused_params[i].detach(), plain_params[i].detach()) < 1e-6);
      }
    }
    const auto& fs = fused.state();
    const auto& ps = plain.state();
    REQUIRE(fs.size() == ps.size());
    for (const auto& [key, state] : ps) {
      (void)key;
      const auto& p = static_cast<const torch::optim::AdamWParamState&>(*state);
      CHECK((p.step() == 8 || p.step() == 7));  // the bias missed one step
    }
    for (size_t i = 0; i < init.size(); ++i) {
      // Each fused parameter's state holds the same moments as libtorch's.
      double worst = 0;
      for (const auto& [fkey, fstate] : fs) {
        (void)fkey;
        const auto& f = static_cast<const torch::optim::AdamWParamState&>(*fstate);
        if (f.exp_avg().sizes() != init[i].sizes()) continue;
        for (const auto& [pkey, pstate] : ps) {
          (void)pkey;
          const auto& p = static_cast<const torch::optim::AdamWParamState&>(*pstate);
          if (p.exp_avg().sizes() != init[i].sizes() || p.step() != f.step()) continue;
          worst = std::max({worst, rel_error(f.exp_avg(), p.exp_avg()), rel_error(f.exp_avg_sq(), p.exp_avg_sq())});
        }
      }
      CHECK(worst < 1e-6);
    }
  }

  SECTION("a checkpoint of one resumes in the other") {
    run_steps(fused, fused_params, grads, 0, 4);
    run_steps(plain, plain_params, grads, 0, 4);
    // A fresh libtorch AdamW over the fused run's parameters takes its state.
    auto resumed_params = leaves(std::vector<at::Tensor>(fused_params.begin(), fused_params.end()));
    torch::optim::AdamW resumed(groups(resumed_params));
    load_state(resumed, fused);
    run_steps(resumed, resumed_params, grads, 4);
    run_steps(plain, plain_params, grads, 4);
    for (size_t i = 0; i < init.size(); ++i) {
      CAPTURE(i);
      CHECK(rel_error(resumed_params[i].detach(), plain_params[i].detach()) < 1e-6);
    }
  }
}

TEST_CASE("FusedAdamW updates parameters outside its loop by foreach ops, exactly as libtorch's step", "[adamw]") {
  // float64 here; on a GPU, every parameter. Two groups (one decayed), a
  // parameter that misses a gradient (so two step counts in one group), a
  // checkpoint that crosses into libtorch's AdamW.
  const Hyper h;
  const auto init = make_params(at::kDouble);
  const auto grads = make_grads(init, 6);
  auto fused_params = leaves(init), plain_params = leaves(init);
  auto groups = [&](std::vector<at::Tensor>& p) { return two_groups(p, h); };
  FusedAdamW fused(groups(fused_params));
  torch::optim::AdamW plain(groups(plain_params));
  for (size_t s = 0; s < grads.size(); ++s) {
    for (size_t i = 0; i < init.size(); ++i) {
      const bool skip = i == 2 && s == 1;
      fused_params[i].mutable_grad() = skip ? at::Tensor() : grads[s][i].clone();
      plain_params[i].mutable_grad() = skip ? at::Tensor() : grads[s][i].clone();
    }
    fused.step();
    plain.step();
    CHECK_FALSE(fused.last_step_fused());
    REQUIRE(fused.last_step_foreach());
    for (size_t i = 0; i < init.size(); ++i) {
      CAPTURE(s, i);
      CHECK(at::equal(fused_params[i].detach(), plain_params[i].detach()));
    }
  }
  auto resumed_params = leaves(std::vector<at::Tensor>(fused_params.begin(), fused_params.end()));
  torch::optim::AdamW resumed(groups(resumed_params));
  load_state(resumed, fused);
  run_steps(resumed, resumed_params, grads, 3);
  run_steps(plain, plain_params, grads, 3);
  for (size_t i = 0; i < init.size(); ++i) CHECK(at::equal(resumed_params[i].detach(), plain_params[i].detach()));
}

TEST_CASE("FusedAdamW marks the parameters it updates as changed", "[adamw]") {
  // linear() keeps a transposed copy of weights with more inputs than
  // outputs and refreshes it by the weight's version counter: an update
  // that wrote the weight without bumping it left forward on the old copy.
  at::manual_seed(13);
  auto weight = (at::randn({8, 64}) * 0.1).requires_grad_(true);  // (out, in): k > n takes the cached layout
  const auto x = at::randn({512, 64});
  FusedAdamW opt(std::vector<at::Tensor>{weight}, torch::optim::AdamWOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    const auto before = weight._version();
    auto y = chiar::linear(x, weight);  // (512, 8)
    CHECK(rel_error(y.detach(), at::matmul(x, weight.detach().t())) < 1e-5);
    y.square().sum().backward();
    opt.step();
    REQUIRE(opt.last_step_fused());
    CHECK(weight._version() > before);
    opt.zero_grad();
  }
  CHECK(rel_error(chiar::linear(x, weight).detach(), at::matmul(x, weight.detach().t())) < 1e-5);
}

TEST_CASE("FusedAdamW leaves moments that do not fit their parameter to libtorch's step", "[adamw]") {
  // The fused loop writes p.numel() floats through each moment. Moments of
  // another shape (a checkpoint of another model loaded by mistake) must not
  // be written through: libtorch's step runs and refuses them.
  at::manual_seed(17);
  auto weight = at::randn({4, 8}).requires_grad_(true);  // (4, 8)
  FusedAdamW opt(std::vector<at::Tensor>{weight}, torch::optim::AdamWOptions(0.1));
  weight.square().sum().backward();
  opt.step();
  REQUIRE(opt.last_step_fused());
  auto& state = static_cast<torch::optim::AdamWParamState&>(*opt.state().begin()->second);
  const auto kept = state.exp_avg_sq().clone();
  state.exp_avg(at::zeros({2, 8}));  // (2, 8): half the parameter
  CHECK_THROWS(opt.step());
  CHECK_FALSE(opt.last_step_fused());
  CHECK(state.exp_avg().sizes() == at::IntArrayRef{2, 8});
  CHECK(rel_error(state.exp_avg_sq(), kept) == 0);
}

TEST_CASE("FusedAdamW::clear_gradients: backward sets fresh gradients, the same steps as zero_grad's zeros",
          "[adamw]") {
  // Two copies of a small model, y = tanh(x A) B, trained three steps on the
  // same batches, one with zero_grad() and one with clear_gradients(); u
  // takes part in the loss at the first step only.
  const auto make = [] {
    at::manual_seed(21);
    return std::vector<at::Tensor>{(at::randn({16, 32}) * 0.2).requires_grad_(true),
                                   (at::randn({32, 8}) * 0.2).requires_grad_(true),
                                   at::randn({8}).requires_grad_(true)};
  };
  auto zeroed = make(), cleared = make();
  const Hyper h;
  FusedAdamW zeroing(zeroed, options_of(h)), clearing(cleared, options_of(h));
  at::manual_seed(22);
  const auto x = at::randn({64, 16});
  const auto loss_of = [&](const std::vector<at::Tensor>& p, int step) {
    auto y = at::tanh(at::matmul(x, p[0])).matmul(p[1]);
    if (step == 0) y = y + p[2];
    return y.pow(2).mean();
  };
  for (int step = 0; step < 3; ++step) {
    zeroing.zero_grad();
    clearing.clear_gradients();
    for (const auto& p : cleared) CHECK_FALSE(p.grad().defined());
    loss_of(zeroed, step).backward();
    loss_of(cleared, step).backward();
    zeroing.step();
    clearing.step();
    // The parameters the loss reads: the same bits either way.
    CHECK(at::equal(zeroed[0], cleared[0]));
    CHECK(at::equal(zeroed[1], cleared[1]));
  }
  // u had no gradient after the first step: cleared, the step skipped it;
  // zeroed, it went on decaying and following its moments.
  const auto u_after_one = [&] {
    auto once = make();
    FusedAdamW opt(once, options_of(h));
    loss_of(once, 0).backward();
    opt.step();
    return once[2];
  }();
  CHECK(at::equal(cleared[2], u_after_one));
  CHECK_FALSE(at::equal(zeroed[2], u_after_one));
}
