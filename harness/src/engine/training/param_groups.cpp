#include "engine/training/param_groups.h"

#include "model/model.h"

namespace chiar::engine {

std::vector<torch::optim::OptimizerParamGroup> param_groups(model::ChiarModel& model, const TrainOptions& t) {
  std::vector<at::Tensor> decay, no_decay;
  for (auto& p : model.parameters()) {
    const bool spared = !t.decay_embeddings && p.is_same(model.embedding_weight());
    (p.dim() >= 2 && !spared ? decay : no_decay).push_back(p);
  }
  auto options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(t.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return groups;
}

}  // namespace chiar::engine
