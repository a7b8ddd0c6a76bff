#pragma once
// One run of a matrix, fully resolved: every default filled in, so the spec
// alone says what ran. Its hash identifies the run in the store.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "engine/config/task_config.h"

namespace chiar::engine {

// A run's [train] options, with their defaults. What each means, the values
// it accepts and its TOML key live in one table, train_option_fields()
// (option_table.cpp); `chiar options` prints it.
struct TrainOptions {
  int64_t steps = 200;
  int64_t batch_size = 16;
  int64_t grad_accum = 1;
  double lr = 1e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup = 20;
  double weight_decay = 0.1;
  bool decay_embeddings = true;  // true is left out of run hashes (option_table.cpp)
  double beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;
  int64_t eval_every = 100;
  int64_t eval_batches = 0;
  int64_t eval_batch_size = 16;
  int64_t checkpoint_every = 100;
  int64_t calibration_batches = 4;
  int64_t threads = 0;
  int64_t log_every = 10;
  std::string precision = "auto";  // engine/runtime/device.h: bf16 on a GPU, fp32 on the CPU
  std::string device = "auto";     // engine/runtime/device.h; recorded, not hashed
  double fail_loss_above = 0;
};

struct RunSpec {
  std::string matrix, variant, task;
  int64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> sweep;  // axis, value
  std::vector<std::string> swept;  // the option paths the sweep axes set ("train.lr"): where values came from
  model::ModelOptions model;       // vocabulary, head and classes come from the task at run time
  TaskConfig task_config;
  TrainOptions train;
  std::string canonical;      // the resolved spec as JSON, keys sorted
  std::string resolved_toml;  // the same spec as TOML, readable back by run_spec_from_toml
  std::string hash;           // 16 hex digits of FNV-1a over canonical
  std::string task_family;    // the task table's "family" (metadata, outside the hash)

  // "variant/task/seed=S" plus ",axis=value" per sweep axis.
  std::string name() const;
};

}  // namespace chiar::engine
