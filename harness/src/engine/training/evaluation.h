#pragma once
// Scoring a split of a task with a model: the metrics a validation during
// training and the test scores at its end record.
#include <ATen/Device.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "chiar/task.h"
#include "engine/training/accounting.h"
#include "model/model.h"

namespace chiar::engine {

struct EvalResult {
  std::map<std::string, double> metrics;
  double tokens_per_s = 0;
  Accounting accounting;  // from the first batch
  double accounting_seconds = 0;
};

// Thrown by evaluate when a stop is requested between its batches.
struct EvaluationStopped {};

// Scores up to max_batches batches of a split (0: all of them) in fp32, or
// under bf16 autocast when `bf16`. A stop request ends it between batches
// by EvaluationStopped; a null `stop` is not interruptible (a process
// group's ranks stop only together, at a step). Metrics: nll, tokens,
// token_ppl (and on the whole split word_ppl, bits_per_byte) for a language
// model; accuracy, loss, accuracy_class_k, examples, majority_rate for a
// classifier; full_split 1 or 0.
EvalResult evaluate(model::ChiarModel& model, const Task& task, const std::string& split, int64_t max_batches,
                    int64_t batch_size, bool bf16, const at::Device& device, const std::atomic<bool>* stop);

// Higher is better: accuracy, or minus the mean NLL per token.
double score(const std::map<std::string, double>& metrics);

}  // namespace chiar::engine
