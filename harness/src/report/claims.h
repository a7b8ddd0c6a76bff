#pragma once
// The paper's claims, read from a claims file (configs/claims.toml), and
// their verdicts against a store's summary: one test per task a claim is
// about, every interval at one simultaneous level, and a combined verdict
// over the tasks (docs/usage.md#how-a-verdict-is-decided).
#include <cmath>
#include <map>
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
  // "compare": variants[0] beats variants[1] on the metric, on every task the
  //   claim is about;
  // "equivalent": variants[0]'s and variants[1]'s metric differ by less
  //   than `margin`, on every task (two one-sided tests);
  // "reduction": variants[0]'s metric is `reduction` % below variants[1]'s,
  //   within `tolerance` points, on every task;
  // "share": the final routing share variants[0]'s runs give the operator
  //   (or the operators of the role) is on the `better` side of `threshold`,
  //   on every task.
  std::string kind;
  std::string task;  // a task name, or a glob over task names
  // Instead of a task: the tasks whose table sets this "family" (a CPU-scale
  // corpus standing in for "large natural text"); the report names them.
  std::string family;
  std::vector<std::string> variants;  // two, or one for "share"
  // The first metric of the list the task's runs report is compared, with
  // the direction at the same place: "lower" or "higher" is better.
  std::vector<std::string> metrics;
  std::vector<std::string> better;
  std::vector<double> paper;  // the paper's values, per variant, in the report's units
  // "compare": the effect the paper asserts, variants[0] - variants[1] in the
  // report's units (percentage points for accuracy), or as the ratio
  // variants[0] / variants[1]; and the smallest difference of interest, for
  // an equivalence test (two one-sided tests), which "equivalent" claims
  // require. NaN when the file gives none.
  double effect = NAN, effect_ratio = NAN, margin = NAN;
  double reduction = 0, tolerance = 0;  // "reduction", in percent
  std::string op, role;                 // "share": an operator name, or a role
  double threshold = 0;                 // "share": a fraction of tokens
  std::string where;                    // file:line:column of the claim
};

// The per-task verdicts, and the combined ones over a claim's tasks.
namespace verdict {
constexpr const char* kHolds = "holds";
constexpr const char* kDoesNotHold = "does not hold";
constexpr const char* kInconclusive = "inconclusive";
constexpr const char* kNotEnoughSeeds = "not enough seeds";
constexpr const char* kNoVerdict = "no verdict";          // a NaN metric
constexpr const char* kTaskDependent = "task-dependent";  // combined only: some tasks hold, some do not
constexpr const char* kPartlyDecided = "partly decided";  // combined only: decided one way on some, the rest open
}  // namespace verdict

// One claim's test on one task.
struct TaskTest {
  std::string task;    // as the store names it
  std::string label;   // as the report names it: with the family a claim is about
  std::string metric;  // the metric compared
  std::string a, b;    // "a beats b"; b is "" for a share claim
  bool lower_better = true;
  int n_a = 0, n_b = 0;               // finished seeds per side with a value
  std::string left_out;               // runs without a value, e.g. "chiar_soft 2 diverged"; "" for none
  std::string missing;                // what keeps the test from running, e.g. "chiar_soft has no finished run"
  double mean_a = NAN, mean_b = NAN;  // as stored (accuracy and shares as fractions)
  // The test, on the claim's scale: compare, a - b; reduction, the per-seed
  // cut in percent; share, the logit of the share against the threshold's.
  std::optional<Difference> test;
  // compare with an effect_ratio: the same test on log(a) - log(b), whose
  // interval, exponentiated, is that of the ratio a / b.
  std::optional<Difference> log_ratio;
  bool no_spread = false;             // every seed gave the same value: no p-value
  double estimate = NAN;              // compare: a - b; reduction: cut in %; share: the share
  double raw_lo = NAN, raw_hi = NAN;  // the 95% interval of the estimate, unadjusted
  double lo = NAN, hi = NAN;          // at the report's simultaneous level
  double p_adjusted = NAN;            // compare: Bonferroni-adjusted p; NaN without a test or where a design decides
  double p_holm = NAN;                // compare: Holm-adjusted p, for the export
  double equivalence_p = NAN;         // equivalent, or compare with a margin: TOST p, Bonferroni-adjusted
  double boundary = NAN;              // compare decided by a sequential design: its look's boundary p
  double confidence = NAN;            // the level of lo and hi: the table's, or 1 - boundary
  std::string verdict;                // a verdict:: word other than the combined-only ones
  std::string direction;              // compare with the paper's values: "agrees", "contradicts", "undecided"; else ""
  std::string paper_effect;  // "compatible with the paper's +35.5 pp" | "rules out the paper's ...: at most ..." | ""
  std::string equivalence;   // "equivalent within ±1.00 pp" | "not shown equivalent within ±1.00 pp" | ""
  // The code states of the runs behind the row, where they are not one
  // clean state: "2 code states: 1a2b3c4d5e6f, products on onednn (6 runs);
  // ...". Such a row gets no verdict unless mixed code is allowed.
  std::string mixed_code;
  std::string note;      // why the row reads as it does, where it could puzzle
  std::string measured;  // the row as the report states it
};

