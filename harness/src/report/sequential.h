#pragma once
// Seeds added by a group-sequential design instead of after a look: a
// comparison is tested after each round of seeds against boundaries that
// spend its alpha over the rounds (Lan-DeMets, O'Brien-Fleming type), so
// that testing after every round keeps the false-positive rate at alpha.
// A comparison stops when it crosses its boundary (decided), when it can no
// longer be expected to cross it by the last round (futile: a non-binding
// rule, which can only lower the error rate), or at the last round.
#include <optional>
#include <string>
#include <vector>

#include "claims.h"
#include "engine/store/store.h"
#include "verdict_stats.h"

namespace chiar::report {

struct SequentialDesign {
  int max_seeds = 0;              // N: the seeds of the last round
  int rounds = 0;                 // K looks
  double alpha = 0.05;            // two-sided, spent over the looks, per comparison
  std::vector<int> seeds;         // cumulative seeds at each look: about N k / K, the first at least 3
  std::vector<double> z;          // the boundary on |Z| at each look
  std::vector<double> nominal_p;  // 2 (1 - Phi(z_k)): a look decides when the test's two-sided p is below it
  std::vector<double> spent;      // alpha spent by each look, cumulative
};

// The looks after seeds n_k = ceil(N k / K) and the two-sided boundaries
// that spend, on each side, a(t) = 2 - 2 Phi(z_{1 - alpha/4} / sqrt(t)) of
// its alpha / 2 by information t = n_k / N (Lan and DeMets' O'Brien-Fleming
// type, as gsDesign's sfLDOF),
// from the joint distribution of the looks' statistics (numerical
// integration over the continuation region). UserError when the first look
// would have fewer than kMinSeedsPerSide seeds.
SequentialDesign obrien_fleming_design(int max_seeds, int rounds, double alpha);

// Below this conditional power (under the trend seen so far) a comparison
// is futile: its seeds stop.
constexpr double kFutilePower = 0.10;

enum class LookOutcome { Continue, Decided, Futile, Final };
const char* to_string(LookOutcome o);  // as the store records it: continue, decided, futile, final

struct Look {
  LookOutcome outcome = LookOutcome::Continue;
  double p = NAN;                  // the test's two-sided p
  double nominal = NAN;            // the boundary's p at this look
  double conditional_power = NAN;  // of crossing by the last look, under the trend so far
};

// Comparison `d` at look k (0-based). A test without spread or with a NaN
// difference neither decides nor continues past the last look.
Look look_at(const SequentialDesign& design, size_t k, const Difference& d);

// The design as the store keeps it (engine::SequentialDesignRecord): for
// `claims` (by their fingerprint and ids), with `baseline` named, planned at
// alpha 0.05 / tests per comparison. read_sequential_looks reads it back.
engine::SequentialDesignRecord design_record(const SequentialDesign& design, const std::vector<ClaimSpec>& claims,
                                             const std::string& baseline, int tests);

// The design and each comparison's latest look, as a store made by `chiar
// run --decide` holds them; nullopt for a store without a design.
std::optional<SequentialLooks> read_sequential_looks(const std::string& db);

}  // namespace chiar::report
