#pragma once
// The paper's claims, read from a claims file (configs/claims.toml), and
// their verdicts against a store's summary.
#include <optional>
#include <string>
#include <vector>

#include "summary.h"
#include "verdict_stats.h"

namespace chiar::report {

// One claim as the file states it. Variant names are as the file writes them;
// "$baseline" stands for the report's baseline variant.
struct ClaimSpec {
  std::string id;
  std::string text;  // the paper's statement, with its numbers
  // "compare": variants[0] beats variants[1] on the metric, on the task, or on
  //   every task a pattern (or family) matches that has both;
  // "reduction": variants[0]'s metric is `reduction` % below variants[1]'s,
  //   within `tolerance` points, on every task the pattern matches that has both;
  // "share": the mean final routing share that variants[0]'s finished runs give
  //   the operator (or the operators of the role) is on the `better` side of
  //   `threshold`.
  std::string kind;
  std::string task;                   // a task name, or a glob over task names
  // Instead of a task: the tasks whose table sets this "family" (a CPU-scale
  // corpus standing in for "large natural text"); the report names them.
  std::string family;
  std::vector<std::string> variants;  // two, or one for "share"
  // The first metric of the list the variant reports is compared, with the
  // direction at the same place: "lower" or "higher" is better.
  std::vector<std::string> metrics;
  std::vector<std::string> better;
  std::vector<double> paper;  // the paper's values, per variant, in the report's units
  double reduction = 0, tolerance = 0;  // "reduction", in percent
  std::string op, role;                 // "share": an operator name, or a role
  double threshold = 0;                 // "share": a fraction of tokens
  std::string where;                    // file:line:column of the claim
};

// One test of a compare claim: the two variants on one task.
struct Comparison {
  std::string task, a, b, metric;  // "a beats b" on the metric
  bool lower_better = true;
  int n_a = 0, n_b = 0;            // finished seeds per side
  std::string left_out;            // runs without a value, e.g. "chiar_soft 2 diverged"; "" for none
  double mean_a = 0, mean_b = 0;   // as stored (accuracy as a fraction)
  std::optional<Difference> test;  // none below kMinSeedsPerSide seeds on a side
  double p_adjusted = 1;           // Holm-adjusted over every comparison the report tests
  std::string verdict;             // "holds" | "does not hold" | "inconclusive" | "not enough seeds"
};

struct Claim {
  std::string id;
  std::string claim;     // the paper's statement, with its numbers
  std::string paper;     // the paper's values side by side, e.g. "36.54 vs 66.62"; may be empty
  std::string measured;  // what this database measured, with the test behind the verdict
  // "holds" | "does not hold" | "inconclusive" | "not enough seeds"
  std::string verdict;
  // Whether our difference points the way the paper's values do: "agrees",
  // "disagrees", "mixed" (over several tasks, some each way), or "" (no paper
  // values, or nothing measured).
  std::string direction;
  std::vector<Comparison> comparisons;  // compare claims: one per task tested
};

// Reads a claims file and every file it includes (for the variants it may
// name). Anything it cannot use, an unknown key, or a variant, metric, kind or
// role it cannot name, is a UserError "file:line:column: key 'K': what".
std::vector<ClaimSpec> load_claims(const std::string& file);

// Where `chiar report` finds the claims without --claims: configs/claims.toml
// in the working folder, else in the folder above the chiar executable's (the
// source tree for a build inside it), else <prefix>/share/chiar/configs of an
// installed chiar.
std::string default_claims_file();

// One claim's verdict, tested alone (Holm over its own comparisons). A claim
// with fewer than kMinSeedsPerSide finished seeds on a side of every task it
// is about is "not enough seeds": no verdict comes from one or two seeds.
//   compare: per task, the difference of the two variants' per-seed test
//     metrics with its 95% CI (paired by seed over the seeds both finished
//     when there are 3 of them, else Welch's t); "holds" when the interval and
//     the Holm-adjusted p (< 0.05) put it on the claimed side, "does not hold" on the other side,
//     "inconclusive" when the interval contains zero or the adjusted p is
//     0.05 or more. Over a task pattern or family: holds (or does not) when
//     every task says so, inconclusive when they differ, and not enough seeds
//     while any task lacks them (a family is not judged by some members).
//   reduction: the metric's cut on every task, each side from >= 3 seeds.
//   share: the variant's mean final share over >= 3 finished runs.
Claim evaluate_claim(const ClaimSpec& claim, const Summary& s, const std::string& baseline);

// Every claim, with Holm's correction over all their comparisons together;
// the measured text says how many were tested.
std::vector<Claim> evaluate_claims(const std::vector<ClaimSpec>& claims, const Summary& s,
                                   const std::string& baseline);

}  // namespace chiar::report
