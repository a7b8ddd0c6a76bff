#include "verdict_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

#include <boost/math/distributions/non_central_t.hpp>
#include <boost/math/distributions/students_t.hpp>

namespace chiar::report {
namespace {

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Sample variance (n - 1 in the denominator).
double variance_of(const std::vector<double>& v, double mean) {
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return ss / static_cast<double>(v.size() - 1);
}

// Fills the interval and the p-value of `d.diff` with standard error `se` on
// `d.df` degrees of freedom. A zero standard error (every seed agreeing
// exactly, as FLOP counts do) gives a zero-width interval, and p = 1 for no
// difference, 0 for one. A value that is not finite (a NaN metric) gives an
// interval of NaNs and p = 1: no verdict.
void fill_interval(Difference& d, double se) {
  d.se = se;
  if (!std::isfinite(d.diff) || !std::isfinite(se)) {
    d.lo = d.hi = std::numeric_limits<double>::quiet_NaN();
    d.p = 1.0;
    return;
  }
  if (!(se > 0)) {
    d.lo = d.hi = d.diff;
    d.p = d.diff == 0 ? 1.0 : 0.0;
    return;
  }
  const double q = t_quantile_95(d.df);
  d.lo = d.diff - q * se;
  d.hi = d.diff + q * se;
  const boost::math::students_t t(d.df);
  d.p = std::min(1.0, 2 * boost::math::cdf(boost::math::complement(t, std::abs(d.diff) / se)));
}

}  // namespace

double t_quantile_95(double df) { return t_upper_quantile(df, 0.025); }

double t_upper_quantile(double df, double tail) {
  return boost::math::quantile(boost::math::complement(boost::math::students_t(df), tail));
}

Interval interval_at(const Difference& d, double confidence) {
  if (!std::isfinite(d.diff) || !std::isfinite(d.se)) return {d.lo, d.hi};  // NaN, as fill_interval left them
  if (!(d.se > 0)) return {d.diff, d.diff};
  const double q = t_upper_quantile(d.df, (1 - confidence) / 2);
  return {d.diff - q * d.se, d.diff + q * d.se};
}

double tost_p(const Difference& d, double margin) {
  if (!(d.se > 0) || !std::isfinite(d.diff)) return std::numeric_limits<double>::quiet_NaN();
  const boost::math::students_t t(d.df);
  // H0 diff <= -margin against diff > -margin, and H0 diff >= margin against diff < margin.
  const double above = boost::math::cdf(boost::math::complement(t, (d.diff + margin) / d.se));
  const double below = boost::math::cdf(t, (d.diff - margin) / d.se);
  return std::max(above, below);
}

Difference one_sample(const std::vector<double>& values, double mu) {
  if (values.size() < 2) throw std::invalid_argument("one_sample: 2 or more values");
  Difference d;
  d.paired = true;
  d.n_a = static_cast<int>(values.size());
  const double m = mean_of(values);
  d.diff = m - mu;
  d.df = static_cast<double>(values.size() - 1);
  const double sd = std::sqrt(variance_of(values, m));
  d.sd_a = sd;
  fill_interval(d, sd / std::sqrt(static_cast<double>(values.size())));
  d.effect = sd > 0 ? d.diff / sd : std::numeric_limits<double>::quiet_NaN();
  return d;
}

double t_test_power(double effect, double se, double df, double alpha) {
  if (!(se > 0) || !(df > 0)) return std::numeric_limits<double>::quiet_NaN();
  const double critical = t_upper_quantile(df, alpha / 2);
  const boost::math::non_central_t shifted(df, std::abs(effect) / se);
  // Rejections on the effect's side and, rarely, on the other.
  return boost::math::cdf(boost::math::complement(shifted, critical)) + boost::math::cdf(shifted, -critical);
}

namespace {

// The standard error and degrees of freedom of n seeds' test: paired from
// the differences' standard deviation, else Welch from each side's.
std::pair<double, double> se_df_for(int n, bool paired, double sd_or_sd_a, double sd_b) {
  if (paired) return {sd_or_sd_a / std::sqrt(static_cast<double>(n)), n - 1.0};
  const double wa = sd_or_sd_a * sd_or_sd_a / n, wb = sd_b * sd_b / n;
  const double se = std::sqrt(wa + wb);
  const double df = se > 0 ? (wa + wb) * (wa + wb) / (wa * wa / (n - 1) + wb * wb / (n - 1)) : 2.0 * (n - 1);
  return {se, df};
}

template <class Power>
int fewest_seeds(bool paired, double sd_or_sd_a, double sd_b, double power, int max_seeds, Power&& power_at) {
  for (int n = kMinSeedsPerSide; n <= max_seeds; ++n) {
    const auto [se, df] = se_df_for(n, paired, sd_or_sd_a, sd_b);
    if (power_at(se, df) >= power) return n;
  }
  return 0;
}

}  // namespace

int seeds_for_power(double effect, bool paired, double sd_or_sd_a, double sd_b, double alpha, double power,
                    int max_seeds) {
  return fewest_seeds(paired, sd_or_sd_a, sd_b, power, max_seeds,
                      [&](double se, double df) { return t_test_power(effect, se, df, alpha); });
}

double tost_power(double margin, double se, double df, double alpha) {
  if (!(se > 0) || !(df > 0) || !(margin > 0)) return std::numeric_limits<double>::quiet_NaN();
  const double critical = t_upper_quantile(df, alpha);
  const boost::math::non_central_t shifted(df, margin / se);
  // Each one-sided test rejects with P(T' > t), T' non-central by margin /
  // se (the two are mirror images at a true difference of 0); both reject
  // with at least the sum of the two less 1.
  return std::max(0.0, 2 * boost::math::cdf(boost::math::complement(shifted, critical)) - 1);
}

int seeds_for_equivalence(double margin, bool paired, double sd_or_sd_a, double sd_b, double alpha, double power,
                          int max_seeds) {
  return fewest_seeds(paired, sd_or_sd_a, sd_b, power, max_seeds,
                      [&](double se, double df) { return tost_power(margin, se, df, alpha); });
}

Difference welch_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() < 2 || b.size() < 2) throw std::invalid_argument("welch_difference: each side needs 2 values");
  Difference d;
  d.n_a = static_cast<int>(a.size());
  d.n_b = static_cast<int>(b.size());
  const double ma = mean_of(a), mb = mean_of(b);
  const double va = variance_of(a, ma), vb = variance_of(b, mb);
  d.sd_a = std::sqrt(va);
  d.sd_b = std::sqrt(vb);
  const double wa = va / d.n_a, wb = vb / d.n_b;  // squared standard errors of the means
  d.diff = ma - mb;
  const double se2 = wa + wb;
  // Welch-Satterthwaite; with both spreads zero any df gives the same result.
  d.df = se2 > 0 ? se2 * se2 / (wa * wa / (d.n_a - 1) + wb * wb / (d.n_b - 1)) : d.n_a + d.n_b - 2;
  fill_interval(d, std::sqrt(se2));
  const double pooled = std::sqrt(((d.n_a - 1) * va + (d.n_b - 1) * vb) / (d.n_a + d.n_b - 2));
  const double correction = 1 - 3.0 / (4.0 * (d.n_a + d.n_b) - 9);
  d.effect = pooled > 0 ? d.diff / pooled * correction : std::numeric_limits<double>::quiet_NaN();
  return d;
}

Difference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2)
    throw std::invalid_argument("paired_difference: two aligned lists of 2 or more values");
  std::vector<double> delta(a.size());
  for (size_t i = 0; i < a.size(); ++i) delta[i] = a[i] - b[i];
  Difference d;
  d.paired = true;
  d.n_a = d.n_b = static_cast<int>(a.size());
  d.diff = mean_of(delta);
  d.df = static_cast<double>(delta.size() - 1);
  const double sd = std::sqrt(variance_of(delta, d.diff));
  d.sd_a = sd;
  fill_interval(d, sd / std::sqrt(static_cast<double>(delta.size())));
  d.effect = sd > 0 ? d.diff / sd : std::numeric_limits<double>::quiet_NaN();
  return d;
}

std::vector<double> holm_adjusted(const std::vector<double>& p) {
  const size_t m = p.size();
  std::vector<size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
  std::vector<double> out(m);
  double running = 0;  // adjusted values never decrease along the sorted order
  for (size_t k = 0; k < m; ++k) {
    running = std::max(running, std::min(1.0, static_cast<double>(m - k) * p[order[k]]));
    out[order[k]] = running;
  }
  return out;
}

}  // namespace chiar::report
