#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <stdexcept>

#include "core/autocast_compat.h"
#include "model/mixing_layer.h"
#include "chiar/gate.h"
#include "chiar/kernels.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"
#include "support/fixtures.h"
#include "support/reference.h"

using namespace chiar;
using test::rel_error;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

std::shared_ptr<Router> make_router(const std::string& name, std::vector<std::string> ops, int64_t d,
                                    const Params& params = {}, bool float64 = true) {
  RouterSpec spec;
  spec.d_model = d;
  spec.operators = std::move(ops);
  spec.params = params;
  auto r = test::plugins().make_router(name, spec);
  if (float64) r->to(at::kDouble);
  return r;
}

std::shared_ptr<model::MixingLayer> make_layer(const std::vector<std::string>& names, const std::string& router,
                                               const Params& router_params, int64_t d, bool float64) {
  std::vector<std::shared_ptr<Operator>> ops;
  for (const auto& n : names)
    ops.push_back(test::make_op(
        n, d, 2, n == "rbf" ? Params().set("features", int64_t{16}).set("chunk", int64_t{4}) : Params(), float64));
  return std::make_shared<model::MixingLayer>(1, names, ops, make_router(router, names, d, router_params, float64));
}

// Thresholds that send the given shares of x's tokens to each operator.
std::vector<double> taus_for(const at::Tensor& x, const std::vector<double>& shares) {
  auto h = spectral_entropy(x.to(at::kDouble)).reshape({-1});
  std::vector<double> tau;
  double cumulative = 0;
  for (size_t k = 0; k + 1 < shares.size(); ++k) {
    cumulative += shares[k];
    if (cumulative <= 0)
      tau.push_back(-1.0);
    else if (cumulative >= 1)
      tau.push_back(2.0);
    else
      tau.push_back(at::quantile(h, cumulative).item<double>());
  }
  return tau;
}

}  // namespace

TEST_CASE("sparse routed execution equals dense at every routing share", "[routing][sparse]") {
  at::manual_seed(21);
  const std::vector<std::vector<double>> two = {{1, 0}, {0.75, 0.25}, {0.5, 0.5}, {0, 1}};
  const std::vector<std::vector<double>> three = {{1, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0.5, 0.25, 0.25}, {0.2, 0.3, 0.5}};
  for (bool float64 : {false, true}) {
    for (bool causal : {true, false}) {
      for (const auto& [names, share_list] :
           std::vector<std::pair<std::vector<std::string>, std::vector<std::vector<double>>>>{
               {{"dct", "attention"}, two}, {{"dct", "rbf", "attention"}, three}}) {
        auto x = at::randn({3, 13, 16}, float64 ? kF64 : at::TensorOptions());
        OpContext ctx;
        ctx.causal = causal;
        if (!causal) ctx.valid = test::padding_mask(13, {0, 5, 2});
        for (const auto& shares : share_list) {
          INFO("ops " << names.size() << ", float64 " << float64 << ", causal " << causal << ", shares[0] " << shares[0]
                      << ", shares[last] " << shares.back());
          auto layer = make_layer(names, "threshold", Params().set("tau", taus_for(x, shares)), 16, float64);
          layer->set_execution(model::Execution::Dense);
          model::LayerRouting dense_routing;
          auto dense = layer->forward(x, ctx, &dense_routing);
          layer->set_execution(model::Execution::Sparse);
          model::LayerRouting sparse_routing;
          auto sparse = layer->forward(x, ctx, &sparse_routing);
          CHECK_FALSE(dense_routing.sparse);
          CHECK(sparse_routing.sparse);
          CHECK(at::equal(dense_routing.choice, sparse_routing.choice));
          CHECK(rel_error(sparse, dense) < (float64 ? 1e-12 : 1e-5));
          {  // Without autograd: the same placing, no graph.
            at::NoGradGuard no_grad;
            CHECK(rel_error(layer->forward(x, ctx), dense) < (float64 ? 1e-12 : 1e-5));
          }
          if (float64) {  // x's gradient: the rows' gathers and placing against dense execution
            const auto probe = at::randn(x.sizes(), kF64);
            const auto grad_of = [&](model::Execution e) {
              layer->set_execution(e);
              auto input = x.clone().requires_grad_(true);
              return torch::autograd::grad({(layer->forward(input, ctx) * probe).sum()}, {input})[0];
            };
            CHECK(rel_error(grad_of(model::Execution::Sparse), grad_of(model::Execution::Dense)) < 1e-12);
          }
          // The realised attention share matches the target.
          const double attn_share =
              (sparse_routing.choice == static_cast<int64_t>(names.size() - 1)).to(at::kDouble).mean().item<double>();
          CHECK(attn_share == Approx(shares.back()).margin(1.0 / 39 + 1e-9));
        }
      }
    }
  }
}

