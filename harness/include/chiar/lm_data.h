#pragma once
// A language-modelling split as one token stream, cut into training and
// evaluation batches. The stream starts with <eos> (the end of a notional
// previous line), so every token of the split is a scored target.
#include <cstdint>
#include <string>
#include <vector>

#include "chiar/export.h"
#include "chiar/task.h"

namespace chiar {

class CHIAR_API LmStream {
 public:
  // ids: the split's tokens, <eos> after every line.
  LmStream(const std::vector<int64_t>& ids, int64_t eos_id, int64_t pad_id);

  int64_t targets() const { return static_cast<int64_t>(stream_.size()) - 1; }

  // mode "blocks": non-overlapping (T+1)-token blocks from a random offset,
  // visited in a random order, both drawn per epoch from (seed, epoch).
  // mode "streams": the stream cut into B contiguous parts read T at a time
  // (state can carry across steps), starting at a random offset per epoch.
  Batch train_batch(uint64_t seed, int64_t step, int64_t batch, int64_t T, const std::string& mode) const;

  // stride 0: non-overlapping windows of T targets. stride S > 0: windows of
  // T tokens ending S targets apart, scoring only their last S targets (the
  // first window scores all of its targets), so each target has >= T - S
  // tokens of context. Either way every target is scored exactly once.
  int64_t eval_window_count(int64_t T, int64_t stride) const;
  int64_t eval_batch_count(int64_t batch, int64_t T, int64_t stride) const;
  Batch eval_batch(int64_t index, int64_t batch, int64_t T, int64_t stride) const;

 private:
  std::vector<int64_t> stream_;  // <eos>, then the split's ids
  int64_t pad_id_;
};

}  // namespace chiar
