#pragma once
// AdamW in one pass per parameter: the same update, state and checkpoints as
// torch::optim::AdamW (it is one), but fp32 CPU parameters are updated by a
// single vectorised loop over (param, grad, exp_avg, exp_avg_sq) instead of
// the seven whole-tensor ops libtorch's step runs per parameter, all of them
// memory traffic (docs/performance.md, 'What moved it').
//
// Where that loop cannot run (a parameter not fp32, not on the CPU, not
// contiguous, or the "aten" kernel policy), the same update runs as
// libtorch's foreach ops over each group's parameters: op for op libtorch's
// step, but a handful of multi-tensor launches per group on a GPU instead of
// seven per parameter. Falls back to torch::optim::AdamW::step for the whole
// call when a parameter has a sparse gradient, moments that do not fit it,
// or belongs to an amsgrad group, or when a closure is given.
#include <torch/optim/adamw.h>

#include <vector>

#include "chiar/export.h"

namespace chiar {

class CHIAR_API FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // Every parameter's gradient dropped (undefined), as PyTorch's
  // zero_grad(set_to_none=True): the next backward hands each parameter its
  // gradient as computed, where zero_grad() would fill the old ones with
  // zeros for backward to add into (a pass of each over every parameter,
  // docs/performance.md, 'Gradients set, not added'). A parameter that gets no
  // gradient is then skipped by step(), as it is before its first one and
  // after a resume, rather than decayed on a zero gradient.
  void clear_gradients();

  // Whether the last step() took the fused loop, or the foreach ops (tests,
  // provenance).
  bool last_step_fused() const { return last_step_fused_; }
  bool last_step_foreach() const { return last_step_foreach_; }

 private:
  torch::Tensor foreach_step(const std::vector<torch::optim::OptimizerParamState*>& states);

  bool last_step_fused_ = false;
  bool last_step_foreach_ = false;
};

}  // namespace chiar