TEST_CASE("a routed layer's entropy under bf16 autocast is its fp32 entropy, bit for bit", "[routing][bf16]") {
  // The spectrum the router reads is computed in fp32 whatever the autocast,
  // so the same x has the same entropies, and under the threshold router
  // (which reads nothing else) routes the same tokens, in both precisions,
  // while the operators' own products do run in bf16 (their output differs).
  at::manual_seed(31);
  const int64_t d = 64;
  const auto x = at::randn({2, 24, d}) + at::sin(at::arange(d) * 0.3);  // (B, T, d)
  OpContext ctx;
  ctx.causal = true;
  for (const auto& names :
       {std::vector<std::string>{"dct", "attention"}, std::vector<std::string>{"attention", "dct"}}) {
    INFO("operators " << names[0] << ", " << names[1]);
    auto layer = make_layer(names, "threshold", Params().set("tau", taus_for(x, {0.5, 0.5})), d, false);
    model::LayerRouting fp32, bf16;
    const auto out32 = layer->forward(x, ctx, &fp32);
    at::Tensor out16;
    {
      const autocast::Bf16Scope cast(true, x.device());
      out16 = layer->forward(x, ctx, &bf16);
      CHECK(autocast::enabled_dtype(at::kCPU) == at::kBFloat16);  // the layer left autocast on
    }
    CHECK(at::equal(bf16.entropy, fp32.entropy));
    CHECK(at::equal(bf16.choice, fp32.choice));
    CHECK(rel_error(fp32.entropy, spectral_entropy(x.to(at::kDouble))) < 1e-6);
    CHECK_FALSE(at::equal(out16, out32));
    CHECK(rel_error(out16, out32) < 2e-2);
  }
  // A gated router's gate reads x too and runs in bf16 under autocast, so
  // only the entropy it is given is held equal.
  auto gated = make_layer({"dct", "attention"}, "soft", Params(), d, false);
  model::LayerRouting fp32, bf16;
  gated->forward(x, ctx, &fp32);
  {
    const autocast::Bf16Scope cast(true, x.device());
    gated->forward(x, ctx, &bf16);
  }
  CHECK(at::equal(bf16.entropy, fp32.entropy));
}

TEST_CASE("Fp32Scope turns autocast off for its scope and back as it was, even when left by a throw", "[bf16]") {
  REQUIRE(autocast::enabled_dtype(at::kCPU) == at::ScalarType::Undefined);
  {
    const autocast::Fp32Scope fp32(at::Device(at::kCPU));  // nothing to turn off
    CHECK(autocast::enabled_dtype(at::kCPU) == at::ScalarType::Undefined);
  }
  CHECK(autocast::enabled_dtype(at::kCPU) == at::ScalarType::Undefined);
  const autocast::Bf16Scope cast(true, at::Device(at::kCPU));
  try {
    const autocast::Fp32Scope fp32(at::Device(at::kCPU));
    CHECK(autocast::enabled_dtype(at::kCPU) == at::ScalarType::Undefined);
    throw std::runtime_error("leaving");
  } catch (const std::runtime_error&) {
  }
  CHECK(autocast::enabled_dtype(at::kCPU) == at::kBFloat16);
}

