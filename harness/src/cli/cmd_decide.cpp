// chiar run --decide: a matrix run in rounds of seeds by a group-sequential
// design (report/sequential.h), each comparison of the claims tested after
// every round against its boundary; seeds stop for the decided and the
// futile, and go on for the rest.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>

#include "chiar/error.h"
#include "chiar/registry.h"
#include "cmd_decide.h"
#include "engine/store.h"
#include "report/claims.h"
#include "report/sequential.h"
#include "report/summary.h"

namespace chiar::cli {
namespace {

std::string json_list(const std::vector<double>& values, const char* format) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, values[i]);
    out += (i ? ", " : "") + std::string(buf);
  }
  return out + "]";
}

// The comparisons the design tests: every task of the matrix a compare claim
// is about, with the two variants it needs there.
struct Comparison {
  std::string claim, task, a, b;
};

std::vector<Comparison> comparisons_of(const std::vector<report::ClaimSpec>& claims,
                                       const std::map<std::string, std::string>& tasks, const std::string& baseline) {
  std::vector<Comparison> out;
  for (const auto& c : claims) {
    if (c.kind != "compare") continue;
    const auto name = [&](const std::string& v) { return v == "$baseline" ? baseline : v; };
    for (const auto& [task, family] : tasks)
      if (report::claim_is_about(c, task, family)) out.push_back({c.id, task, name(c.variants[0]), name(c.variants[1])});
  }
  return out;
}

std::string describe(const report::SequentialDesign& d, int rows) {
  std::ostringstream out;
  out << "sequential design: up to " << d.max_seeds << " seeds in " << d.rounds << " rounds (";
  for (size_t k = 0; k < d.seeds.size(); ++k) out << (k ? ", " : "") << d.seeds[k];
  out << " seeds); alpha 0.05 / " << rows << " per comparison, spent O'Brien-Fleming-like (Lan-DeMets): a round "
      << "decides where p <";
  for (size_t k = 0; k < d.nominal_p.size(); ++k) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s %.3g", k ? "," : "", d.nominal_p[k]);
    out << buf;
  }
  return out.str() + "\n";
}

}  // namespace

