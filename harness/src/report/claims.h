#pragma once
#include <string>
#include <vector>

#include "chiar/export.h"
#include "summary.h"

namespace chiar::report {

struct Claim {
  std::string claim;     // the paper's statement, with its numbers
  std::string measured;  // what this database measured
  std::string verdict;   // "holds" | "does not hold" | "not enough runs"
};

// Every claim of PAPER.md's v1 tables the database can speak to; claims about
// tasks or variants it lacks are listed as "not enough runs".
CHIAR_API std::vector<Claim> evaluate_claims(const Summary& s, const std::string& baseline);

}  // namespace chiar::report
