#include "bench/round_stats.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <boost/math/distributions/binomial.hpp>

namespace chiar::bench {

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
  // How many of the n values fall under the population median: B(n, 1/2).
  // below(l) = P(B <= l - 1), the chance that x_(l) lies above the median.
  const boost::math::binomial_distribution<double> under_median(static_cast<double>(n), 0.5);
  const auto below = [&](int64_t l) { return boost::math::cdf(under_median, static_cast<double>(l - 1)); };
  int64_t rank = 0;  // l, 1-based; 0: none qualifies
  while (2 * (rank + 1) <= n + 1 && below(rank + 1) <= tail) ++rank;
  if (rank == 0) return out;
  out.bounded = true;
  out.low = values[static_cast<size_t>(rank - 1)];
  out.high = values[static_cast<size_t>(n - rank)];
  out.coverage = 1 - 2 * below(rank);
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
