#include "data_parallel.h"

#include <string>

#include "chiar/error.h"
#include "engine/config/matrix.h"
#include "engine/config/task_config.h"

namespace chiar::engine {

Batch slice_of_batch(const Batch& batch, int rank, int size) {
  const int64_t rows = batch.tokens.size(0) / size;
  auto slice = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, rank * rows, rows) : t; };
  return {slice(batch.tokens), slice(batch.targets), slice(batch.valid), slice(batch.scored)};
}

void check_batches_divide(const Matrix& matrix, int processes) {
  if (processes <= 1) return;
  for (const auto& r : matrix.runs) {
    if (r.train.batch_size % processes == 0) continue;
    const std::string where = matrix.origin_of(r, "train.batch_size");
    throw UserError((where.empty() ? std::string("key 'train.batch_size'") : where) + ": " +
                    std::to_string(r.train.batch_size) + " does not divide over " + std::to_string(processes) +
                    " processes: the config names the global batch, and each process trains an equal slice of it "
                    "(run " +
                    r.name() + ")");
  }
}

int64_t real_tokens(const Batch& batch) {
  return batch.valid.defined() ? batch.valid.sum().item<int64_t>() : batch.tokens.numel();
}

}  // namespace chiar::engine