// Hidden (chiar_tests "[cuda]" on a GPU): the routed layer on a CUDA
// device, sparse against dense at the shares above, its output and the
// input's gradient. Sparse execution there takes its row lists from the
// harness's CUDA kernels where the build has them.
TEST_CASE("sparse routed execution equals dense on a CUDA device, forward and backward", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  at::manual_seed(24);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const std::vector<std::vector<double>> two = {{1, 0}, {0.75, 0.25}, {0, 1}};
  const std::vector<std::vector<double>> three = {{0, 0, 1}, {0.5, 0.25, 0.25}, {0.2, 0.3, 0.5}};
  for (bool causal : {true, false})
    for (const auto& [names, share_list] :
         std::vector<std::pair<std::vector<std::string>, std::vector<std::vector<double>>>>{
             {{"dct", "attention"}, two}, {{"dct", "rbf", "attention"}, three}}) {
      const auto x = at::randn({3, 13, 16});
      const auto probe = at::randn({3, 13, 16}).to(cuda);
      OpContext ctx;
      ctx.causal = causal;
      if (!causal) ctx.valid = test::padding_mask(13, {0, 5, 2}).to(cuda);
      for (const auto& shares : share_list) {
        INFO("ops " << names.size() << ", causal " << causal << ", shares[last] " << shares.back());
        auto layer = make_layer(names, "threshold", Params().set("tau", taus_for(x, shares)), 16, false);
        layer->to(at::kCUDA);
        model::LayerRouting routing[2];
        at::Tensor out[2], grad[2];
        for (int sparse : {0, 1}) {
          layer->set_execution(sparse ? model::Execution::Sparse : model::Execution::Dense);
          auto input = x.to(cuda).requires_grad_(true);
          out[sparse] = layer->forward(input, ctx, &routing[sparse]);
          (out[sparse] * probe).sum().backward();
          grad[sparse] = input.grad();
        }
        CHECK(routing[1].sparse);
        CHECK(at::equal(routing[0].choice.cpu(), routing[1].choice.cpu()));
        CHECK(rel_error(out[1].cpu(), out[0].cpu()) < 1e-5);
        CHECK(rel_error(grad[1].cpu(), grad[0].cpu()) < 1e-4);
      }
    }
}

// Hidden (as above). The threshold router on a GPU, fed H by the harness's
// CUDA kernel, decides every token as on the CPU, except where H lies within
// the kernels' rounding (2e-5) of a threshold: those ties are named, not
// compared. With and without a gradient on the input (training, inference).
TEST_CASE("threshold routing on a CUDA device decides as on the CPU, ties within rounding of a threshold aside",
          "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  at::manual_seed(25);
  for (const auto& names : std::vector<std::vector<std::string>>{{"dct", "attention"}, {"dct", "rbf", "attention"}}) {
    const auto x = at::randn({4, 64, 16});  // (B, T, d)
    const std::vector<double> shares =
        names.size() == 2 ? std::vector<double>{0.5, 0.5} : std::vector<double>{0.3, 0.3, 0.4};
    const auto tau = taus_for(x, shares);
    auto layer = make_layer(names, "threshold", Params().set("tau", tau), 16, false);
    for (const bool grad : {true, false}) {
      INFO("ops " << names.size() << ", gradient " << grad);
      model::LayerRouting cpu, gpu;
      {
        at::AutoGradMode mode(grad);
        layer->to(at::kCPU);
        layer->forward(x.clone().requires_grad_(grad), OpContext{}, &cpu);
        layer->to(at::kCUDA);
        layer->forward(x.to(at::kCUDA).requires_grad_(grad), OpContext{}, &gpu);
      }
      const auto h = cpu.entropy.to(at::kDouble);  // (B, T)
      CHECK((gpu.entropy.cpu().to(at::kDouble) - h).abs().max().item<double>() < 1e-5);
      auto clear = at::ones_like(h, at::kBool);  // (B, T)
      for (const double t : tau) clear.logical_and_((h - t).abs() > 2e-5);
      INFO(clear.logical_not().sum().item<int64_t>() << " tokens within 2e-5 of a threshold");
      CHECK(clear.sum().item<int64_t>() >= h.numel() - static_cast<int64_t>(tau.size()) * 2);
      CHECK(at::equal(gpu.choice.cpu().masked_select(clear), cpu.choice.masked_select(clear)));
    }
  }
}

