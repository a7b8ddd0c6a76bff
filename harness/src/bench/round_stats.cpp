#include "bench/round_stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace chiar::bench {

namespace {

// P(Binomial(n, 1/2) <= j), summed from log-probabilities so that n in the
// thousands neither overflows C(n, i) nor underflows 2^-n.
double binomial_half_cdf(int64_t n, int64_t j) {
  double sum = 0;
  const double log_half_n = static_cast<double>(n) * std::log(0.5);
  for (int64_t i = 0; i <= j && i <= n; ++i)
    sum += std::exp(std::lgamma(static_cast<double>(n + 1)) - std::lgamma(static_cast<double>(i + 1)) -
                    std::lgamma(static_cast<double>(n - i + 1)) + log_half_n);
  return sum;
}

}  // namespace

MedianInterval median_interval(std::vector<double> values, double confidence) {
  MedianInterval out;
  out.count = static_cast<int64_t>(values.size());
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  const int64_t n = out.count;
  // The middle value, or the mean of the two middle values.
  out.median = n % 2 ? values[static_cast<size_t>(n / 2)]
                     : 0.5 * (values[static_cast<size_t>(n / 2 - 1)] + values[static_cast<size_t>(n / 2)]);
  const double tail = (1 - confidence) / 2;
  int64_t rank = 0;  // l, 1-based; 0: none qualifies
  for (int64_t l = 1; 2 * l <= n + 1 && binomial_half_cdf(n, l - 1) <= tail; ++l) rank = l;
  if (rank == 0) return out;
  out.bounded = true;
  out.low = values[static_cast<size_t>(rank - 1)];
  out.high = values[static_cast<size_t>(n - rank)];
  out.coverage = 1 - 2 * binomial_half_cdf(n, rank - 1);
  return out;
}

std::vector<double> per_round_ratios(const std::vector<double>& numerator, const std::vector<double>& denominator) {
  if (numerator.size() != denominator.size())
    throw std::invalid_argument("per_round_ratios: " + std::to_string(numerator.size()) + " rounds against " +
                                std::to_string(denominator.size()));
  std::vector<double> out(numerator.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = numerator[i] / denominator[i];
  return out;
}

}  // namespace chiar::bench
