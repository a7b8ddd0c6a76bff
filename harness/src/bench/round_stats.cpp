#include "bench/round_stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace chiar::bench {

namespace {

// P(Binomial(n, 1/2) = i), from log-probabilities so that n in the
// thousands neither overflows C(n, i) nor underflows 2^-n.
double binomial_half_pmf(int64_t n, int64_t i) {
  return std::exp(std::lgamma(static_cast<double>(n + 1)) - std::lgamma(static_cast<double>(i + 1)) -
                  std::lgamma(static_cast<double>(n - i + 1)) + static_cast<double>(n) * std::log(0.5));
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
  int64_t rank = 0;                      // l, 1-based; 0: none qualifies
  double below = 0;                      // P(B <= rank - 1)
  double cdf = binomial_half_pmf(n, 0);  // P(B <= l - 1) for the l tried next
  for (int64_t l = 1; 2 * l <= n + 1 && cdf <= tail; ++l) {
    rank = l;
    below = cdf;
    cdf += binomial_half_pmf(n, l);
  }
  if (rank == 0) return out;
  out.bounded = true;
  out.low = values[static_cast<size_t>(rank - 1)];
  out.high = values[static_cast<size_t>(n - rank)];
  out.coverage = 1 - 2 * below;
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