struct Claim {
  std::string id, kind;
  std::string claim;  // the paper's statement, with its numbers
  std::string paper;  // the paper's values side by side, e.g. "36.54 vs 66.62"; may be empty
  // Combined over the tasks: holds (every task holds), does not hold (every
  // task contradicts it), task-dependent (some each way), partly decided
  // (one way on some, the rest inconclusive), inconclusive, not enough seeds
  // (a task lacks them: never judged on the others), or no verdict.
  std::string verdict;
  std::string detail;     // which tasks said what, e.g. "holds on lm; does not hold on lm2"
  std::string direction;  // over the tasks: agrees, contradicts, mixed, undecided, "agrees on 1 of 2 tasks", or ""
  std::vector<TaskTest> tasks;  // one per task the claim is about, in the store's order
  std::string measured;         // a claim about no task the store holds: what it needs; else ""
};

// A group-sequential design the store's runs were made by (`chiar run
// --decide`): each comparison's latest look. Its rows are decided at the
// boundary of that look, not at the report's Bonferroni level.
struct SequentialLookState {
  int round = 0;         // 0-based
  int seeds = 0;         // the seeds the look's test had
  double nominal = NAN;  // the boundary: the look decides where p is below it
  std::string outcome;   // decided | futile | final | continue
};
struct SequentialLooks {
  std::string design;  // how the report states the design, in one sentence
  std::string claims;  // claims_fingerprint() of the claims it was made for
  int rounds = 0;
  std::vector<int> seeds;  // cumulative seeds at each look: a row is tested on its look's smallest seeds
  std::map<std::pair<std::string, std::string>, SequentialLookState> latest;  // (claim id, task)
};

// Every claim of a report, tested together: one family of `tests` tests
// (every per-task test with a spread), each interval at `confidence` =
// 1 - 0.05 / tests (Bonferroni), so all of them hold together with 95%
// probability, and each verdict read off its interval.
struct ClaimsTable {
  std::vector<Claim> claims;
  int tests = 0;
  double confidence = 0.95;
  std::string sequential;           // the design the compare rows were decided by; "" for none
  bool mixed_code_allowed = false;  // rows from several code states judged all the same
};

// What identifies a set of claims to a sequential design made for them:
// their ids, kinds, tasks, variants, metrics and directions, hashed
// ("claims:<16 hex digits>"), whatever file path they were read from.
std::string claims_fingerprint(const std::vector<ClaimSpec>& claims);

// Reads a claims file and every file it includes (for the variants it may
// name). Anything it cannot use, an unknown key, or a variant, metric, kind or
// role it cannot name, is a UserError "file:line:column: key 'K': what".
std::vector<ClaimSpec> load_claims(const std::string& file);

// Where `chiar report` finds the claims without --claims: configs/claims.toml
// in the working folder, else in the folder above the chiar executable's (the
// source tree for a build inside it), else <prefix>/share/chiar/configs of an
// installed chiar.
std::string default_claims_file();

// Every claim against the store's summary, with one simultaneous level over
// all their per-task tests.
// With `sequential`, the compare rows it looked at are decided at their
// latest look's boundary, with the repeated confidence interval at that
// level, and say how the design left them.
// With allow_mixed_code, a row whose runs come from several code states (or
// a dirty tree) is judged anyway, and says so; without, it gets no verdict.
struct ClaimsOptions {
  const SequentialLooks* sequential = nullptr;
  bool allow_mixed_code = false;
};
ClaimsTable evaluate_claims(const std::vector<ClaimSpec>& claims, const Summary& s, const std::string& baseline,
                            const ClaimsOptions& options = {});

// One claim tested alone: the level covers its own tasks only.
Claim evaluate_claim(const ClaimSpec& claim, const Summary& s, const std::string& baseline);

// Whether a claim's row on a task will be one of the report's tests, as far
// as can be known before its runs: every row but a reduction of FLOP counts,
// which are exact. What `chiar plan` and a sequential design divide 0.05 by.
bool row_is_tested(const ClaimSpec& claim);

// Whether claims of this kind test a difference of two variants' metric per
// task ("compare", "equivalent"): paired or Welch, with a p-value, an effect
// size and a seed plan.
bool tests_a_difference(const std::string& kind);

// Whether a claim speaks about a task: by its family when it names one,
// else by the task name or glob.
bool claim_is_about(const ClaimSpec& claim, const std::string& task, const std::string& family);

// The metrics a claim may name, and how the report shows each.
struct MetricInfo {
  const char* name;
  double scale;      // stored value -> shown value
  int decimals;      // of a shown value and of a difference of two (a percent, percentage points, at scale 100)
  const char* unit;  // after a reduction's values
  bool exact;        // the same on every seed by construction (FLOP counts)
};
const MetricInfo* metric_info(const std::string& name);

}  // namespace chiar::report
