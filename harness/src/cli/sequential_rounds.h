#pragma once
// The rounds of a group-sequential design over a matrix (report/sequential.h):
// which comparisons each round tests, which runs it needs, and the looks
// after it. `chiar run --decide` runs the rounds in one process; `chiar
// slurm --decide` submits one job array per round and looks between them.
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "engine/config/matrix.h"
#include "engine/store/store.h"
#include "report/claims.h"
#include "report/sequential.h"
#include "report/summary.h"

namespace chiar::cli {

// The design's arguments, as `chiar run` and `chiar slurm` take them.
struct DecideArgs {
  std::string claims;    // --decide
  std::string baseline;  // what "$baseline" names; empty: "baseline"
  int max_seeds = 0;     // 0: every seed the matrix lists
  int rounds = 3;
};

class SequentialRounds {
 public:
  // One comparison the design tests: a compare claim on a task of the matrix.
  struct Comparison {
    std::string claim, task, a, b;
  };

  // From the whole matrix (not a shard of it): UserError for a claims file,
  // --max-seeds or --rounds it cannot use.
  SequentialRounds(const DecideArgs& args, const engine::Matrix& matrix);

  const engine::SequentialDesignRecord& record() const { return record_; }
  std::string describe() const;                                 // the design in a line
  const std::vector<int64_t>& seeds() const { return seeds_; }  // ascending: rounds take the smallest first
  size_t rounds() const { return design_.seeds.size(); }
  int seeds_at(size_t k) const { return design_.seeds[k]; }

  // Reads the looks recorded so far (a rerun resumes after them).
  void read_looks(engine::Store& store);
  // The first round whose comparisons are not all looked at; -1 when done.
  int current_round() const;
  // Round k's comparisons: not looked at in it, going on from the round before.
  std::vector<Comparison> open_at(size_t k) const;
  // Round k's runs: its seeds of every run in the first round, then of the
  // variant pairs the open comparisons need.
  std::vector<engine::RunSpec> runs_of(size_t k) const;
  // Tests round k's open comparisons on the store `db` (all of the design's
  // runs, or a view of them), records the looks in `design_store`, and
  // prints a line each on `out`.
  void look(size_t k, const std::string& db, const report::OperatorCatalog& catalog, engine::Store& design_store,
            std::ostream& out);
  std::string summary() const;  // how many ended decided, futile, at the last round

 private:
  const engine::Matrix& matrix_;
  std::vector<report::ClaimSpec> claims_;
  std::string baseline_;
  std::vector<int64_t> seeds_;
  std::vector<Comparison> compared_;
  int rows_ = 0;  // the report's (claim, task) rows: the Bonferroni divisor
  report::SequentialDesign design_;
  engine::SequentialDesignRecord record_;
  std::map<std::tuple<int64_t, std::string, std::string>, std::string> outcome_;  // (round, claim, task)
};

}  // namespace chiar::cli
