#pragma once
// One run of a matrix, fully resolved: every default filled in, so the spec
// alone says what ran. Its hash identifies the run in the store.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../core/model.h"
#include "../core/task_config.h"
#include "chiar/export.h"

namespace chiar::engine {

struct TrainOptions {
  int64_t steps = 200;
  int64_t batch_size = 16;
  int64_t grad_accum = 1;        // micro-batches per optimizer step
  double lr = 1e-3;
  double min_lr_ratio = 0.1;     // cosine decays to lr * min_lr_ratio
  int64_t warmup = 20;           // linear warm-up steps
  double weight_decay = 0.1;     // AdamW, on matrices only
  double beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;             // global gradient norm; 0 = off
  int64_t eval_every = 100;      // steps between validation evaluations (and at the end)
  int64_t eval_batches = 0;      // batches per intermediate evaluation; 0 = the whole split
  int64_t eval_batch_size = 16;
  int64_t checkpoint_every = 100;
  int64_t calibration_batches = 4;  // training batches whose entropies calibrate routers
  int64_t threads = 0;           // intra-op threads; 0 = all cores
  int64_t log_every = 10;        // steps between training-loss records
  std::string precision = "fp32";  // "fp32" | "bf16" (autocast, fp32 master weights)
  double fail_loss_above = 0;    // testing aid: a loss above this counts as divergence; 0 = off
};

struct CHIAR_API RunSpec {
  std::string matrix, variant, task;
  int64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> sweep;  // axis, value
  ModelOptions model;     // vocabulary, head and classes come from the task at run time
  TaskConfig task_config;
  TrainOptions train;
  std::string canonical;  // the resolved spec as JSON, keys sorted
  std::string resolved_toml;  // the same spec as TOML, readable back by run_spec_from_toml
  std::string hash;       // 16 hex digits of FNV-1a over canonical

  // "variant/task/seed=S" plus ",axis=value" per sweep axis.
  std::string name() const;
};

}  // namespace chiar::engine
