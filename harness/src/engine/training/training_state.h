#pragma once
// A run's resumable training state as bytes: the model, the optimiser, where
// training stands (ResumePoint) and the random generators, so that a resumed
// run goes on exactly as if never stopped. RunCheckpoints
// (engine/training/run_checkpoints.h) keeps the bytes.
#include <cmath>
#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/output-archive.h>

#include "model/model.h"

namespace chiar::engine {

// Where training stands, besides the model and the optimiser.
struct ResumePoint {
  int64_t step = 0;             // steps trained
  double best = -INFINITY;      // the best validation score so far
  bool has_best = false;        // whether a best-<step>.pt holds it
  bool validate_first = false;  // a stop cut step `step`'s validation short: validate it before training on
  double train_seconds = 0;     // training seconds, all processes together
};

// The bytes of a serialised archive: written to a file by write_durably,
// never by libtorch's file writer, which throws from a destructor (and so
// aborts the process) when the disk fills.
std::string archive_bytes(torch::serialize::OutputArchive& archive);

// The state at `point` as checkpoint bytes; with the CPU's generator and,
// on a GPU, the device's.
std::string state_bytes(model::ChiarModel& model, torch::optim::AdamW& optimizer, const at::Device& device,
                        const ResumePoint& point);

// Loads state bytes into the model, the optimiser and the generators, and
// returns their point. Storages map to `device`, wherever they were written.
ResumePoint restore_state(model::ChiarModel& model, torch::optim::AdamW& optimizer, const at::Device& device,
                          const std::string& bytes);

}  // namespace chiar::engine
