#pragma once
// The paper's claims, read from a claims file (configs/claims.toml), and
// their verdicts against a store's summary.
#include <string>
#include <vector>

#include "summary.h"

namespace chiar::report {

// One claim as the file states it. Variant names are as the file writes them;
// "$baseline" stands for the report's baseline variant.
struct ClaimSpec {
  std::string id;
  std::string text;  // the paper's statement, with its numbers
  // "compare": variants[0] beats variants[1] on the metric's mean, on the task,
  //   or by majority over the tasks a pattern matches;
  // "reduction": variants[0]'s metric is `reduction` % below variants[1]'s,
  //   within `tolerance` points, on every task the pattern matches that has both;
  // "share": the mean final routing share that variants[0]'s finished runs give
  //   the operator (or the operators of the role) is on the `better` side of
  //   `threshold`.
  std::string kind;
  std::string task;                   // a task name, or a glob over task names
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

struct Claim {
  std::string id;
  std::string claim;     // the paper's statement, with its numbers
  std::string paper;     // the paper's values side by side, e.g. "36.54 vs 66.62"; may be empty
  std::string measured;  // what this database measured
  std::string verdict;   // "holds" | "does not hold" | "not enough runs"
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

// One claim's verdict; claims about tasks or variants the database lacks are
// "not enough runs".
Claim evaluate_claim(const ClaimSpec& claim, const Summary& s, const std::string& baseline);

std::vector<Claim> evaluate_claims(const std::vector<ClaimSpec>& claims, const Summary& s,
                                   const std::string& baseline);

}  // namespace chiar::report
