#pragma once
// What one rank of a data-parallel run trains on, and how its loss is
// scaled so that averaging gradients over ranks gives the gradient of the
// whole batch. The config names the global batch: every rank draws the same
// batch (task batches are a function of seed and index) and keeps its own
// contiguous slice of rows, so a run's results do not depend on how many
// processes train it, up to float summation order.
#include <ATen/Tensor.h>

#include "chiar/task.h"

namespace chiar::engine {

// Rows [rank * B / size, (rank + 1) * B / size) of every tensor of the batch.
// B must be divisible by size (check_batch_divides).
Batch slice_of_batch(const Batch& batch, int rank, int size);

struct Matrix;

// Every run's global batch against the process count, before any rank
// starts: a UserError at the key that sets it, e.g.
//   "m.toml:14:1: key 'train.batch_size': 6 does not divide over 4 processes: ... (run base/lm/seed=0)"
// (without a location when the default or a --set gives it).
void check_batches_divide(const Matrix& matrix, int processes);

// The real tokens of a batch: valid's count, or every position.
int64_t real_tokens(const Batch& batch);

}  // namespace chiar::engine
