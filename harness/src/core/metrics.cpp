#include "chiar/metrics.h"

#include <cmath>

namespace chiar {

LmMetrics lm_metrics(double nll, int64_t tokens, int64_t words, int64_t bytes) {
  LmMetrics m;
  m.nll = nll;
  m.tokens = tokens;
  m.words = words;
  m.bytes = bytes;
  m.token_ppl = tokens > 0 ? std::exp(nll / static_cast<double>(tokens)) : NAN;
  m.word_ppl = words > 0 ? std::exp(nll / static_cast<double>(words)) : NAN;
  m.bits_per_byte = bytes > 0 ? nll / (static_cast<double>(bytes) * std::log(2.0)) : NAN;
  return m;
}

ClassMetrics class_metrics(double loss_sum, const std::vector<int64_t>& correct, const std::vector<int64_t>& total) {
  ClassMetrics m;
  m.correct = correct;
  m.total = total;
  int64_t right = 0, all = 0;
  for (size_t c = 0; c < total.size(); ++c) {
    right += correct[c];
    all += total[c];
  }
  m.accuracy = all > 0 ? static_cast<double>(right) / static_cast<double>(all) : NAN;
  m.mean_loss = all > 0 ? loss_sum / static_cast<double>(all) : NAN;
  return m;
}

}  // namespace chiar
