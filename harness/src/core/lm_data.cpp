#include "chiar/lm_data.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "chiar/error.h"
#include "chiar/random.h"

namespace chiar {
namespace {

const auto kLong = at::TensorOptions().dtype(at::kLong);

}  // namespace

LmStream::LmStream(const std::vector<int64_t>& ids, int64_t eos_id, int64_t pad_id) : pad_id_(pad_id) {
  stream_.reserve(ids.size() + 1);
  stream_.push_back(eos_id);
  stream_.insert(stream_.end(), ids.begin(), ids.end());
}

Batch LmStream::train_batch(uint64_t seed, int64_t step, int64_t batch, int64_t T, const std::string& mode) const {
  const int64_t N = targets();
  if (N < T + 1)
    throw UserError("the training split has " + std::to_string(N) +
                    " tokens, fewer than one block of seq_len + 1 = " + std::to_string(T + 1));
  auto tokens = at::empty({batch, T}, kLong), next = at::empty({batch, T}, kLong);
  auto* x = tokens.data_ptr<int64_t>();
  auto* y = next.data_ptr<int64_t>();
  if (mode == "blocks") {
    // The same number of blocks for every offset, so an epoch is a permutation.
    const int64_t blocks = std::max<int64_t>(1, (N - T + 1) / T);
    const int64_t max_offset = std::min(T - 1, N - blocks * T);
    int64_t epoch = -1, offset = 0;
    std::vector<int64_t> order;
    for (int64_t b = 0; b < batch; ++b) {
      // Sample g of the run; its epoch fixes the offset and the block order.
      const int64_t g = step * batch + b;
      if (g / blocks != epoch) {
        epoch = g / blocks;
        SplitMix64 rng(seed, 0xB10C, static_cast<uint64_t>(epoch));
        offset = static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_offset + 1)));
        order = rng.permutation(blocks);
      }
      const int64_t start = offset + order[g % blocks] * T;
      std::copy_n(stream_.begin() + start, T, x + b * T);
      std::copy_n(stream_.begin() + start + 1, T, y + b * T);
    }
  } else if (mode == "streams") {
    const int64_t part = N / batch;  // tokens per parallel stream
    const int64_t windows = part / T;
    if (windows < 1)
      throw UserError("the training split is too short for " + std::to_string(batch) + " streams of seq_len " +
                      std::to_string(T));
    const int64_t epoch = step / windows, w = step % windows;
    SplitMix64 rng(seed, 0x5743, static_cast<uint64_t>(epoch));
    const int64_t offset = static_cast<int64_t>(rng.below(static_cast<uint64_t>(part - windows * T + 1)));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t start = b * part + offset + w * T;
      std::copy_n(stream_.begin() + start, T, x + b * T);
      std::copy_n(stream_.begin() + start + 1, T, y + b * T);
    }
  } else {
    throw UserError("unknown batching '" + mode + "' (known: blocks, streams)");
  }
  return {tokens, next, {}, {}};
}

int64_t LmStream::eval_window_count(int64_t T, int64_t stride) const {
  const int64_t N = targets();
  if (N <= 0) return 0;
  if (stride <= 0) return (N + T - 1) / T;
  if (stride > T) throw UserError("eval_stride must not exceed seq_len");
  return N <= T ? 1 : 1 + (N - T + stride - 1) / stride;
}

int64_t LmStream::eval_batch_count(int64_t batch, int64_t T, int64_t stride) const {
  return (eval_window_count(T, stride) + batch - 1) / batch;
}

Batch LmStream::eval_batch(int64_t index, int64_t batch, int64_t T, int64_t stride) const {
  const int64_t N = targets(), windows = eval_window_count(T, stride);
  const int64_t first = index * batch, rows = std::min(batch, windows - first);
  if (index < 0 || rows <= 0) throw UserError("evaluation batch " + std::to_string(index) + " is out of range");
  auto tokens = at::full({rows, T}, pad_id_, kLong), next = at::full({rows, T}, pad_id_, kLong);
  auto valid = at::zeros({rows, T}, at::TensorOptions().dtype(at::kBool));
  auto scored = at::zeros({rows, T}, at::TensorOptions().dtype(at::kBool));
  auto* x = tokens.data_ptr<int64_t>();
  auto* y = next.data_ptr<int64_t>();
  auto* v = valid.data_ptr<bool>();
  auto* s = scored.data_ptr<bool>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t w = first + r;
    // Window w covers targets [begin, end); it scores targets [score_from, end).
    int64_t begin, end, score_from;
    if (stride <= 0) {
      begin = w * T;
      end = std::min(begin + T, N);
      score_from = begin;
    } else {
      end = std::min(T + w * stride, N);
      begin = std::max<int64_t>(0, end - T);
      score_from = w == 0 ? 0 : std::min(T + (w - 1) * stride, N);
    }
    for (int64_t i = begin; i < end; ++i) {
      const int64_t c = r * T + (i - begin);
      x[c] = stream_[i];
      y[c] = stream_[i + 1];
      v[c] = true;
      s[c] = i >= score_from;
    }
  }
  return {tokens, next, valid, scored};
}

}  // namespace chiar
