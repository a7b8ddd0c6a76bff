#include "sequential.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include <boost/math/distributions/normal.hpp>

#include "chiar/error.h"
#include "engine/store/store.h"

namespace chiar::report {
namespace {

double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double phi(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double z_upper(double tail) { return boost::math::quantile(boost::math::complement(boost::math::normal(), tail)); }

// Points of the continuation region's density (the score B(t) = Z sqrt(t)
// of the looks so far, given that none crossed), on a uniform grid.
struct Density {
  double lo = 0, step = 0;
  std::vector<double> f;
};

constexpr int kGrid = 801;  // odd, for Simpson's rule

double simpson(const Density& d, const std::vector<double>& g) {
  double sum = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double w = i == 0 || i + 1 == g.size() ? 1 : i % 2 ? 4 : 2;
    sum += w * d.f[i] * g[i];
  }
  return sum * d.step / 3;
}

// Probability that B moves from the region to |B| >= b over a time `dt`.
double crossing(const Density& d, double b, double dt) {
  const double sd = std::sqrt(dt);
  std::vector<double> g(d.f.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = d.lo + d.step * static_cast<double>(i);
    g[i] = (1 - Phi((b - x) / sd)) + Phi((-b - x) / sd);
  }
  return simpson(d, g);
}

// The density on (-b, b) after a further time `dt`.
Density advance(const Density& d, double b, double dt) {
  const double sd = std::sqrt(dt);
  Density out;
  out.lo = -b;
  out.step = 2 * b / (kGrid - 1);
  out.f.resize(kGrid);
  std::vector<double> g(d.f.size());
  for (int j = 0; j < kGrid; ++j) {
    const double y = out.lo + out.step * j;
    for (size_t i = 0; i < g.size(); ++i) g[i] = phi((y - (d.lo + d.step * static_cast<double>(i))) / sd) / sd;
    out.f[static_cast<size_t>(j)] = simpson(d, g);
  }
  return out;
}

}  // namespace

SequentialDesign obrien_fleming_design(int max_seeds, int rounds, double alpha) {
  if (rounds < 1) throw UserError("--rounds: expected 1 or more rounds, found " + std::to_string(rounds));
  SequentialDesign d;
  d.max_seeds = max_seeds;
  d.rounds = rounds;
  d.alpha = alpha;
  for (int k = 1; k <= rounds; ++k) d.seeds.push_back((max_seeds * k + rounds - 1) / rounds);
  if (d.seeds.front() < kMinSeedsPerSide)
    throw UserError("--max-seeds " + std::to_string(max_seeds) + " in " + std::to_string(rounds) +
                    " rounds gives a first round of " + std::to_string(d.seeds.front()) + " seeds; a test needs " +
                    std::to_string(kMinSeedsPerSide) + ": raise --max-seeds or lower --rounds");
  // Each side spends alpha / 2 by Lan and DeMets' O'Brien-Fleming-type
  // function 2 - 2 Phi(z_{1 - a/2} / sqrt(t)), a = alpha / 2.
  const double z_side = z_upper(alpha / 4);
  const auto spending = [&](double t) { return 2 * (2 - 2 * Phi(z_side / std::sqrt(t))); };
  Density region;
  double previous_t = 0, previous_spent = 0;
  for (int k = 0; k < rounds; ++k) {
    const double t = static_cast<double>(d.seeds[static_cast<size_t>(k)]) / max_seeds;
    const double spent = k + 1 == rounds ? alpha : spending(t);
    const double target = spent - previous_spent;
    double b = 0;
    if (k == 0) {
      b = z_upper(target / 2) * std::sqrt(t);
      region.lo = -b;
      region.step = 2 * b / (kGrid - 1);
      region.f.resize(kGrid);
      for (int j = 0; j < kGrid; ++j)
        region.f[static_cast<size_t>(j)] = phi((region.lo + region.step * j) / std::sqrt(t)) / std::sqrt(t);
    } else {
      // The crossing probability falls as the boundary rises: bisect.
      double lo = 0, hi = 40;
      for (int i = 0; i < 100; ++i) {
        const double mid = (lo + hi) / 2;
        (crossing(region, mid, t - previous_t) > target ? lo : hi) = mid;
      }
      b = (lo + hi) / 2;
      region = advance(region, b, t - previous_t);
    }
    d.z.push_back(b / std::sqrt(t));
    d.nominal_p.push_back(2 * (1 - Phi(d.z.back())));
    d.spent.push_back(spent);
    previous_t = t;
    previous_spent = spent;
  }
  return d;
}

const char* to_string(LookOutcome o) {
  switch (o) {
    case LookOutcome::Continue: return "continue";
    case LookOutcome::Decided: return "decided";
    case LookOutcome::Futile: return "futile";
    case LookOutcome::Final: return "final";
  }
  return "?";
}

Look look_at(const SequentialDesign& design, size_t k, const Difference& d) {
  Look look;
  look.nominal = design.nominal_p.at(k);
  const bool last = k + 1 == design.seeds.size();
  if (!std::isfinite(d.diff) || !(d.se > 0)) {
    look.outcome = last ? LookOutcome::Final : LookOutcome::Continue;
    return look;
  }
  look.p = d.p;
  if (d.p < look.nominal) {
    look.outcome = LookOutcome::Decided;
    return look;
  }
  if (last) {
    look.outcome = LookOutcome::Final;
    return look;
  }
  // The score so far, B = Z sqrt(t), and its drift per unit of information
  // if the trend holds; B(1) is normal around B + drift (1 - t).
  const double t = static_cast<double>(design.seeds[k]) / design.max_seeds;
  const double z = d.diff / d.se, c = design.z.back();
  const double drift = z / std::sqrt(t), rest = 1 - t;
  const double mean = z * std::sqrt(t) + drift * rest;
  look.conditional_power = (1 - Phi((c - mean) / std::sqrt(rest))) + Phi((-c - mean) / std::sqrt(rest));
  look.outcome = look.conditional_power < kFutilePower ? LookOutcome::Futile : LookOutcome::Continue;
  return look;
}

namespace {

// "[4, 8, 12]" -> 4 8 12, as the store writes its lists.
std::vector<double> numbers_of(const std::string& list) {
  std::vector<double> out;
  std::string text = list;
  for (char& c : text)
    if (c == '[' || c == ']' || c == ',') c = ' ';
  std::istringstream in(text);
  for (double v; in >> v;) out.push_back(v);
  return out;
}

std::string joined(const std::vector<double>& values, const char* format) {
  std::string out;
  for (double v : values) {
    char buf[32];
    std::snprintf(buf, sizeof buf, format, v);
    out += (out.empty() ? "" : ", ") + std::string(buf);
  }
  return out;
}

}  // namespace

engine::SequentialDesignRecord design_record(const SequentialDesign& design, const std::vector<ClaimSpec>& claims,
                                             const std::string& baseline, int tests) {
  engine::SequentialDesignRecord r;
  std::string ids;
  for (const auto& c : claims) ids += (ids.empty() ? "\"" : ", \"") + c.id + "\"";
  r.claims = claims_fingerprint(claims) + " [" + ids + "]";
  r.baseline = baseline;
  r.max_seeds = design.max_seeds;
  r.rounds = design.rounds;
  r.tests = tests;
  r.alpha = design.alpha;
  r.seeds = "[" + joined(std::vector<double>(design.seeds.begin(), design.seeds.end()), "%.0f") + "]";
  r.boundaries = "[" + joined(design.z, "%.6f") + "]";
  r.nominal_p = "[" + joined(design.nominal_p, "%.6g") + "]";
  return r;
}

std::optional<SequentialLooks> read_sequential_looks(const std::string& db) {
  engine::Store store(db, engine::StoreAccess::ReadOnly);
  const auto design = store.sequential_design();
  if (!design) return std::nullopt;
  SequentialLooks out;
  out.rounds = static_cast<int>(design->rounds);
  out.claims = design->claims.substr(0, design->claims.find(' '));
  for (double n : numbers_of(design->seeds)) out.seeds.push_back(static_cast<int>(n));
  char alpha[64];
  std::snprintf(alpha, sizeof alpha, "%.3g (0.05 / %lld)", design->alpha, static_cast<long long>(design->tests));
  out.design = "The compare rows come from a group-sequential design (chiar run --decide): up to " +
               std::to_string(design->max_seeds) + " seeds in " + std::to_string(design->rounds) + " rounds (" +
               joined(numbers_of(design->seeds), "%.0f") + " seeds), two-sided alpha " + alpha +
               " per comparison spent O'Brien-Fleming-like (Lan-DeMets); a round decides a comparison where its p "
               "is below the round's boundary (" +
               joined(numbers_of(design->nominal_p), "%.3g") +
               "), and such a row is tested on its latest look's seeds with the repeated confidence interval at "
               "that level. Seeds stopped for the decided and for the futile (under " +
               std::to_string(static_cast<int>(100 * kFutilePower)) + "% conditional power at the trend so far).";
  for (const auto& l : store.looks()) {  // in round order: the last one read is the latest
    SequentialLookState& state = out.latest[{l.claim, l.task}];
    state.round = static_cast<int>(l.round);
    state.seeds = static_cast<int>(l.seeds);
    state.nominal = l.nominal;
    state.outcome = l.outcome;
  }
  return out;
}

}  // namespace chiar::report
