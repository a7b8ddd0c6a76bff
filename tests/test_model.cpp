#include <ATen/ATen.h>
#include <cmath>
#include <catch2/catch.hpp>
#include <torch/utils.h>

#include "model/model.h"
#include "chiar/error.h"
#include "support/fixtures.h"

using namespace chiar;
using test::rel_error;

namespace {

model::ModelOptions small(std::vector<std::string> layers, const std::string& router = "threshold") {
  return model::ModelOptions().vocab_size(50).d_model(16).n_heads(2).layers(std::move(layers)).router(router).seed(3);
}

struct Variant {
  const char* name;
  model::ModelOptions options;
};

std::vector<Variant> variants() {
  return {
      {"baseline", small({"attn", "attn", "attn", "attn"})},
      {"dct_attn threshold", small({"dct", "dct|attn", "dct|attn", "attn"})},
      {"3-op threshold", small({"dct", "dct|rbf|attn", "dct|rbf|attn", "attn"})},
      {"3-op hard_ste", small({"dct", "dct|rbf|attn", "dct|rbf|attn", "attn"}, "hard_ste")},
      {"3-op soft", small({"dct", "dct|rbf|attn", "dct|rbf|attn", "attn"}, "soft")},
      {"meta causal", small({"dct", "dct|attn", "attn"}).meta_router(model::MetaRouterKind::Causal)},
  };
}

at::Tensor tokens(int64_t B, int64_t T, int64_t V = 50) {
  return at::randint(V, {B, T}, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

TEST_CASE("a whole language model is causal, for every variant, train and eval", "[model][causal]") {
  at::manual_seed(31);
  for (auto& v : variants()) {
    model::ChiarModel model(test::plugins(), v.options);
    model.to(at::kDouble);
    for (bool training : {true, false}) {
      INFO(v.name << ", training " << training);
      model.train(training);
      auto x = tokens(2, 12);
      for (int64_t t : {0, 6, 10}) {
        auto changed = x.clone();
        changed.narrow(1, t + 1, 12 - t - 1).random_(50);
        auto a = model.forward(x).logits.narrow(1, 0, t + 1);
        auto b = model.forward(changed).logits.narrow(1, 0, t + 1);
        CHECK(rel_error(b, a) < 1e-12);
      }
    }
  }
}

TEST_CASE("the reference's batch-mean MetaRouter leaks the future; the causal one does not", "[model][meta]") {
  at::manual_seed(32);
  auto options = small({"dct", "dct|attn", "attn"}).meta_router(model::MetaRouterKind::BatchMean);
  model::ChiarModel model(test::plugins(), options);
  model.to(at::kDouble);
  {
    at::NoGradGuard g;
    for (auto& p : model.named_parameters())
      if (p.key().rfind("meta.", 0) == 0) p.value().normal_();  // a gate that reads its input
  }
  auto x = tokens(1, 10);
  auto changed = x.clone();
  changed[0][9] = (x[0][9].item<int64_t>() + 1) % 50;
  auto out = model.forward(x);
  CHECK(out.meta_gate.sizes() == at::IntArrayRef({1, 1, 1}));
  CHECK(rel_error(model.forward(changed).logits.narrow(1, 0, 5), out.logits.narrow(1, 0, 5)) > 1e-9);
  model::ChiarModel fresh(test::plugins(), small({"dct", "attn"}).meta_router(model::MetaRouterKind::Causal));
  CHECK(fresh.forward(x).meta_gate.mean().item<double>() == Approx(0.88).epsilon(1e-6));
}

TEST_CASE("classifier: padding never reaches pooling or attention", "[model][padding]") {
  at::manual_seed(33);
  for (const char* router : {"threshold", "hard_ste"}) {
    INFO(router);
    auto options = small({"dct", "dct|rbf|attn", "attn"}, router).head(TaskHead::Classifier).n_classes(3);
    model::ChiarModel model(test::plugins(), options);
    model.to(at::kDouble);
    model.eval();
    at::NoGradGuard g;
    auto a = tokens(1, 5), b = tokens(1, 9);
    auto alone = model.forward(a).logits;
    auto batch = at::zeros({2, 9}, at::TensorOptions().dtype(at::kLong));
    batch[0].narrow(0, 0, 5).copy_(a[0]);
    batch[0].narrow(0, 5, 4).random_(50);  // garbage under the padding
    batch[1].copy_(b[0]);
    auto valid = test::padding_mask(9, {4, 0});
    auto padded = model.forward(batch, valid).logits;
    CHECK(padded.sizes() == at::IntArrayRef({2, 3}));
    CHECK(rel_error(padded[0], alone[0]) < 1e-12);
    CHECK(rel_error(padded[1], model.forward(b).logits[0]) < 1e-12);
  }
}

TEST_CASE("model sparse execution equals dense at evaluation", "[model][sparse]") {
  at::manual_seed(34);
  for (const char* router : {"threshold", "hard_ste"}) {
    model::ChiarModel model(test::plugins(), small({"dct", "dct|rbf|attn", "dct|attn", "attn"}, router));
    model.eval();
    at::NoGradGuard g;
    auto x = tokens(2, 16);
    auto sparse = model.forward(x);
    REQUIRE(sparse.routing.size() == 2);
    CHECK(sparse.routing[0].sparse);
    model.set_execution(model::Execution::Dense);
    auto dense = model.forward(x);
    CHECK_FALSE(dense.routing[0].sparse);
    CHECK(rel_error(sparse.logits, dense.logits) < 1e-5);
  }
}

TEST_CASE("calibrate_routers reaches the target shares layer by layer", "[model][threshold]") {
  at::manual_seed(35);
  auto options = small({"dct", "dct|attn", "dct|attn", "attn"})
                     .router_params(Params().set("shares", std::vector<double>{0.75, 0.25}))
                     .vocab_size(100000);  // distinct tokens: no ties in H at the quantile
  model::ChiarModel model(test::plugins(), options);
  auto sample = at::randperm(100000, at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 256).view({8, 32});
  model.calibrate_routers(sample);
  model.eval();
  at::NoGradGuard g;
  auto out = model.forward(sample);
  for (const auto& r : out.routing)
    CHECK(r.choice.eq(1).to(at::kDouble).mean().item<double>() == Approx(0.25).margin(0.01));
  CHECK_THAT(model.describe(), Catch::Matchers::Contains("calibrated"));
}

TEST_CASE("parameter count, description and seeding", "[model]") {
  const int64_t V = 50, d = 16;
  model::ChiarModel baseline(test::plugins(), small({"attn", "attn"}));
  const int64_t attention = (d * d + d) + (d * 2 * d + 2 * d) + (d * d + d) + 2 * d;
  const int64_t ffn = (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * d;
  CHECK(baseline.parameter_count() == V * d + 2 * (attention + ffn));  // "auto": post-norm for a language model
  const int64_t final_norm = 2 * d;                                    // pre-norm ends in one more LayerNorm
  CHECK(model::ChiarModel(test::plugins(), small({"attn", "attn"}).norm(model::NormPlacement::Pre)).parameter_count() ==
        V * d + 2 * (attention + ffn) + final_norm);
  model::ChiarModel routed(test::plugins(), small({"dct|attn", "dct"}));
  const int64_t dct = d + 2 * d, gate = 0;
  CHECK(routed.parameter_count() == V * d + (dct + attention + gate + ffn) + (dct + ffn));
  // "auto" is pre-norm for a classifier.
  CHECK_THAT(model::ChiarModel(test::plugins(), small({"attn"}).head(TaskHead::Classifier).n_classes(3)).describe(),
             Catch::Matchers::Contains("classifier, vocab 50, d 16, heads 2, ffn x4, pre-norm, classes 3"));
  CHECK(
      routed.describe() ==
      std::string("ChiarModel(language-model, vocab 50, d 16, heads 2, ffn x4, post-norm, layers [dct(filter, gemm) | "
                  "attention(heads 2, block 128, fused core (fp32 CPU), else ") +
          (test::attention_has_sdpa() ? "SDPA" : "chunked") +
          ", rope) routed by threshold(tau [0.5], uncalibrated); dct(filter, gemm)], " +
          std::to_string(routed.parameter_count()) + " parameters)");
  model::ChiarModel again(test::plugins(), small({"dct|attn", "dct"}));
  auto x = tokens(1, 8);
  CHECK(at::equal(routed.forward(x).logits, again.forward(x).logits));
  // The embedding's draw: N(0, 0.02^2) unless model.embed_std says otherwise
  // (V d = 800 values: the sample deviation is within 10% of the target).
  CHECK(baseline.embedding_weight().std().item<double>() == Approx(0.02).epsilon(0.1));
  model::ChiarModel unit(test::plugins(), small({"attn", "attn"}).embed_std(1.0));
  CHECK(unit.embedding_weight().std().item<double>() == Approx(1.0).epsilon(0.1));
}

TEST_CASE("lm_loss through the fused head equals the loss from the logits, value and every gradient",
          "[model][cross_entropy]") {
  // The fp32 fused path against libtorch's cross-entropy on the logits the
  // same model gives, with the tied weight reached twice (embedding and head).
  for (const auto& v : variants()) {
    CAPTURE(v.name);
    model::ChiarModel model(test::plugins(), v.options);
    model.train();
    at::manual_seed(5);
    const auto x = tokens(3, 12), targets = tokens(3, 12);
    const auto valid = at::arange(12).lt(9).expand({3, 12}).clone();  // 3 padded positions per sequence
    const auto w = valid.to(at::kFloat) / valid.sum().to(at::kFloat);
    std::vector<at::Tensor> fused, plain;
    at::Tensor fused_loss, plain_loss;
    for (const bool use_fused : {true, false}) {
      model.zero_grad();
      at::manual_seed(6);  // the same dropout masks and routing noise both times
      auto out = model.forward(x, valid, /*logits=*/!use_fused);
      at::Tensor loss;
      if (use_fused) {
        REQUIRE_FALSE(out.logits.defined());
        loss = model.lm_loss(out, targets, w);
      } else {
        const auto nll =
            at::cross_entropy_loss(out.logits.reshape({-1, 50}), targets.reshape({-1}), {}, at::Reduction::None);
        loss = (nll * w.reshape({-1})).sum();
      }
      loss.backward();
      (use_fused ? fused_loss : plain_loss) = loss.detach();
      for (const auto& p : model.parameters())
        (use_fused ? fused : plain).push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    }
    CHECK(fused_loss.item<double>() == Approx(plain_loss.item<double>()).epsilon(1e-5));
    REQUIRE(fused.size() == plain.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      CAPTURE(i);
      CHECK(rel_error(fused[i], plain[i]) < 1e-4);
    }
  }
}

TEST_CASE("model options are checked with clear messages", "[model][errors]") {
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"dct", "conv"})),
                    "unknown operator 'conv' (known: attention (attn), dct, fourier, rbf)");
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"dct|", "attn"})), "layer 'dct|': empty operator name");
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"dct|attn"}, "mystery")),
                    "unknown router 'mystery' (known: hard_ste, soft, threshold, topk_entropy)");
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({}).layers({})),
                    "model.layers is required: one operator per block, or operators joined by '|' for a routed layer "
                    "(operators loaded: attention (attn), dct, fourier, rbf)");
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"dct", "dct|attn"}, "")),
                    "model.router is required: layer 2 ('dct|attn') is routed (routers loaded: hard_ste, soft, "
                    "threshold, topk_entropy)");
  CHECK_NOTHROW(model::ChiarModel(test::plugins(), small({"dct", "attn"}, "")));  // nothing routed, nothing to name
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"attn"}).n_heads(3)),
                    "model: d_model (16) must be a positive multiple of n_heads (3)");
  for (const double bad : {0.0, -0.02, std::nan("")})
    CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"attn"}).embed_std(bad)),
                      "model: embed_std must be positive");
  for (const double bad : {-0.1, 1.0, std::nan("")})
    CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"attn"}).dropout(bad)),
                      "model: dropout must lie in [0, 1)");
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"attn"}).ffn_mult(0)),
                    "model: ffn_mult must be positive");
  model::OperatorParams nosuch;
  nosuch["atn"] = Params();
  CHECK_THROWS_WITH(model::ChiarModel(test::plugins(), small({"attn"}).operator_params(nosuch)),
                    "model.operators: unknown operator 'atn' (known: attention (attn), dct, fourier, rbf)");
  CHECK_THROWS_WITH(model::meta_router_from_string("global"),
                    "unknown meta_router 'global' (known: none, causal, batch_mean)");
}