int run_sequential(const RunArgs& a, const engine::Matrix& matrix, const PluginRegistry& registry,
                   const engine::RunnerOptions& options) {
  const auto claims = report::load_claims(a.decide);
  std::vector<int64_t> seeds;  // the matrix's
  std::map<std::string, std::string> tasks;  // task -> family
  for (const auto& r : matrix.runs) {
    if (std::find(seeds.begin(), seeds.end(), r.seed) == seeds.end()) seeds.push_back(r.seed);
    tasks[r.task] = r.task_family;
  }
  // Rounds take the smallest seeds first, as the report reads a look's seeds.
  std::sort(seeds.begin(), seeds.end());
  const int max_seeds = a.max_seeds > 0 ? a.max_seeds : static_cast<int>(seeds.size());
  if (max_seeds > static_cast<int>(seeds.size()))
    throw UserError("--max-seeds " + std::to_string(max_seeds) + ": the matrix lists " + std::to_string(seeds.size()) +
                    " seeds; list at least as many in [matrix] seeds");
  int rows = 0;  // every (claim, task) row the report will test
  for (const auto& c : claims)
    for (const auto& [task, family] : tasks) rows += report::claim_is_about(c, task, family);
  const std::string baseline = a.baseline.empty() ? "baseline" : a.baseline;
  const auto compared = comparisons_of(claims, tasks, baseline);
  if (compared.empty()) throw UserError(a.decide + ": no compare claim is about a task of " + matrix.file);
  const report::SequentialDesign design = report::obrien_fleming_design(max_seeds, a.rounds, 0.05 / std::max(rows, 1));
  std::cout << describe(design, rows);

  engine::SequentialDesignRecord record;
  std::string ids = "[";
  for (const auto& c : claims) ids += (ids.size() > 1 ? ", \"" : "\"") + c.id + "\"";
  record.claims = a.decide + " " + ids + "]";
  record.baseline = baseline;
  record.max_seeds = max_seeds;
  record.rounds = a.rounds;
  record.tests = rows;
  record.alpha = design.alpha;
  std::vector<double> looks_at(design.seeds.begin(), design.seeds.end());
  record.seeds = json_list(looks_at, "%.0f");
  record.boundaries = json_list(design.z, "%.6f");
  record.nominal_p = json_list(design.nominal_p, "%.6g");
  if (options.dry_run) {
    std::cout << compared.size() << " comparisons; the first round runs every run of the matrix with seeds";
    for (int i = 0; i < design.seeds.front(); ++i) std::cout << " " << seeds[static_cast<size_t>(i)];
    std::cout << "\n";
    return 0;
  }
  const std::string db = options.db.empty() ? "results/" + matrix.name + ".db" : options.db;
  // (round, claim, task) -> the look's outcome, from earlier sittings: a rerun resumes.
  std::map<std::tuple<int64_t, std::string, std::string>, std::string> outcome;
  {
    engine::Store store(db);
    store.save_sequential_design(record);
    for (const auto& l : store.looks()) outcome[{l.round, l.claim, l.task}] = l.outcome;
  }
  const report::OperatorCatalog catalog(registry);
  for (size_t k = 0; k < design.seeds.size(); ++k) {
    const auto round_k = static_cast<int64_t>(k);
    std::vector<Comparison> open;  // not looked at in this round, and going on from the last
    for (const auto& c : compared) {
      if (outcome.count({round_k, c.claim, c.task})) continue;
      const auto before = outcome.find({round_k - 1, c.claim, c.task});
      if (k == 0 || (before != outcome.end() && before->second == "continue")) open.push_back(c);
    }
    if (open.empty()) continue;
    // The runs of this round: the first round's seeds of every run (variants
    // no claim names included), then the pairs the open comparisons need.
    std::set<std::pair<std::string, std::string>> needed;
    for (const auto& c : open) {
      needed.insert({c.a, c.task});
      needed.insert({c.b, c.task});
    }
    const std::set<int64_t> round_seeds(seeds.begin(), seeds.begin() + design.seeds[k]);
    engine::Matrix round = matrix;
    round.runs.clear();
    for (const auto& r : matrix.runs)
      if (round_seeds.count(r.seed) && (k == 0 || needed.count({r.variant, r.task}))) round.runs.push_back(r);
    std::cout << "round " << k + 1 << " of " << design.rounds << ": " << design.seeds[k] << " seeds, "
              << round.runs.size() << " runs, " << open.size() << " open comparisons\n"
              << std::flush;
    const int status = engine::run_matrix(round, registry, options);
    if (status != 0 && status != 1) return status;  // interrupted, or the environment failed: rerun to resume
    const report::Summary s = report::summarize(db, catalog);
    const report::ClaimsTable table = report::evaluate_claims(claims, s, baseline);
    engine::Store store(db);
    for (const auto& claim : table.claims)
      for (const auto& row : claim.tasks) {
        bool is_open = false;
        for (const auto& c : open) is_open |= c.claim == claim.id && c.task == row.task;
        if (!is_open || claim.kind != "compare") continue;
        report::Look look;
        look.nominal = design.nominal_p[k];
        look.outcome = k + 1 == design.seeds.size() ? report::LookOutcome::Final : report::LookOutcome::Continue;
        if (row.test) look = report::look_at(design, k, *row.test);
        engine::SequentialLookRecord l{static_cast<int64_t>(k), claim.id, row.task,
                                       row.test ? row.test->n_a : 0, look.p, look.nominal,
                                       look.conditional_power, report::to_string(look.outcome)};
        store.record_look(l);
        outcome[{l.round, l.claim, l.task}] = l.outcome;
        char line[256];
        std::snprintf(line, sizeof line, "  %s on %s: %lld seeds, p %s %.3g (boundary %.3g): %s\n", claim.id.c_str(),
                      row.task.c_str(), static_cast<long long>(l.seeds), std::isfinite(l.p) ? "=" : "n/a",
                      std::isfinite(l.p) ? l.p : 0.0, l.nominal, l.outcome.c_str());
        std::cout << line;
      }
  }
  std::map<std::string, int> counts;  // each comparison's latest outcome
  for (const auto& c : compared)
    for (int64_t k = design.rounds - 1; k >= 0; --k)
      if (const auto it = outcome.find({k, c.claim, c.task}); it != outcome.end()) {
        ++counts[it->second];
        break;
      }
  std::cout << "design done: " << counts["decided"] << " decided, " << counts["futile"] << " futile, "
            << counts["final"] << " at the last round; `chiar report " << db << " --claims " << a.decide
            << "` uses its boundaries\n";
  return 0;
}

}  // namespace chiar::cli