// A router that sends every token to operator `pick`, in range or not.
class FixedRouter final : public Router {
 public:
  explicit FixedRouter(int64_t pick) : pick_(pick) {}
  RouteResult route(const at::Tensor& x, const at::Tensor&, const OpContext&) override {
    RouteResult r;
    r.choice = at::full({x.size(0), x.size(1)}, pick_, at::TensorOptions().dtype(at::kLong));
    r.weights = at::zeros({x.size(0), x.size(1), 2}, x.options());
    return r;
  }
  std::string describe() const override { return "fixed"; }

 private:
  int64_t pick_;
};

TEST_CASE("sparse execution: one operator for every token, and a choice out of range (dense too)",
          "[routing][sparse]") {
  at::manual_seed(40);
  const std::vector<std::string> names{"dct", "attention"};
  auto x = at::randn({2, 7, 16});
  OpContext ctx;
  ctx.causal = true;
  at::NoGradGuard no_grad;
  for (int64_t pick : {0, 1}) {
    INFO("every token to " << names[static_cast<size_t>(pick)]);
    std::vector<std::shared_ptr<Operator>> ops{test::make_op("dct", 16, 2, {}, false),
                                               test::make_op("attention", 16, 2, {}, false)};
    model::MixingLayer layer(0, names, ops, std::make_shared<FixedRouter>(pick));
    layer.set_execution(model::Execution::Sparse);
    CHECK(rel_error(layer.forward(x, ctx), ops[static_cast<size_t>(pick)]->forward(x, ctx)) < 1e-6);
  }
  std::vector<std::shared_ptr<Operator>> ops{test::make_op("dct", 16, 2, {}, false),
                                             test::make_op("attention", 16, 2, {}, false)};
  model::MixingLayer bad(0, names, ops, std::make_shared<FixedRouter>(2));
  bad.set_execution(model::Execution::Sparse);
  CHECK_THROWS_WITH(bad.forward(x, ctx), "layer 1: the router chose an operator outside 0..1 for 14 of 14 tokens");
  bad.set_execution(model::Execution::Dense);
  CHECK_THROWS_WITH(bad.forward(x, ctx), "layer 1: the router chose an operator outside 0..1 for 14 of 14 tokens");
}

TEST_CASE("sparse execution trains the operators it ran (threshold routing)", "[routing][sparse][grad]") {
  at::manual_seed(22);
  auto x = at::randn({2, 7, 8}, kF64).requires_grad_(true);
  auto probe = at::randn({2, 7, 8}, kF64);
  auto layer = make_layer({"dct", "attention"}, "threshold", Params().set("tau", taus_for(x, {0.5, 0.5})), 8, true);
  layer->train();
  layer->set_execution(model::Execution::Sparse);
  std::vector<at::Tensor> inputs{x};
  for (auto& p : layer->parameters()) inputs.push_back(p);
  OpContext ctx;
  ctx.causal = true;
  CHECK(test::gradcheck([&] { return (layer->forward(x, ctx) * probe).sum(); }, inputs) < 1e-6);
}

