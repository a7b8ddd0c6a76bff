#include "sequential_rounds.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <sstream>

#include "chiar/error.h"
#include "engine/config/suggest.h"

namespace chiar::cli {
SequentialRounds::SequentialRounds(const DecideArgs& args, const engine::Matrix& matrix)
    : matrix_(matrix),
      claims_(report::load_claims(args.claims)),
      baseline_(args.baseline.empty() ? "baseline" : args.baseline) {
  std::map<std::string, std::string> tasks;  // task -> family
  for (const auto& r : matrix.runs) {
    if (std::find(seeds_.begin(), seeds_.end(), r.seed) == seeds_.end()) seeds_.push_back(r.seed);
    tasks[r.task] = r.task_family;
  }
  std::sort(seeds_.begin(), seeds_.end());
  const int max_seeds = args.max_seeds > 0 ? args.max_seeds : static_cast<int>(seeds_.size());
  if (max_seeds > static_cast<int>(seeds_.size()))
    throw UserError("--max-seeds " + std::to_string(max_seeds) + ": the matrix lists " + std::to_string(seeds_.size()) +
                    " seeds; list at least as many in [matrix] seeds");
  std::set<std::string> variants;
  for (const auto& r : matrix.runs) variants.insert(r.variant);
  const auto name = [&](const report::ClaimSpec& c, const std::string& v) {
    if (v == "$baseline") {
      if (!variants.count(baseline_))
        throw UserError("--baseline: " + matrix.file + " has no variant '" + baseline_ + "'" +
                        engine::did_you_mean(baseline_, std::vector<std::string>(variants.begin(), variants.end())));
      return baseline_;
    }
    if (!variants.count(v))
      throw UserError(c.where + ": claim '" + c.id + "': variant '" + v + "' is not in " + matrix.file +
                      "; a design cannot test it");
    return v;
  };
  for (const auto& c : claims_)
    for (const auto& [task, family] : tasks) {
      if (!report::claim_is_about(c, task, family)) continue;
      rows_ += report::row_is_tested(c);
      if (c.kind == "compare") compared_.push_back({c.id, task, name(c, c.variants[0]), name(c, c.variants[1])});
    }
  if (compared_.empty()) throw UserError(args.claims + ": no compare claim is about a task of " + matrix.file);
  design_ = report::obrien_fleming_design(max_seeds, args.rounds, 0.05 / std::max(rows_, 1));

  record_ = report::design_record(design_, claims_, baseline_, rows_);
}

std::string SequentialRounds::describe() const {
  std::ostringstream out;
  out << "sequential design: up to " << design_.max_seeds << " seeds in " << design_.rounds << " rounds (";
  for (size_t k = 0; k < design_.seeds.size(); ++k) out << (k ? ", " : "") << design_.seeds[k];
  out << " seeds); alpha 0.05 / " << rows_ << " per comparison, spent O'Brien-Fleming-like (Lan-DeMets): a round "
      << "decides where p <";
  for (size_t k = 0; k < design_.nominal_p.size(); ++k) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s %.3g", k ? "," : "", design_.nominal_p[k]);
    out << buf;
  }
  out << "; " << compared_.size() << " comparisons";
  return out.str();
}

void SequentialRounds::read_looks(engine::Store& store) {
  for (const auto& l : store.looks()) outcome_[{l.round, l.claim, l.task}] = l.outcome;
}

std::vector<SequentialRounds::Comparison> SequentialRounds::open_at(size_t k) const {
  const auto round = static_cast<int64_t>(k);
  std::vector<Comparison> open;
  for (const auto& c : compared_) {
    if (outcome_.count({round, c.claim, c.task})) continue;
    const auto before = outcome_.find({round - 1, c.claim, c.task});
    if (k == 0 || (before != outcome_.end() && before->second == "continue")) open.push_back(c);
  }
  return open;
}

int SequentialRounds::current_round() const {
  for (size_t k = 0; k < rounds(); ++k)
    if (!open_at(k).empty()) return static_cast<int>(k);
  return -1;
}

std::vector<engine::RunSpec> SequentialRounds::runs_of(size_t k) const {
  std::set<std::pair<std::string, std::string>> needed;  // (variant, task)
  for (const auto& c : open_at(k)) {
    needed.insert({c.a, c.task});
    needed.insert({c.b, c.task});
  }
  const std::set<int64_t> round_seeds(seeds_.begin(), seeds_.begin() + design_.seeds[k]);
  std::vector<engine::RunSpec> out;
  for (const auto& r : matrix_.runs)
    if (round_seeds.count(r.seed) && (k == 0 || needed.count({r.variant, r.task}))) out.push_back(r);
  return out;
}

void SequentialRounds::look(size_t k, const std::string& db, const report::OperatorCatalog& catalog,
                            engine::Store& design_store, std::ostream& out) {
  const auto open = open_at(k);
  report::Summary s = report::summarize(db, catalog);
  // Only the round's seeds: a store may hold more (another comparison's
  // later rounds), and a look tests what its round planned.
  const std::set<int64_t> round_seeds(seeds_.begin(), seeds_.begin() + design_.seeds[k]);
  for (auto& t : s.tasks)
    for (auto& v : t.variants)
      v.runs.erase(std::remove_if(v.runs.begin(), v.runs.end(),
                                  [&](const report::RunRow* r) { return !round_seeds.count(r->seed); }),
                   v.runs.end());
  const report::ClaimsTable table = report::evaluate_claims(claims_, s, baseline_);
  const bool last = k + 1 == rounds();
  for (const auto& c : open) {
    const report::TaskTest* row = nullptr;
    for (const auto& claim : table.claims)
      if (claim.id == c.claim)
        for (const auto& t : claim.tasks)
          if (t.task == c.task) row = &t;
    report::Look look;
    look.nominal = design_.nominal_p[k];
    look.outcome = last ? report::LookOutcome::Final : report::LookOutcome::Continue;
    if (row && row->test) look = report::look_at(design_, k, *row->test);
    const int64_t seeds = row && row->test ? (row->test->paired ? row->test->n_a : std::min(row->n_a, row->n_b)) : 0;
    const engine::SequentialLookRecord l{
        static_cast<int64_t>(k),        c.claim, c.task, seeds, look.p, look.nominal, look.conditional_power,
        report::to_string(look.outcome)};
    design_store.record_look(l);
    outcome_[{l.round, l.claim, l.task}] = l.outcome;
    char line[512];
    std::snprintf(line, sizeof line, "  %s on %s: %lld seeds, p %s %.3g (boundary %.3g): %s\n", c.claim.c_str(),
                  c.task.c_str(), static_cast<long long>(seeds), std::isfinite(look.p) ? "=" : "n/a",
                  std::isfinite(look.p) ? look.p : 0.0, look.nominal, l.outcome.c_str());
    out << line;
  }
}

std::string SequentialRounds::summary() const {
  std::map<std::string, int> counts;  // each comparison's latest outcome
  for (const auto& c : compared_)
    for (int64_t k = static_cast<int64_t>(rounds()) - 1; k >= 0; --k)
      if (const auto it = outcome_.find({k, c.claim, c.task}); it != outcome_.end()) {
        ++counts[it->second];
        break;
      }
  return "design done: " + std::to_string(counts["decided"]) + " decided, " + std::to_string(counts["futile"]) +
         " futile, " + std::to_string(counts["final"]) + " at the last round";
}

}  // namespace chiar::cli
