#include "seed_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace chiar::report {
namespace {

std::string fmt(const char* f, double a, double b = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

const ClaimSpec* spec_of(const std::vector<ClaimSpec>& claims, const std::string& id) {
  for (const auto& c : claims)
    if (c.id == id) return &c;
  return nullptr;
}

// The row's plan from its pilot test.
SeedPlanRow plan_row(const Claim& claim, const TaskTest& t, const ClaimSpec& c, const SeedPlan& plan) {
  SeedPlanRow row;
  row.claim = claim.id;
  row.task = t.task;
  const double scale = metric_info(t.metric)->scale;
  if (std::isfinite(c.effect))
    row.effect = c.effect / scale;
  else if (std::isfinite(c.effect_ratio) && std::isfinite(t.mean_b))
    row.effect = (c.effect_ratio - 1) * t.mean_b;
  if (std::isfinite(c.margin)) row.margin = c.margin / scale;
  row.equivalence = c.kind == "equivalent";
  if (!t.test) {
    row.why = "not enough seeds in the pilot";
    return row;
  }
  const Difference& d = *t.test;
  row.test = d.paired ? "paired" : "Welch";
  row.pilot_seeds = d.paired ? d.n_a : std::min(d.n_a, d.n_b);
  row.sd = d.sd_a;
  row.sd_b = d.sd_b;
  if (!(d.se > 0) || !std::isfinite(d.se)) {
    row.why = "no spread in the pilot (runs identical across seeds): nothing to plan from";
    return row;
  }
  const auto seeds = [&](double effect) {
    return seeds_for_power(effect, d.paired, row.sd, row.sd_b, plan.alpha, plan.power, plan.max_seeds);
  };
  if (std::isfinite(row.effect)) row.seeds_effect = seeds(row.effect);
  if (row.equivalence)
    row.seeds_margin =
        seeds_for_equivalence(row.margin, d.paired, row.sd, row.sd_b, plan.alpha, plan.power, plan.max_seeds);
  else if (std::isfinite(row.margin))
    row.seeds_margin = seeds(row.margin);
  if (row.seeds_effect < 0 && row.seeds_margin < 0) row.why = "the claim states no effect or margin";
  return row;
}

std::string seeds_text(int seeds, int max_seeds) {
  if (seeds < 0) return "-";
  return seeds == 0 ? "> " + std::to_string(max_seeds) : std::to_string(seeds);
}

}  // namespace

SeedPlan plan_seeds(const ClaimsTable& pilot, const std::vector<ClaimSpec>& claims, int tests,
                    const SeedPlanOptions& options) {
  SeedPlan plan;
  plan.tests = std::max(1, tests);
  plan.alpha = 0.05 / plan.tests;
  plan.power = options.power;
  plan.max_seeds = options.max_seeds;
  for (const auto& claim : pilot.claims) {
    if (!tests_a_difference(claim.kind)) continue;
    const ClaimSpec* c = spec_of(claims, claim.id);
    if (!c) continue;
    for (const auto& t : claim.tasks) {
      SeedPlanRow row = plan_row(claim, t, *c, plan);
      // The margin, where stated, is the smallest effect that matters: it decides.
      const int wanted = row.seeds_margin >= 0 ? row.seeds_margin : row.seeds_effect;
      if (wanted == 0)
        plan.beyond.push_back(row.claim + " on " + row.task);
      else if (wanted > 0)
        plan.seeds = std::max(plan.seeds, wanted);
      plan.rows.push_back(std::move(row));
    }
  }
  return plan;
}

std::string plan_table(const SeedPlan& plan) {
  std::ostringstream out;
  out << "Seeds for " << fmt("%.0f%%", 100 * plan.power) << " power at alpha 0.05 / " << plan.tests << " = "
      << fmt("%.4g", plan.alpha) << " per comparison (Bonferroni over the report's " << plan.tests
      << " rows), two-sided; for an equivalent claim each of its two one-sided tests at that alpha\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-36s %-16s %-7s %6s %12s %12s %7s %12s %7s\n", "claim", "task", "test", "pilot",
                "sd", "effect", "seeds", "margin", "seeds");
  out << line;
  for (const auto& r : plan.rows) {
    const auto num = [](double v) { return std::isfinite(v) ? fmt("%.4g", v) : std::string("-"); };
    std::snprintf(line, sizeof line, "%-36s %-16s %-7s %6d %12s %12s %7s %12s %7s", r.claim.c_str(), r.task.c_str(),
                  r.test.empty() ? "-" : r.test.c_str(), r.pilot_seeds,
                  r.test == "Welch" ? (num(r.sd) + "/" + num(r.sd_b)).c_str() : num(r.sd).c_str(),
                  num(r.effect).c_str(), seeds_text(r.seeds_effect, plan.max_seeds).c_str(), num(r.margin).c_str(),
                  seeds_text(r.seeds_margin, plan.max_seeds).c_str());
    out << line << (r.why.empty() ? "" : "  (" + r.why + ")")
        << (r.equivalence && r.why.empty() ? "  (equivalence: two one-sided tests, a true difference of 0)" : "")
        << "\n";
  }
  out << "\n";
  if (plan.seeds > 0)
    out << "Planned: " << plan.seeds
        << " seeds (the most a planned comparison needs; the margin decides where given).\n";
  else
    out << "Nothing planned: no comparison has a pilot spread and a stated effect or margin.\n";
  for (const auto& b : plan.beyond)
    out << "Beyond " << plan.max_seeds << " seeds: " << b << " (raise --max-seeds, or accept less power there).\n";
  return out.str();
}

std::string plan_toml(const SeedPlan& plan, const std::string& pilot) {
  std::ostringstream out;
  out << "# chiar plan: seeds for " << fmt("%.0f%%", 100 * plan.power) << " power at alpha 0.05 / " << plan.tests
      << " per comparison (Bonferroni), from the pilot store " << pilot << ".\n"
      << "# Written before the main run; the number of seeds is not to be raised after a look.\n";
  for (const auto& r : plan.rows) {
    out << "# " << r.claim << " on " << r.task << ": ";
    if (!r.why.empty() && r.seeds_effect < 0 && r.seeds_margin < 0) {
      out << r.why << "\n";
      continue;
    }
    out << r.test << ", sd " << fmt("%.4g", r.sd) << (r.test == "Welch" ? fmt(" and %.4g", r.sd_b) : "") << " over "
        << r.pilot_seeds << " pilot seeds";
    if (r.seeds_effect >= 0)
      out << "; the paper's effect " << fmt("%+.4g", r.effect) << " -> " << seeds_text(r.seeds_effect, plan.max_seeds);
    if (r.seeds_margin >= 0)
      out << (r.equivalence ? "; equivalence within +-" : "; margin ") << fmt("%.4g", r.margin) << " -> "
          << seeds_text(r.seeds_margin, plan.max_seeds)
          << (r.equivalence ? " (two one-sided tests, a true difference of 0)" : "");
    out << "\n";
  }
  if (plan.seeds == 0) return out.str() + "# nothing planned: the matrix's seeds are unchanged\n";
  out << "[matrix]\nseeds = [";
  for (int i = 0; i < plan.seeds; ++i) out << (i ? ", " : "") << i;
  out << "]\n";
  return out.str();
}

}  // namespace chiar::report