TEST_CASE("threshold routing: H > tau goes to attention; three operators by two taus", "[routing][threshold]") {
  auto x = at::randn({4, 20, 16});
  auto h = spectral_entropy(x);
  const double tau = h.median().item<double>();
  auto two = make_router("threshold", {"dct", "attention"}, 16, Params().set("tau", tau), false);
  auto r = two->route(x, h, {});
  CHECK(r.mode == RouteMode::Hard);
  CHECK(at::equal(r.choice, (h.to(at::kDouble) > tau).to(at::kLong)));
  CHECK(at::equal(r.weights, at::one_hot(r.choice, 2).to(at::kFloat)));

  const std::vector<double> taus{h.quantile(0.3).item<double>(), h.quantile(0.6).item<double>()};
  auto three = make_router("threshold", {"dct", "rbf", "attention"}, 16, Params().set("tau", taus), false);
  auto c = three->route(x, h, {}).choice;
  auto hd = h.to(at::kDouble);
  CHECK(at::equal(c.eq(0), hd <= taus[0]));
  CHECK(at::equal(c.eq(1), (hd > taus[0]).logical_and(hd <= taus[1])));
  CHECK(at::equal(c.eq(2), hd > taus[1]));
}

TEST_CASE("threshold calibration reaches the configured shares", "[routing][threshold]") {
  auto x = at::randn({8, 64, 16});
  auto h = spectral_entropy(x);
  auto router = make_router("threshold", {"dct", "rbf", "attention"}, 16,
                            Params().set("shares", std::vector<double>{0.5, 0.2, 0.3}), false);
  CHECK(router->describe() == "threshold(tau [0.5, 0.7], uncalibrated)");
  router->calibrate(h);
  auto c = router->route(x, h, {}).choice;
  CHECK(c.eq(0).to(at::kDouble).mean().item<double>() == Approx(0.5).margin(0.01));
  CHECK(c.eq(1).to(at::kDouble).mean().item<double>() == Approx(0.2).margin(0.01));
  CHECK(c.eq(2).to(at::kDouble).mean().item<double>() == Approx(0.3).margin(0.01));
  CHECK(router->thresholds().size() == 2);
  // Fixed thresholds ignore calibration.
  auto fixed = make_router("threshold", {"dct", "attention"}, 16, Params().set("tau", 0.25), false);
  fixed->calibrate(h);
  CHECK(fixed->thresholds() == std::vector<double>{0.25});
}

TEST_CASE("threshold router rejects inconsistent options", "[routing][threshold][errors]") {
  CHECK_THROWS_WITH(make_router("threshold", {"dct", "rbf", "attention"}, 8, Params().set("tau", 0.5)),
                    Catch::Matchers::EndsWith("threshold: 3 operators need 2 thresholds, found 1"));
  CHECK_THROWS_WITH(make_router("threshold", {"dct", "attention"}, 8,
                                Params().set("tau", 0.5).set("shares", std::vector<double>{0.5, 0.5})),
                    Catch::Matchers::EndsWith("threshold: give either tau or shares, not both"));
  CHECK_THROWS_WITH(
      make_router("threshold", {"dct", "rbf", "attention"}, 8, Params().set("tau", std::vector<double>{0.7, 0.2})),
      Catch::Matchers::EndsWith("threshold: tau must be increasing"));
}

