#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/utils.h>

#include <cmath>

#include "model/model.h"
#include "chiar/error.h"
#include "chiar/spectral.h"
#include "support/fixtures.h"
#include "support/reference.h"

using namespace chiar;
using test::rel_error;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

// Re(sum_s sum_j x[s][j] exp(-2 pi i (t s / L + k j / d))) from the definition.
at::Tensor dft2_real(const at::Tensor& x) {  // (L, d)
  const int64_t L = x.size(0), d = x.size(1);
  auto out = at::zeros_like(x);
  auto a = x.accessor<double, 2>();
  auto o = out.accessor<double, 2>();
  for (int64_t t = 0; t < L; ++t)
    for (int64_t k = 0; k < d; ++k) {
      double re = 0;
      for (int64_t s = 0; s < L; ++s)
        for (int64_t j = 0; j < d; ++j)
          re += a[s][j] * std::cos(2 * M_PI * (static_cast<double>(t * s) / L + static_cast<double>(k * j) / d));
      o[t][k] = re;
    }
  return out;
}

std::shared_ptr<Router> topk(std::vector<std::string> ops, const Params& p = {}) {
  RouterSpec spec;
  spec.d_model = 8;
  spec.operators = std::move(ops);
  spec.params = p;
  return test::plugins().make_router("topk_entropy", spec);
}

}  // namespace

TEST_CASE("fourier equals LN(x + Re(DFT2(x))) per sequence length, padding exact", "[operator][fourier]") {
  auto op = test::make_op("fourier", 6, 2);
  auto x = at::randn({2, 7, 6}, kF64);
  OpContext ctx;
  ctx.valid = test::padding_mask(7, {0, 3});
  auto y = op->forward(x, ctx);
  const auto w = test::named(*op, "norm.weight"), b = test::named(*op, "norm.bias");
  for (int64_t s = 0; s < 2; ++s) {
    const int64_t L = s == 0 ? 7 : 4;
    auto xs = x[s].narrow(0, 0, L).contiguous();
    auto expected = test::ref::layer_norm(xs + dft2_real(xs), w, b);
    CHECK(rel_error(y[s].narrow(0, 0, L), expected) < 1e-12);
  }
  // The same sequence alone gives the same real rows.
  auto alone = op->forward(x[1].narrow(0, 0, 4).unsqueeze(0), {});
  CHECK(rel_error(y[1].narrow(0, 0, 4), alone[0]) < 1e-12);
  auto rows = at::tensor(std::vector<int64_t>{0, 6, 8}, at::TensorOptions().dtype(at::kLong));
  CHECK(rel_error(op->forward_rows(x, rows, ctx), y.reshape({-1, 6}).index_select(0, rows)) < 1e-12);
  CHECK_FALSE(op->traits().causal);
}

TEST_CASE("a non-causal operator is refused for language modelling, accepted for classification", "[model][fourier]") {
  auto options = model::ModelOptions()
                     .vocab_size(30)
                     .d_model(8)
                     .n_heads(2)
                     .layers({"fourier", "fourier|attn"})
                     .router("topk_entropy");
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), options),
                    "layer 1: operator 'fourier' does not support causal language modelling (it reads future tokens)");
  options.head(TaskHead::Classifier).n_classes(3);
  model::ChiarModel model(test::plugins(), options);
  auto tokens = at::randint(30, {2, 9}, at::TensorOptions().dtype(at::kLong));
  CHECK(model.forward(tokens, test::padding_mask(9, {0, 4})).logits.sizes() == at::IntArrayRef({2, 3}));
}

TEST_CASE("topk_entropy: exactly the highest-entropy share of real tokens per sequence", "[router][topk]") {
  auto h = at::rand({3, 20}, kF64);
  auto x = at::randn({3, 20, 8});
  OpContext ctx;
  ctx.valid = test::padding_mask(20, {0, 8, 0});
  auto r = topk({"dct", "attention"})->route(x, h, ctx);
  CHECK(r.mode == RouteMode::Hard);
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t n = ctx.valid[b].sum().item<int64_t>();
    auto real = h[b].narrow(0, 0, n);
    const auto k = static_cast<int64_t>(std::ceil(0.25 * static_cast<double>(n)));
    auto chosen = r.choice[b].narrow(0, 0, n).eq(1);
    CHECK(chosen.sum().item<int64_t>() == k);
    // Every chosen token's entropy is at least every unchosen one's.
    CHECK(real.masked_select(chosen).min().item<double>() >=
          real.masked_select(chosen.logical_not()).max().item<double>());
  }
  auto three =
      topk({"dct", "rbf", "attention"}, Params().set("shares", std::vector<double>{0.5, 0.3, 0.2}))->route(x, h, {});
  CHECK(three.choice[0].eq(2).sum().item<int64_t>() == 4);
  CHECK(three.choice[0].eq(1).sum().item<int64_t>() == 6);
  CHECK_THROWS_WITH(topk({"dct", "attention"}, Params().set("shares", std::vector<double>{0.5, 0.6})),
                    Catch::Matchers::EndsWith("topk_entropy: shares must sum to 1"));
}

TEST_CASE("topk_entropy is causal for language modelling and close to its share", "[router][topk][causal]") {
  auto h = at::rand({4, 200}, kF64);
  auto x = at::randn({4, 200, 8});
  OpContext ctx;
  ctx.causal = true;
  auto router = topk({"dct", "attention"});
  auto r = router->route(x, h, ctx);
  auto changed = h.clone();
  changed.narrow(1, 100, 100).uniform_();
  CHECK(at::equal(router->route(x, changed, ctx).choice.narrow(1, 0, 100), r.choice.narrow(1, 0, 100)));
  CHECK(r.choice.to(at::kDouble).mean().item<double>() == Approx(0.25).margin(0.05));
  // A whole causal model with it stays causal.
  model::ChiarModel model(
      test::plugins(),
      model::ModelOptions().vocab_size(40).d_model(8).n_heads(2).layers({"dct|attn", "attn"}).router("topk_entropy"));
  model.to(at::kDouble);
  model.eval();
  at::NoGradGuard g;
  auto tokens = at::randint(40, {1, 30}, at::TensorOptions().dtype(at::kLong));
  auto later = tokens.clone();
  later.narrow(1, 20, 10).random_(40);
  CHECK(rel_error(model.forward(later).logits.narrow(1, 0, 20), model.forward(tokens).logits.narrow(1, 0, 20)) < 1e-12);
}
