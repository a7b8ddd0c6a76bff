// chiar run --decide: a matrix run in rounds of seeds by a group-sequential
// design, in this process (every round) or as one round of a Slurm array
// task (--round-from).
#include "cmd_decide.h"

#include <iostream>
#include <set>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "chiar/registry.h"
#include "engine/store/results.h"
#include "engine/store/store.h"
#include "sequential_rounds.h"

namespace chiar::cli {
namespace {

DecideArgs decide_args(const RunArgs& a) { return {a.decide, a.baseline, a.max_seeds, a.rounds}; }

}  // namespace

void open_design(const std::string& db, SequentialRounds& rounds) {
  const auto parent = boost::filesystem::absolute(db).parent_path();
  boost::system::error_code ec;
  boost::filesystem::create_directories(parent, ec);
  if (ec) throw EnvironmentError(parent.string() + ": cannot create the folder: " + ec.message());
  if (boost::filesystem::exists(db)) {
    // A design's looks test what its rounds ran: runs made without it (a
    // pilot, a plain run) would enter its first look.
    engine::Store held(db, engine::StoreAccess::ReadOnly);
    const int64_t runs = engine::ResultsReader(db).run_count();
    if (!held.sequential_design() && runs > 0)
      throw UserError(db + ": holds " + std::to_string(runs) +
                      " runs made without a sequential design; a design starts in a new store (--db)");
  }
  engine::Store store(db);
  store.save_sequential_design(rounds.record());
  rounds.read_looks(store);
}

namespace {}  // namespace

int run_sequential(const RunArgs& a, const engine::Matrix& matrix, const PluginRegistry& registry,
                   const engine::RunnerOptions& options) {
  SequentialRounds rounds(decide_args(a), matrix);
  std::cout << rounds.describe() << "\n";
  if (options.dry_run) {
    std::cout << "the first round runs every run of the matrix with seeds";
    for (int i = 0; i < rounds.seeds_at(0); ++i) std::cout << " " << rounds.seeds()[static_cast<size_t>(i)];
    std::cout << "\n";
    return 0;
  }
  const std::string db = options.db.empty() ? "results/" + matrix.name + ".db" : options.db;
  open_design(db, rounds);
  const report::OperatorCatalog catalog(registry);
  int failed = 0;  // a round whose runs failed goes on with the seeds that finished; the exit says so
  for (int k = rounds.current_round(); k >= 0; k = rounds.current_round()) {
    const auto round_k = static_cast<size_t>(k);
    engine::Matrix round = matrix;
    round.runs = rounds.runs_of(round_k);
    std::cout << "round " << k + 1 << " of " << rounds.rounds() << ": " << rounds.seeds_at(round_k) << " seeds, "
              << round.runs.size() << " runs, " << rounds.open_at(round_k).size() << " open comparisons\n"
              << std::flush;
    const int status = engine::run_matrix(round, registry, options);
    if (status != 0 && status != 1) return status;  // interrupted, or the environment failed: rerun to resume
    failed |= status;
    engine::Store store(db);
    rounds.look(round_k, db, catalog, store, std::cout);
  }
  std::cout << rounds.summary() << "; `chiar report " << db << " --claims " << a.decide << "` uses its boundaries\n";
  return failed;
}

int run_sequential_round(const RunArgs& a, const engine::Matrix& matrix, const engine::Matrix& shard,
                         const PluginRegistry& registry, const engine::RunnerOptions& options) {
  SequentialRounds rounds(decide_args(a), matrix);
  {
    engine::Store design(a.round_from, engine::StoreAccess::ReadOnly);
    const auto held = design.sequential_design();
    if (!held || held->seeds != rounds.record().seeds || held->tests != rounds.record().tests)
      throw UserError(a.round_from + ": holds no sequential design, or another one than --decide " + a.decide +
                      " gives; `chiar slurm --decide` writes it");
    rounds.read_looks(design);
  }
  const int k = rounds.current_round();
  if (k < 0 || k + 1 != a.round) {
    // A task Slurm started late (requeued, say) after the design moved on.
    std::cout << "round " << a.round << " is not the design's current round ("
              << (k < 0 ? std::string("it is done") : std::to_string(k + 1)) << "): nothing to run\n";
    return 0;
  }
  std::set<std::string> in_round;
  for (const auto& r : rounds.runs_of(static_cast<size_t>(k))) in_round.insert(r.hash);
  engine::Matrix part = shard;
  part.runs.clear();
  for (const auto& r : shard.runs)
    if (in_round.count(r.hash)) part.runs.push_back(r);
  std::cout << "round " << k + 1 << " of " << rounds.rounds() << ": " << part.runs.size() << " runs of this shard\n"
            << std::flush;
  return engine::run_matrix(part, registry, options);
}

}  // namespace chiar::cli
