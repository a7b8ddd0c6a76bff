// chiar plan: seeds chosen before the main run, from a pilot store.
#include <algorithm>
#include <iostream>
#include <map>

#include "chiar/error.h"
#include "chiar/registry.h"
#include "commands.h"
#include "output_file.h"
#include "engine/config/matrix.h"
#include "engine/store/merge.h"
#include "report/claims.h"
#include "report/seed_plan.h"
#include "report/summary.h"

namespace chiar::cli {

int run_plan(const Global& g, const PlanArgs& a) {
  const std::string claims_file = a.claims.empty() ? report::default_claims_file() : a.claims;
  const auto claims = report::load_claims(claims_file);
  const engine::Matrix matrix = engine::load_matrix(a.config);
  std::map<std::string, std::string> tasks;  // the main run's tasks -> family
  for (const auto& r : matrix.runs) tasks[r.task] = r.task_family;
  // The rows the main run's report will test: every (claim, task) pair
  // but exact FLOP reductions.
  int rows = 0;
  for (const auto& c : claims)
    for (const auto& [task, family] : tasks)
      rows += report::claim_is_about(c, task, family) && report::row_is_tested(c);

  const engine::StoreView view(a.pilot);
  PluginRegistry registry;  // operator roles, for share claims
  registry.load_default(g.plugin_dirs);
  const report::Summary s = report::summarize(view.db(), report::OperatorCatalog(registry));
  report::ClaimsTable pilot = report::evaluate_claims(claims, s, a.baseline.empty() ? "baseline" : a.baseline);
  for (auto& claim : pilot.claims)  // only what the main run will hold
    claim.tasks.erase(std::remove_if(claim.tasks.begin(), claim.tasks.end(),
                                     [&](const report::TaskTest& t) { return !tasks.count(t.task); }),
                      claim.tasks.end());
  for (const auto& [task, family] : tasks) {
    bool in_pilot = false;
    for (const auto& t : s.tasks) in_pilot |= t.task == task;
    if (!in_pilot) std::cout << "No pilot runs on task " << task << ": its comparisons are not planned.\n";
  }

  const auto plan = report::plan_seeds(pilot, claims, rows, {a.power, a.max_seeds});
  std::cout << report::plan_table(plan);
  const std::string toml = report::plan_toml(plan, view.label());
  if (a.out.empty()) {
    std::cout << "\n" << toml;
    return 0;
  }
  write_output_file(a.out, toml);
  std::cout << "wrote " << a.out << "\n";
  return 0;
}

}  // namespace chiar::cli
