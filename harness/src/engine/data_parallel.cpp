#include "data_parallel.h"

#include <string>

#include "chiar/error.h"

namespace chiar::engine {

Batch slice_of_batch(const Batch& batch, int rank, int size) {
  const int64_t rows = batch.tokens.size(0) / size;
  auto slice = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, rank * rows, rows) : t; };
  return {slice(batch.tokens), slice(batch.targets), slice(batch.valid), slice(batch.scored)};
}

void check_batch_divides(int64_t batch_size, int processes) {
  if (processes > 1 && batch_size % processes != 0)
    throw UserError("train.batch_size " + std::to_string(batch_size) + " does not divide over " +
                    std::to_string(processes) +
                    " processes: the config names the global batch, and each process trains an equal slice of it");
}

int64_t real_tokens(const Batch& batch) {
  return batch.valid.defined() ? batch.valid.sum().item<int64_t>() : batch.tokens.numel();
}

}  // namespace chiar::engine
