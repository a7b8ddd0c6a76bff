#pragma once
// Trains and evaluates one run: AdamW with warm-up and cosine decay, gradient
// clipping and accumulation, router calibration, periodic evaluation with the
// best-validation model kept, checkpoints that a later process resumes from
// exactly, and the FLOP / routing records.
#include <atomic>
#include <functional>
#include <string>

#include <c10/core/Device.h>

#include "chiar/registry.h"
#include "chiar/task.h"
#include "engine/config/run_spec.h"
#include "engine/store/store.h"

namespace chiar::engine {

struct TrainResult {
  RunStatus outcome = RunStatus::Done;  // Done, Diverged or Interrupted
  int64_t diverged_step = -1;
  std::string error;
  // Interrupted: what a rerun does, for the console.
  std::string resumption = "checkpoint saved, rerun to resume";
  RunSummary summary;
};

class ProcessGroup;

struct TrainContext {
  const PluginRegistry& registry;
  const Task& task;
  // The run's store. Null on the ranks other than 0 of a data-parallel run:
  // they write no store and no checkpoint (rank 0 does both), and need not
  // see rank 0's file system.
  Store* store;
  std::string checkpoint_dir;     // this run's folder: spec.toml, state-<step>.pt, best-<step>.pt
  const std::atomic<bool>* stop;  // set by SIGINT/SIGTERM: checkpoint and return
  std::function<void(int64_t step, double loss, double tokens_per_s)> progress;
  std::string tag;  // the run's console prefix, for lines about its checkpoints
  // Data-parallel training (engine/cluster/process_group.h): every rank trains a slice
  // of each global batch, gradients are averaged over the group, rank 0's
  // checkpoint is the one every rank resumes from. Null: one process.
  ProcessGroup* group = nullptr;
  // Where the model, its optimiser state and each batch live: a name from
  // resolve_device (engine/runtime/device.h).
  std::string device = "cpu";
};

// train_run throws chiar::EnvironmentError when a checkpoint cannot be
// written or read (the store's own I/O errors arrive the same way), or when
// a rank of its process group is lost: the run is not at fault and resumes
// from its last recorded checkpoint. In a process group every rank calls
// train_run for the same runs in the same order; only rank 0's result
// counts (the others do not validate or score the test split).

TrainResult train_run(const RunSpec& spec, const TrainContext& ctx);

// When the host reads a training step's loss, which it needs for the
// divergence check, the log and the progress line. Every step: before the
// step's update, waiting for the step's forward and backward. Late: during
// the next step, once that step's forward and backward are queued behind
// it, so that a device that runs queued work (a GPU) is not left idle
// while the host reads, logs and builds the next batch (train_steps in
// trainer.cpp says what stays exact). Both train the same run, bit for bit;
// read late, a stop requested during a step takes effect a step later.
enum class LossReads { EveryStep, Late };

// CHIAR_LOSS_READS=every-step|late chooses; unset or empty, late on a GPU
// whose queue can be marked (engine/runtime/queue_mark.h), every step elsewhere
// (on the CPU, whose work is done when queued, late reads gain nothing).
// A data-parallel run reads every step whatever is chosen: its ranks agree
// on the loss each step. Throws UserError for another value:
//   CHIAR_LOSS_READS: "sometimes" is not one of every-step, late
LossReads loss_reads_for(const at::Device& device);

// Throws loss_reads_for's UserError for a bad CHIAR_LOSS_READS: `chiar run`
// checks it before the store opens.
void check_loss_reads_setting();

// The model a run trains, built from its spec and its task.
model::ModelOptions model_options_for(const RunSpec& spec, const Task& task);

}  // namespace chiar::engine
