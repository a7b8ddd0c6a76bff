#pragma once
// Metrics from sums, never from averages of averages.
#include <cstdint>
#include <vector>

#include "chiar/export.h"

namespace chiar {

struct LmMetrics {
  double nll = 0;            // total negative log-likelihood, nats
  int64_t tokens = 0;        // scored tokens
  int64_t words = 0;         // words of the split (WikiText convention)
  int64_t bytes = 0;         // UTF-8 bytes of the split
  double token_ppl = 0;      // exp(nll / tokens)
  double word_ppl = 0;       // exp(nll / words): comparable across tokenisers
  double bits_per_byte = 0;  // nll / (bytes ln 2): comparable across tokenisers
};
CHIAR_API LmMetrics lm_metrics(double nll, int64_t tokens, int64_t words, int64_t bytes);

struct ClassMetrics {
  double accuracy = 0;
  double mean_loss = 0;
  std::vector<int64_t> correct;  // per class
  std::vector<int64_t> total;    // per class
};
// loss_sum: total cross-entropy; correct/total per class.
CHIAR_API ClassMetrics class_metrics(double loss_sum, const std::vector<int64_t>& correct,
                                     const std::vector<int64_t>& total);

}  // namespace chiar
