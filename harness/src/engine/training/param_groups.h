#pragma once
// Which parameters AdamW decays.
#include <vector>

#include <torch/optim/adamw.h>

#include "engine/config/run_spec.h"

namespace chiar::engine {

// AdamW's two groups, in this order: the matrices, decayed by
// train.weight_decay (the token embedding among them unless
// train.decay_embeddings is false), and the rest (biases, LayerNorm gains),
// not decayed. Both keep the model's parameter order.
std::vector<torch::optim::OptimizerParamGroup> param_groups(model::ChiarModel& model, const TrainOptions& t);

}  // namespace chiar::engine
