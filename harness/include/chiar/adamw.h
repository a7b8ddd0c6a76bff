#pragma once
// AdamW in one pass per parameter: the same update, state and checkpoints as
// torch::optim::AdamW (it is one), but fp32 CPU parameters are updated by a
// single vectorised loop over (param, grad, exp_avg, exp_avg_sq) instead of
// the seven whole-tensor ops libtorch's step runs per parameter, all of them
// memory traffic (docs/performance.md, 'What moved it').
//
// Falls back to torch::optim::AdamW::step for the whole call when any
// parameter with a gradient is not fp32, not on the CPU, not contiguous, has
// a sparse gradient, or belongs to an amsgrad group, or when a closure is
// given.
#include <torch/optim/adamw.h>

#include "chiar/export.h"

namespace chiar {

class CHIAR_API FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // Whether the last step() took the fused loop (tests, provenance).
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool last_step_fused_ = false;
};

}  // namespace chiar
