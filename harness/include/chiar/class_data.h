#pragma once
// One classification split held as token ids, cut into padded batches with
// masks. Training order is a permutation per epoch drawn from (seed, epoch).
#include <cstdint>
#include <string>
#include <vector>

#include "chiar/export.h"
#include "chiar/task.h"

namespace chiar {

class CHIAR_API ClassSplit {
 public:
  ClassSplit(std::string name, int64_t n_classes, int64_t pad_id, int64_t max_len);

  // ids are truncated to max_len; full_length (>= ids.size()) feeds the stats.
  void add(std::vector<int32_t> ids, int64_t label, int64_t full_length, int64_t bytes = 0, int64_t unknown = 0);

  const std::string& name() const { return name_; }
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int64_t longest() const;

  // Pads to the longest example of the batch (at most max_len).
  Batch train_batch(uint64_t seed, int64_t step, int64_t batch) const;
  int64_t eval_batch_count(int64_t batch) const { return (size() + batch - 1) / batch; }
  Batch eval_batch(int64_t index, int64_t batch) const;
  SplitStats stats() const;

 private:
  Batch gather(const std::vector<int64_t>& which) const;

  std::string name_;
  int64_t n_classes_, pad_id_, max_len_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<int64_t> labels_, full_lengths_;
  int64_t bytes_ = 0, unknown_ = 0;
};

// A classification task over train/valid/test ClassSplits: everything but
// loading, tokens and description. Subclasses add their splits in their
// constructor.
class CHIAR_API ClassificationTask : public Task {
 public:
  TaskHead head() const override { return TaskHead::Classifier; }
  std::vector<std::string> splits() const override { return {"train", "valid", "test"}; }
  SplitStats stats(const std::string& split) const override { return split_of(split).stats(); }
  Batch train_batch(uint64_t seed, int64_t step, int64_t batch_size) const override;
  int64_t eval_batch_count(const std::string& split, int64_t batch_size) const override;
  Batch eval_batch(const std::string& split, int64_t index, int64_t batch_size) const override;

 protected:
  explicit ClassificationTask(std::string name) : name_(std::move(name)) {}
  void add_split(ClassSplit split);
  ClassSplit& split_of(const std::string& split);
  const ClassSplit& split_of(const std::string& split) const;

 private:
  std::string name_;
  std::vector<ClassSplit> splits_;
};

// Values of `values` at percentiles 0, 50, 90, 99, 100 (nearest rank).
CHIAR_API std::vector<int64_t> length_percentiles(std::vector<int64_t> values);

}  // namespace chiar
