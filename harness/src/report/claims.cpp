#include "claims.h"

#include <cmath>
#include <cstdio>

namespace chiar::report {
namespace {

const VariantSummary* find(const Summary& s, const std::string& task, const std::string& variant) {
  for (const auto& t : s.tasks)
    if (t.task == task)
      for (const auto& v : t.variants)
        if (v.variant == variant) return &v;
  return nullptr;
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

// "a beats b" on one task by the main metric's mean.
Claim compare(const Summary& s, const std::string& claim, const std::string& task, const std::string& winner,
              const std::string& loser) {
  const VariantSummary* w = find(s, task, winner);
  const VariantSummary* l = find(s, task, loser);
  Claim c{claim, "", "not enough runs"};
  if (!w || !l) {
    c.measured = "needs " + winner + " and " + loser + " on task " + task;
    return c;
  }
  const bool lm = w->metric.count("token_ppl");
  const std::string key = lm ? "token_ppl" : "accuracy";
  if (!w->metric.count(key) || !l->metric.count(key)) return c;
  const Stat a = w->metric.at(key), b = l->metric.at(key);
  const double scale = lm ? 1.0 : 100.0;
  c.measured = task + ": " + winner + " " + fmt(lm ? "%.2f" : "%.2f%%", a.mean * scale) + " vs " + loser + " " +
               fmt(lm ? "%.2f" : "%.2f%%", b.mean * scale) + fmt(" (%.0f and %.0f seeds)", a.n, b.n);
  const bool better = lm ? a.mean < b.mean : a.mean > b.mean;
  c.verdict = better ? "holds" : "does not hold";
  return c;
}

}  // namespace

std::vector<Claim> evaluate_claims(const Summary& s, const std::string& base) {
  std::vector<Claim> out;
  out.push_back(compare(s, "WikiText-103: DCT+Attn beats full attention (val PPL 36.54 vs 66.62)", "wikitext103",
                        "chiar_dct_attn", base));
  out.push_back(compare(s, "WikiText-2: full attention beats DCT+Attn (PPL 75.19 vs 83.81)", "wikitext2", base,
                        "chiar_dct_attn"));
  out.push_back(compare(s, "IMDB: full attention edges DCT+Attn (84.96% vs 83.72%)", "imdb", base, "chiar_dct_attn"));
  out.push_back(compare(s, "Flat ListOps: full attention beats DCT+Attn by far (98.85% vs 63.35%)", "listops_flat",
                        base, "chiar_dct_attn"));

  // Attention FLOPs -62.5%: measured executed forward attention FLOPs.
  {
    Claim c{"DCT+Attn cuts attention FLOPs by 62.5% (1.879 -> 0.705 GFLOPs)", "", "not enough runs"};
    std::string measured;
    int holds = 0, total = 0;
    for (const auto& t : s.tasks) {
      const VariantSummary* d = find(s, t.task, "chiar_dct_attn");
      const VariantSummary* b = find(s, t.task, base);
      if (!d || !b || b->attn_gflops.mean <= 0) continue;
      const double cut = 100.0 * (1.0 - d->attn_gflops.mean / b->attn_gflops.mean);
      measured += (measured.empty() ? "" : "; ") + t.task + fmt(": %.1f%% (%.4f -> %.4f GFLOPs per sequence)", cut,
                                                                b->attn_gflops.mean, d->attn_gflops.mean);
      ++total;
      holds += std::abs(cut - 62.5) <= 5.0;
    }
    if (total) {
      c.measured = measured;
      c.verdict = holds == total ? "holds" : "does not hold";
    } else {
      c.measured = "needs chiar_dct_attn and " + base + " on one task";
    }
    out.push_back(c);
  }

  // Hard beats soft; DCT+Attn beats 3-operator hard: by majority over tasks.
  for (const auto& [claim, a, b] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"Hard (STE) routing beats soft routing", "chiar_hard", "chiar_soft"},
           {"DCT+Attn beats the 3-operator hard model", "chiar_dct_attn", "chiar_hard"}}) {
    Claim c{claim, "", "not enough runs"};
    int wins = 0, total = 0;
    for (const auto& t : s.tasks) {
      Claim one = compare(s, claim, t.task, a, b);
      if (one.verdict == "not enough runs") continue;
      ++total;
      wins += one.verdict == "holds";
      c.measured += (c.measured.empty() ? "" : "; ") + one.measured;
    }
    if (total) c.verdict = 2 * wins > total ? "holds" : "does not hold";
    else c.measured = "needs " + a + " and " + b + " on one task";
    out.push_back(c);
  }

  // Routing collapse: the learned hard router sends (almost) nothing to RBF.
  {
    Claim c{"Routing collapse: the hard router rejects RBF", "", "not enough runs"};
    std::vector<double> shares;
    for (const auto& r : s.runs)
      if (r.variant == "chiar_hard" && r.status == "done" && r.final_share.count("rbf"))
        shares.push_back(r.final_share.at("rbf"));
    if (!shares.empty()) {
      const Stat st = stat_of(shares);
      c.measured = fmt("mean RBF share in routed layers at the end of training: %.1f%% over %.0f runs", 100 * st.mean, st.n);
      c.verdict = st.mean < 0.10 ? "holds" : "does not hold";
    } else {
      c.measured = "needs finished chiar_hard runs";
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace chiar::report
