#pragma once
// The test behind a claim's verdict: the difference between two variants'
// per-seed results with its 95% confidence interval, a two-sided p-value and
// an effect size, and Holm's step-down correction over the claims one report
// tests. Student's t comes from Boost.Math.
#include <string>
#include <vector>

namespace chiar::report {

// mean(a) - mean(b): what a claim "a beats b" is decided on.
struct Difference {
  bool paired = false;  // by seed (over the seeds both variants finished), else Welch's t
  int n_a = 0, n_b = 0;
  double diff = 0;          // paired: the mean per-seed difference (equal to the difference of means)
  double lo = 0, hi = 0;    // its 95% confidence interval
  double df = 0;            // degrees of freedom (Welch-Satterthwaite when unpaired)
  double p = 1;             // two-sided p-value of "no difference"
  // Hedges' g (unpaired; pooled standard deviation, small-sample corrected)
  // or d_z (paired: mean difference over the differences' standard
  // deviation). NaN when the spread is zero.
  double effect = 0;
};

// Welch's unequal-variance t-test; each side needs at least 2 values.
Difference welch_difference(const std::vector<double>& a, const std::vector<double>& b);
// The one-sample t-test of a[i] - b[i]; a and b are aligned by seed, n >= 2.
Difference paired_difference(const std::vector<double>& a, const std::vector<double>& b);

// The 0.975 quantile of Student's t on df degrees of freedom (any df > 0):
// the half-width of a two-sided 95% interval in standard errors.
double t_quantile_95(double df);

// Holm-Bonferroni adjusted p-values, in the order of `p`: the k-th smallest
// (1-based) becomes max over j <= k of min(1, (m - j + 1) p_(j)).
std::vector<double> holm_adjusted(const std::vector<double>& p);

// The seeds below which no verdict is given, on either side.
constexpr int kMinSeedsPerSide = 3;

}  // namespace chiar::report