TEST_CASE("STE: forward is exactly the chosen output, the gate gets the softmax gradient", "[routing][ste]") {
  at::manual_seed(23);
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"dct", "attention"}, std::vector<std::string>{"dct", "rbf", "attention"}}) {
    INFO("operators " << names.size());
    auto layer = make_layer(names, "hard_ste", {}, 8, true);
    // Spread the gate so every operator is chosen somewhere.
    {
      at::NoGradGuard g;
      for (auto& p : layer->router()->parameters()) p.normal_().mul_(3);
    }
    layer->train();
    OpContext ctx;
    ctx.causal = true;
    auto x = at::randn({3, 9, 8}, kF64);
    model::LayerRouting routing;
    auto y = layer->forward(x, ctx, &routing);
    CHECK_FALSE(routing.sparse);  // the gate is training: dense

    std::vector<at::Tensor> outputs;
    for (const auto& op : layer->operators()) outputs.push_back(op->forward(x, ctx));
    auto stacked = at::stack(outputs, -1);
    auto chosen = stacked.gather(-1, routing.choice.unsqueeze(-1).unsqueeze(-1).expand({3, 9, 8, 1})).squeeze(-1);
    CHECK(at::equal(y, chosen));  // bit-for-bit, not approximately
    for (int64_t k = 0; k < static_cast<int64_t>(names.size()); ++k) CHECK(routing.choice.eq(k).any().item<bool>());

    auto probe = at::randn({3, 9, 8}, kF64);
    const auto gate = layer->router()->parameters();
    auto ste_grads = torch::autograd::grad({(y * probe).sum()}, gate);
    auto r = layer->router()->route(x, spectral_entropy(x), ctx);
    at::Tensor blend = at::zeros_like(x);
    for (size_t k = 0; k < outputs.size(); ++k)
      blend = blend + r.weights.select(-1, static_cast<int64_t>(k)).unsqueeze(-1) * outputs[k];
    auto soft_grads = torch::autograd::grad({(blend * probe).sum()}, gate);
    for (size_t i = 0; i < gate.size(); ++i) CHECK(rel_error(ste_grads[i], soft_grads[i]) < 1e-12);

    // At evaluation (no gate gradient) the same router executes sparsely.
    layer->eval();
    at::NoGradGuard no_grad;
    model::LayerRouting eval_routing;
    auto y_eval = layer->forward(x, ctx, &eval_routing);
    CHECK(eval_routing.sparse);
    CHECK(rel_error(y_eval, chosen) < 1e-12);
  }
}

TEST_CASE("soft routing blends every operator by softmax(Linear([x, H]))", "[routing][soft]") {
  at::manual_seed(24);
  auto layer = make_layer({"dct", "rbf", "attention"}, "soft", {}, 8, true);
  OpContext ctx;
  ctx.causal = true;
  auto x = at::randn({2, 6, 8}, kF64);
  model::LayerRouting routing;
  auto y = layer->forward(x, ctx, &routing);
  CHECK_FALSE(routing.sparse);
  // By hand: H from the float64 reference, logits from the gate's weights,
  // softmax written out, weighted sum of the three outputs.
  auto w = test::named(*layer->router(), "gate.linear.weight");  // (3, 9)
  auto b = test::named(*layer->router(), "gate.linear.bias");    // (3,)
  auto h = test::ref::entropy(x.reshape({-1, 8})).view({2, 6, 1});
  auto logits = at::matmul(at::cat({x, h}, -1), w.t()) + b;  // (2, 6, 3)
  auto e = at::exp(logits - std::get<0>(logits.max(-1, true)));
  auto p = e / e.sum(-1, true);
  auto expected = at::zeros_like(x);
  for (int64_t k = 0; k < 3; ++k) expected += p.select(-1, k).unsqueeze(-1) * layer->operators()[k]->forward(x, ctx);
  CHECK(rel_error(y, expected) < 1e-12);
  CHECK(rel_error(routing.weights, p) < 1e-12);
  layer->set_execution(model::Execution::Sparse);
  CHECK_THROWS_WITH(layer->forward(x, ctx), "layer 2: soft routing blends every operator and cannot execute sparsely");
}

