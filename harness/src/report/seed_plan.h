#pragma once
// Seeds chosen before the main run: from a pilot store's spread, the seeds
// each comparison needs for a given power to detect the paper's effect and
// the smallest effect of interest, at the level the report will test it at
// (docs/usage.md#seeds-by-design).
#include <string>
#include <vector>

#include "claims.h"

namespace chiar::report {

struct SeedPlanOptions {
  double power = 0.8;
  int max_seeds = 50;  // a comparison needing more is named, not planned for
};

// One compare or equivalent row of the pilot: what it will be tested on,
// and the seeds it needs.
struct SeedPlanRow {
  std::string claim, task;
  std::string test;         // "paired" or "Welch", as the pilot's comparison ran
  int pilot_seeds = 0;      // seeds the pilot's test had (paired: both finished)
  double sd = 0, sd_b = 0;  // paired: the differences' standard deviation; Welch: each side's
  double effect = NAN;      // the paper's effect, a - b as stored (a ratio: (ratio - 1) x pilot mean of b)
  double margin = NAN;      // the smallest difference of interest, as stored
  int seeds_effect = -1;    // seeds for `power` against the effect: -1 not asked, 0 more than max_seeds
  int seeds_margin = -1;    // the same against the margin
  // An equivalent claim: seeds_margin is for two one-sided tests to show a
  // true difference of 0 within the margin.
  bool equivalence = false;
  std::string why;  // why a row has no plan ("no spread in the pilot", "not enough seeds in the pilot")
};

struct SeedPlan {
  std::vector<SeedPlanRow> rows;
  int tests = 0;        // the rows the report will test: the Bonferroni divisor
  double alpha = 0.05;  // per test: 0.05 / tests
  double power = 0.8;
  int max_seeds = 50;
  int seeds = 0;                    // what the matrix should run: the most any planned row needs (0: none planned)
  std::vector<std::string> beyond;  // "claim on task" rows needing more than max_seeds
};

// The plan from a pilot's claims table: `tests` is the number of (claim,
// task) rows the main run's report will hold (every kind), so each
// comparison is planned at 0.05 / tests, the level its verdict will use.
SeedPlan plan_seeds(const ClaimsTable& pilot, const std::vector<ClaimSpec>& claims, int tests,
                    const SeedPlanOptions& options);

// The plan as a table for a terminal, and as TOML with a comment per row,
// to paste into the matrix file before the main run.
std::string plan_table(const SeedPlan& plan);
std::string plan_toml(const SeedPlan& plan, const std::string& pilot);

}  // namespace chiar::report
