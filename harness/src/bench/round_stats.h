#pragma once
// What bench-train's timed rounds say beyond their medians. Each round runs
// one step of every entry back to back, so two entries' times in the same
// round share that minute of the machine: their ratio in each round is one
// paired observation, and a machine that slows for a while moves both sides
// of it. The median of those per-round ratios comes with an interval that
// assumes nothing about their distribution (the rounds of a shared machine
// are not normal: a stall makes a long tail), so a target such as "bf16 at
// >= 1.6x fp32" can be read as met, missed or not settled by this run.
#include <cstdint>
#include <vector>

namespace chiar::bench {

// The median of n values and, where n allows, the order statistics
// x_(l) <= median <= x_(n + 1 - l) that cover the population median with
// probability >= confidence whatever the distribution: l is the largest rank
// with 2 P(Binomial(n, 1/2) <= l - 1) <= 1 - confidence. At 95%: n = 6 gives
// the extremes, n = 20 ranks 6 and 15; below 6 values no rank qualifies and
// `bounded` is false.
struct MedianInterval {
  double median = 0, low = 0, high = 0;
  bool bounded = false;
  int64_t count = 0;
  double coverage = 0;  // 1 - 2 P(B <= l - 1): the interval's exact coverage, >= confidence
};
MedianInterval median_interval(std::vector<double> values, double confidence = 0.95);

// numerator[i] / denominator[i] for each round i; both one value per timed
// round, in the same order (throws std::invalid_argument if the counts differ).
std::vector<double> per_round_ratios(const std::vector<double>& numerator, const std::vector<double>& denominator);

}  // namespace chiar::bench
