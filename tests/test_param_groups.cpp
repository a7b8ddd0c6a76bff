#include <catch2/catch.hpp>

#include "engine/training/param_groups.h"
#include "model/model.h"
#include "support/fixtures.h"

using namespace chiar;

namespace {

bool holds(const torch::optim::OptimizerParamGroup& group, const at::Tensor& p) {
  for (const auto& q : group.params())
    if (q.is_same(p)) return true;
  return false;
}

double decay_of(const torch::optim::OptimizerParamGroup& group) {
  return static_cast<const torch::optim::AdamWOptions&>(group.options()).weight_decay();
}

}  // namespace

TEST_CASE("AdamW decays the matrices, and the embedding unless train.decay_embeddings is false", "[train][adamw]") {
  const auto layers = GENERATE(std::vector<std::string>{"attn", "attn"}, std::vector<std::string>{"dct", "dct|attn"});
  const bool decay_embeddings = GENERATE(true, false);
  INFO("decay_embeddings " << decay_embeddings);
  model::ChiarModel model(test::plugins(), model::ModelOptions()
                                               .vocab_size(50)
                                               .d_model(16)
                                               .n_heads(2)
                                               .layers(layers)
                                               .router("threshold")
                                               .head(TaskHead::Classifier)
                                               .n_classes(3)
                                               .seed(1));
  engine::TrainOptions t;
  t.weight_decay = 0.25;
  t.decay_embeddings = decay_embeddings;
  const auto groups = engine::param_groups(model, t);
  REQUIRE(groups.size() == 2);
  CHECK(decay_of(groups[0]) == 0.25);
  CHECK(decay_of(groups[1]) == 0.0);
  CHECK(groups[0].params().size() + groups[1].params().size() == model.parameters().size());
  CHECK(holds(groups[0], model.embedding_weight()) == decay_embeddings);
  CHECK(holds(groups[1], model.embedding_weight()) == !decay_embeddings);
  for (const auto& p : model.parameters()) {
    if (p.is_same(model.embedding_weight())) continue;
    INFO("a parameter of shape " << p.sizes());
    CHECK(holds(groups[0], p) == (p.dim() >= 2));
    CHECK(holds(groups[1], p) == (p.dim() < 2));
  }
}
