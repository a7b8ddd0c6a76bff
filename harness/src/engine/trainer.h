#pragma once
// Trains and evaluates one run: AdamW with warm-up and cosine decay, gradient
// clipping and accumulation, router calibration, periodic evaluation with the
// best-validation model kept, checkpoints that a later process resumes from
// exactly, and the FLOP / routing records.
#include <atomic>
#include <functional>
#include <string>

#include "chiar/registry.h"
#include "chiar/task.h"
#include "run_spec.h"
#include "store.h"

namespace chiar::engine {

struct TrainResult {
  RunStatus outcome = RunStatus::Done;  // Done, Diverged or Interrupted
  int64_t diverged_step = -1;
  std::string error;
  RunSummary summary;
};

struct TrainContext {
  const PluginRegistry& registry;
  const Task& task;
  Store& store;
  std::string checkpoint_dir;       // this run's folder: spec.toml, state-<step>.pt, best-<step>.pt
  const std::atomic<bool>* stop;    // set by SIGINT/SIGTERM: checkpoint and return
  std::function<void(int64_t step, double loss, double tokens_per_s)> progress;
  std::string tag;                  // the run's console prefix, for lines about its checkpoints
};

// train_run throws chiar::EnvironmentError when a checkpoint cannot be
// written or read (the store's own I/O errors arrive the same way): the run
// is not at fault and resumes from its last recorded checkpoint.

TrainResult train_run(const RunSpec& spec, const TrainContext& ctx);

// The model a run trains, built from its spec and its task.
ModelOptions model_options_for(const RunSpec& spec, const Task& task);

}  // namespace chiar::engine