TEST_CASE("collapse regulariser is minus lambda times the entropy of mean usage", "[routing][collapse]") {
  auto uniform = at::full({2, 5, 2}, 0.5, kF64);
  CHECK(collapse_penalty(uniform, 0.1).item<double>() == Approx(-0.1 * std::log(2.0)));
  auto collapsed = at::zeros({2, 5, 3}, kF64);
  collapsed.select(-1, 2).fill_(1.0);
  CHECK(collapse_penalty(collapsed, 0.1).item<double>() == Approx(0.0).margin(1e-9));
  auto router = make_router("hard_ste", {"dct", "attention"}, 8, Params().set("collapse_lambda", 0.2));
  auto x = at::randn({2, 4, 8}, kF64);
  auto r = router->route(x, spectral_entropy(x), {});
  REQUIRE(r.aux_loss.defined());
  CHECK(r.aux_loss.item<double>() == Approx(collapse_penalty(r.weights, 0.2).item<double>()));
  CHECK_FALSE(make_router("soft", {"dct", "attention"}, 8)->route(x, spectral_entropy(x), {}).aux_loss.defined());
}

TEST_CASE("group_rows: runs of equal keys, each row's group and place in it", "[routing][rows]") {
  const auto ids = [](const at::Tensor& t) {
    const auto c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  const RowGroups g = group_rows(at::tensor(std::vector<int64_t>{3, 3, 5, 7, 7, 7, 9}));
  CHECK(g.count == 4);
  CHECK(g.width == 3);
  CHECK(ids(g.keys) == std::vector<int64_t>{3, 5, 7, 9});
  CHECK(ids(g.group) == std::vector<int64_t>{0, 0, 1, 2, 2, 2, 3});
  CHECK(ids(g.slot) == std::vector<int64_t>{0, 1, 0, 0, 1, 2, 0});
  const RowGroups none = group_rows(at::empty({0}, at::TensorOptions().dtype(at::kLong)));
  CHECK(none.count == 0);
  CHECK(none.width == 0);
  CHECK(none.keys.numel() == 0);
  CHECK(none.group.numel() == 0);
  // pack/unpack round trip on the groups.
  const auto values = at::arange(7 * 2, at::TensorOptions().dtype(at::kFloat)).view({7, 2});
  const auto packed = pack_rows(values, g);  // (4, 3, 2)
  CHECK(packed.sizes() == at::IntArrayRef{4, 3, 2});
  CHECK(at::equal(packed[1][1], at::zeros({2})));  // group 1 has one row: zeros after it
  CHECK(at::equal(unpack_rows(packed, g), values));
}

TEST_CASE("gather_rows equals index_select, forward and backward, rising rows by row copies", "[routing][rows]") {
  at::manual_seed(25);
  const auto rows_of = [](std::vector<int64_t> r) { return at::tensor(r); };
  // x (R, ...) in each dtype, with rising rows (the host kernel), rows that
  // skip the ends, all rows, none, and rows that do not rise (index_select
  // itself: a repeated row's gradient adds up).
  for (const auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    for (const bool strided : {false, true}) {
      const auto base = at::randn({9, 3, 8}).to(dtype);
      const auto x0 = strided ? base.transpose(1, 2) : base;  // (9, 8, 3) strided, or (9, 3, 8)
      for (const auto& [list, rising] :
           std::vector<std::pair<std::vector<int64_t>, bool>>{{{1, 2, 5, 7}, true},
                                                              {{0, 8}, true},
                                                              {{0, 1, 2, 3, 4, 5, 6, 7, 8}, true},
                                                              {{}, true},
                                                              {{5, 1, 7}, false},
                                                              {{2, 2, 6}, false}}) {
        INFO("dtype " << dtype << ", strided " << strided << ", rows " << list.size() << ", rising " << rising);
        const auto rows = rows_of(list);
        const auto x = x0.detach().clone().requires_grad_(true), xr = x0.detach().clone().requires_grad_(true);
        const auto before = host_kernel_count();
        const auto ours = gather_rows(x, rows);
        CHECK(host_kernel_count() - before == (rising ? 1u : 0u));
        const auto theirs = xr.index_select(0, rows);
        CHECK(at::equal(ours, theirs));
        const auto g = at::randn(theirs.sizes()).to(dtype);
        ours.backward(g);
        theirs.backward(g);
        CHECK(at::equal(x.grad(), xr.grad()));
      }
    }
  }
  // Rows over many tasks of 256 (the copies' grain): every third row, and
  // runs across the tasks' edges, so that a task starts inside the list.
  {
    const int threads = at::get_num_threads();
    at::set_num_threads(2);
    std::vector<int64_t> list;
    for (int64_t r = 0; r < 2048; ++r)
      if (r % 3 == 0 || (r >= 250 && r < 270) || (r >= 1020 && r < 1030)) list.push_back(r);
    const auto rows = rows_of(list);
    const auto x = at::randn({2048, 5}).requires_grad_(true), xr = x.detach().clone().requires_grad_(true);
    const auto ours = gather_rows(x, rows), theirs = xr.index_select(0, rows);
    CHECK(at::equal(ours, theirs));
    const auto g = at::randn(theirs.sizes());
    ours.backward(g);
    theirs.backward(g);
    CHECK(at::equal(x.grad(), xr.grad()));
    at::set_num_threads(threads);
  }
  // A gradient of the gradient (create_graph) reaches the incoming gradient.
  const auto x = at::randn({6, 4}, kF64).requires_grad_(true);
  const auto g = at::randn({3, 4}, kF64).requires_grad_(true);
  const auto gx = torch::autograd::grad({gather_rows(x, rows_of({0, 2, 5}))}, {x}, {g}, true, true)[0];
  const auto probe = at::randn({6, 4}, kF64);
  const auto gg = torch::autograd::grad({(gx * probe).sum()}, {g})[0];
  CHECK(at::equal(gg, probe.index_select(0, rows_of({0, 2, 5}))));
  // Rows outside x are index_select's error, as before.
  CHECK_THROWS(gather_rows(x, rows_of({1, 6})));
  // Under the "aten" kernel policy, index_select itself.
  const ScopedKernelPolicy aten(KernelPolicy::Compositions);
  const auto before = host_kernel_count();
  CHECK(at::equal(gather_rows(x, rows_of({1, 3})), x.index_select(0, rows_of({1, 3}))));
  CHECK(host_kernel_count() == before);
}

TEST_CASE("indices_to_device: on the CPU the tensors themselves", "[routing][rows]") {
  const auto a = at::arange(6, at::TensorOptions().dtype(at::kLong)).view({2, 3}), b = at::zeros({0}, a.options());
  const auto same = indices_to_device({a, b}, at::Device(at::kCPU));
  REQUIRE(same.size() == 2);
  CHECK(same[0].is_same(a));
  CHECK(same[1].is_same(b));
}

TEST_CASE("cuda: group_rows of GPU keys equals the host's, on the GPU; indices_to_device keeps shapes and values",
          "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const auto key = at::tensor(std::vector<int64_t>{3, 3, 5, 7, 7, 7, 9});
  const RowGroups host = group_rows(key);
  for (const auto policy : {KernelPolicy::Auto, KernelPolicy::Compositions}) {
    CAPTURE(policy == KernelPolicy::Auto ? "one copy, grouped on the host" : "unique_consecutive");
    ScopedKernelPolicy scope(policy);
    const RowGroups g = group_rows(key.to(at::kCUDA));
    CHECK(g.count == host.count);
    CHECK(g.width == host.width);
    CHECK(g.group.is_cuda());
    CHECK(at::equal(g.keys.cpu(), host.keys));
    CHECK(at::equal(g.group.cpu(), host.group));
    CHECK(at::equal(g.slot.cpu(), host.slot));
  }
  const auto a = at::arange(6, at::TensorOptions().dtype(at::kLong)).view({2, 3}),
             b = at::tensor(std::vector<int64_t>{7});
  const auto moved = indices_to_device({a, b}, at::Device(at::kCUDA));
  REQUIRE(moved.size() == 2);
  CHECK(moved[0].is_cuda());
  CHECK(at::equal(moved[0].cpu(), a));
  CHECK(at::equal(moved[1].cpu(), b));
}
