#include "chiar/class_data.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "chiar/error.h"
#include "chiar/random.h"

namespace chiar {

std::vector<int64_t> length_percentiles(std::vector<int64_t> values) {
  if (values.empty()) return {0, 0, 0, 0, 0};
  std::sort(values.begin(), values.end());
  std::vector<int64_t> out;
  for (double p : {0.0, 0.5, 0.9, 0.99, 1.0}) {
    const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
    out.push_back(values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)]);
  }
  return out;
}

ClassSplit::ClassSplit(std::string name, int64_t n_classes, int64_t pad_id, int64_t max_len)
    : name_(std::move(name)), n_classes_(n_classes), pad_id_(pad_id), max_len_(max_len) {}

void ClassSplit::add(std::vector<int32_t> ids, int64_t label, int64_t full_length, int64_t bytes, int64_t unknown) {
  if (label < 0 || label >= n_classes_)
    throw UserError(name_ + ": label " + std::to_string(label) + " is outside 0.." + std::to_string(n_classes_ - 1));
  if (ids.empty()) ids.push_back(static_cast<int32_t>(pad_id_));  // never an empty row
  if (static_cast<int64_t>(ids.size()) > max_len_) ids.resize(static_cast<size_t>(max_len_));
  ids_.push_back(std::move(ids));
  labels_.push_back(label);
  full_lengths_.push_back(full_length);
  bytes_ += bytes;
  unknown_ += unknown;
}

int64_t ClassSplit::longest() const {
  size_t n = 0;
  for (const auto& v : ids_) n = std::max(n, v.size());
  return static_cast<int64_t>(n);
}

Batch ClassSplit::gather(const std::vector<int64_t>& which) const {
  const int64_t B = static_cast<int64_t>(which.size());
  int64_t T = 1;
  for (int64_t i : which) T = std::max<int64_t>(T, static_cast<int64_t>(ids_[i].size()));
  auto tokens = at::full({B, T}, pad_id_, at::TensorOptions().dtype(at::kLong));
  auto valid = at::zeros({B, T}, at::TensorOptions().dtype(at::kBool));
  auto labels = at::empty({B}, at::TensorOptions().dtype(at::kLong));
  auto* x = tokens.data_ptr<int64_t>();
  auto* v = valid.data_ptr<bool>();
  auto* y = labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const auto& ids = ids_[which[b]];
    for (size_t t = 0; t < ids.size(); ++t) {
      x[b * T + static_cast<int64_t>(t)] = ids[t];
      v[b * T + static_cast<int64_t>(t)] = true;
    }
    y[b] = labels_[which[b]];
  }
  return {tokens, labels, valid, {}};
}

Batch ClassSplit::train_batch(uint64_t seed, int64_t step, int64_t batch) const {
  if (size() == 0) throw UserError(name_ + ": the split is empty");
  std::vector<int64_t> which;
  int64_t epoch = -1;
  std::vector<int64_t> order;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t g = step * batch + b;
    if (g / size() != epoch) {
      epoch = g / size();
      order = SplitMix64(seed, 0xC1A5, static_cast<uint64_t>(epoch)).permutation(size());
    }
    which.push_back(order[g % size()]);
  }
  return gather(which);
}

Batch ClassSplit::eval_batch(int64_t index, int64_t batch) const {
  std::vector<int64_t> which;
  for (int64_t i = index * batch; i < std::min(size(), (index + 1) * batch); ++i) which.push_back(i);
  if (which.empty()) throw UserError(name_ + ": evaluation batch " + std::to_string(index) + " is out of range");
  return gather(which);
}

SplitStats ClassSplit::stats() const {
  SplitStats s;
  s.split = name_;
  s.examples = size();
  s.bytes = bytes_;
  s.unknown = unknown_;
  s.label_counts.assign(static_cast<size_t>(n_classes_), 0);
  for (int64_t l : labels_) ++s.label_counts[l];
  for (int64_t n : full_lengths_) s.tokens += n;
  std::vector<bool> seen;
  for (const auto& ids : ids_)
    for (int32_t id : ids) {
      if (static_cast<size_t>(id) >= seen.size()) seen.resize(static_cast<size_t>(id) + 1, false);
      s.types += !seen[id];
      seen[id] = true;
    }
  s.lengths = length_percentiles(full_lengths_);
  return s;
}

Batch ClassificationTask::train_batch(uint64_t seed, int64_t step, int64_t batch_size) const {
  return split_of("train").train_batch(seed, step, batch_size);
}

int64_t ClassificationTask::eval_batch_count(const std::string& split, int64_t batch_size) const {
  return split_of(split).eval_batch_count(batch_size);
}

Batch ClassificationTask::eval_batch(const std::string& split, int64_t index, int64_t batch_size) const {
  return split_of(split).eval_batch(index, batch_size);
}

void ClassificationTask::add_split(ClassSplit split) { splits_.push_back(std::move(split)); }

ClassSplit& ClassificationTask::split_of(const std::string& split) {
  return const_cast<ClassSplit&>(static_cast<const ClassificationTask*>(this)->split_of(split));
}

const ClassSplit& ClassificationTask::split_of(const std::string& split) const {
  for (const auto& s : splits_)
    if (s.name() == split) return s;
  throw UserError(name_ + ": unknown split '" + split + "' (known: train, valid, test)");
}

}  // namespace chiar
