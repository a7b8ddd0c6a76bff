#include "equal_time.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "html.h"

namespace chiar::report {
namespace {

// Seconds of training a run of `v` had done at `step`, on its variant's clock.
double seconds_at(const VariantSummary& v, int64_t step) { return static_cast<double>(step) * v.step_ms / 1e3; }

// The run's validation metric after `seconds` of training, interpolated
// between the validations around it; NaN before its first validation.
double value_at(const VariantSummary& v, const RunRow& r, double seconds) {
  double prev_t = 0, prev_v = NAN;
  for (const auto& [step, value] : r.valid_curve) {
    const double t = seconds_at(v, step);
    if (t >= seconds) {
      if (t == seconds) return value;
      return std::isnan(prev_v) ? NAN : prev_v + (value - prev_v) * (seconds - prev_t) / (t - prev_t);
    }
    prev_t = t;
    prev_v = value;
  }
  // Past the curve's end (T* is a mean over seeds, so one seed of the
  // variant that sets it may stop short of it): the run's last value.
  return prev_v;
}

// A variant's mean time to its last comparable validation; NaN without curves.
double curve_end(const VariantSummary& v) {
  double sum = 0;
  int n = 0;
  if (v.step_ms <= 0) return NAN;
  for (const RunRow* r : v.runs)
    if (!r->valid_curve.empty()) {
      sum += seconds_at(v, r->valid_curve.rbegin()->first);
      ++n;
    }
  return n ? sum / n : NAN;
}

std::string stat_cell(const std::vector<double>& values, double scale, int digits) {
  const Stat s = stat_of(values);
  std::string out = fixed(s.mean * scale, digits);
  if (s.n >= 2) out += " ± " + fixed(s.std * scale, digits);
  return out;
}

}  // namespace

std::vector<EqualTimeTable> equal_time_tables(const Summary& s) {
  std::vector<EqualTimeTable> out;
  for (const auto& t : s.tasks) {
    EqualTimeTable e;
    e.task = t.task;
    e.seconds = std::numeric_limits<double>::infinity();
    int with_curves = 0;
    for (const auto& v : t.variants) {
      const double end = curve_end(v);
      if (std::isnan(end)) continue;
      ++with_curves;
      if (end < e.seconds) e.seconds = end, e.limited_by = v.variant;
    }
    if (with_curves < 2) continue;
    const std::string metric = t.language_model ? "valid token PPL" : "valid accuracy %";
    const double scale = t.language_model ? 1 : 100;
    e.table.header = {"variant",
                      "seeds",
                      metric + " at " + fixed(e.seconds, 1) + " s",
                      "steps by then",
                      metric + " at its curve's end",
                      "training s to its curve's end"};
    std::vector<double> at_equal_means;
    for (const auto& v : t.variants) {
      if (v.step_ms <= 0) continue;  // no clock: no curve in time
      std::vector<double> at, steps, last, seconds;
      for (const RunRow* r : v.runs) {
        if (r->valid_curve.empty()) continue;
        const auto& [end_step, end_value] = *r->valid_curve.rbegin();
        const double value = value_at(v, *r, e.seconds);
        if (!std::isnan(value)) at.push_back(value);
        steps.push_back(std::min(e.seconds * 1e3 / v.step_ms, static_cast<double>(end_step)));
        last.push_back(end_value);
        seconds.push_back(seconds_at(v, end_step));
      }
      if (last.empty()) continue;
      e.table.rows.push_back({v.variant, std::to_string(last.size()), at.empty() ? "" : stat_cell(at, scale, 2),
                              fixed(stat_of(steps).mean, 0), stat_cell(last, scale, 2),
                              fixed(stat_of(seconds).mean, 1)});
      at_equal_means.push_back(at.empty() ? NAN : stat_of(at).mean);
    }
    // The best value at T* in bold, as in the results tables.
    e.table.best.assign(e.table.rows.size(), std::vector<bool>(e.table.header.size(), false));
    int best = -1;
    for (size_t r = 0; r < at_equal_means.size(); ++r) {
      if (std::isnan(at_equal_means[r])) continue;
      if (best < 0 ||
          (t.language_model ? at_equal_means[r] < at_equal_means[best] : at_equal_means[r] > at_equal_means[best]))
        best = static_cast<int>(r);
    }
    if (best >= 0) e.table.best[best][2] = true;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace chiar::report
