#pragma once
// The task boundary: a task owns its data (files or a generator), its
// tokeniser and vocabulary, how batches are cut, and what its metric counts.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "chiar/export.h"
#include "chiar/params.h"

namespace chiar {

enum class TaskHead { LanguageModel, Classifier };

struct Batch {
  at::Tensor tokens;   // (B, T) int64 inputs
  at::Tensor targets;  // language model: (B, T) int64 next tokens; classifier: (B,) int64 labels
  at::Tensor valid;    // (B, T) bool, true for real tokens; undefined = all real
  at::Tensor scored;   // language model: (B, T) bool, targets that count in the metric
                       // (each split position exactly once over an evaluation); undefined = valid
};

// What `chiar data stats` prints for one split.
struct SplitStats {
  std::string split;
  int64_t examples = 0;               // lines (language model) or examples (classifier)
  int64_t tokens = 0;                 // after tokenisation, <eos> included
  int64_t words = 0;                  // whitespace words + one per line (the WikiText convention)
  int64_t bytes = 0;                  // UTF-8 bytes of the split's text, one newline per line
  int64_t unknown = 0;                // tokens that are <unk>
  int64_t types = 0;                  // distinct token ids in the split (its vocabulary)
  std::vector<int64_t> label_counts;  // classifier: examples per class
  std::vector<int64_t> lengths;       // tokens per example at percentiles 0, 50, 90, 99, 100
};

// What a factory gets: the task's options and the folders that relative data
// paths and caches resolve against. (Run seeds reach train_batch instead.)
struct TaskSpec {
  Params params;
  std::string data_root;  // relative "path" options resolve against it
  std::string cache_dir;  // trained tokenisers, extracted archives
};

class CHIAR_API Task {
 public:
  virtual ~Task();

  virtual TaskHead head() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t n_classes() const = 0;  // 0 for a language model
  virtual int64_t seq_len() const = 0;    // the longest T a batch has
  virtual int64_t pad_id() const = 0;
  virtual std::vector<std::string> splits() const = 0;  // e.g. {"train", "valid", "test"}
  virtual SplitStats stats(const std::string& split) const = 0;

  // Training batch number `step` of a run with this seed: a pure function of
  // (seed, step, batch_size), so a resumed run sees exactly the batches an
  // uninterrupted one would, and one task object serves every run.
  virtual Batch train_batch(uint64_t seed, int64_t step, int64_t batch_size) const = 0;

  // A split cut into evaluation batches that together score every position
  // (language model) or example (classifier) exactly once.
  virtual int64_t eval_batch_count(const std::string& split, int64_t batch_size) const = 0;
  virtual Batch eval_batch(const std::string& split, int64_t index, int64_t batch_size) const = 0;

  // Text <-> ids, for inspection tools.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  virtual std::string token_text(int64_t id) const = 0;

  // One line: the task, its data and tokeniser, how it evaluates.
  virtual std::string describe() const = 0;
};

}  // namespace chiar
