#include "claims.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/suggest.h"
#include "engine/toml_values.h"

namespace chiar::report {
namespace {

// What a claim may measure, and how the report writes it.
struct MetricInfo {
  const char* name;
  double scale;      // stored value -> shown value
  const char* format;  // printf format of the shown value
  const char* unit;    // after a reduction's values
};

const MetricInfo kMetrics[] = {
    {"token_ppl", 1, "%.2f", ""},
    {"word_ppl", 1, "%.2f", ""},
    {"bits_per_byte", 1, "%.4f", ""},
    {"accuracy", 100, "%.2f%%", ""},
    {"attention_gflops", 1, "%.4f", " GFLOPs per sequence"},
    {"total_gflops", 1, "%.4f", " GFLOPs per sequence"},
    {"share", 100, "%.1f%%", ""},
};

const MetricInfo* metric_info(const std::string& name) {
  for (const auto& m : kMetrics)
    if (name == m.name) return &m;
  return nullptr;
}

const char* const kKinds[] = {"compare", "reduction", "share"};
const char* const kRoles[] = {"cheap_mixing", "intermediate_mixing", "global_mixing"};
const char* const kKeys[] = {"id",        "text",      "kind",     "task",  "family",   "variants", "metric",
                             "better",    "paper",     "reduction", "tolerance", "operator", "role", "threshold"};
constexpr const char* kBaseline = "$baseline";

OperatorRole role_of(const std::string& name) {
  if (name == "cheap_mixing") return OperatorRole::CheapMixing;
  if (name == "global_mixing") return OperatorRole::GlobalMixing;
  return OperatorRole::IntermediateMixing;
}

template <class Names>
std::vector<std::string> names_of(const Names& names) {
  return std::vector<std::string>(std::begin(names), std::end(names));
}

[[noreturn]] void fail(const toml::node& at, const std::string& key, const std::string& what) {
  throw UserError(toml_where(at) + ": key '" + key + "': " + what);
}

// Variant names defined by the files `file` includes, and theirs.
void collect_variants(const std::string& file, const toml::table& root, std::set<std::string>& variants,
                      std::vector<std::string>& chain) {
  if (const toml::node* v = root.get("variants"); v && v->is_table())
    for (const auto& [name, value] : *v->as_table()) variants.insert(std::string(name.str()));
  const toml::node* inc = root.get("include");
  if (!inc) return;
  const toml::array* list = inc->as_array();
  if (!list) fail(*inc, "include", "expected a list of file names");
  const auto dir = boost::filesystem::path(file).parent_path();
  for (const auto& item : *list) {
    if (!item.is_string()) fail(item, "include", "expected a list of file names");
    const boost::filesystem::path name = item.as_string()->get();  // absolute, or relative to this file
    const std::string path = (name.is_absolute() ? name : dir / name).string();
    boost::system::error_code ec;
    if (!boost::filesystem::is_regular_file(path, ec)) fail(item, "include", "cannot open '" + path + "'");
    const std::string canonical = boost::filesystem::weakly_canonical(path).string();
    if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) fail(item, "include", "include cycle");
    chain.push_back(canonical);
    collect_variants(path, toml_parse_file(path), variants, chain);
    chain.pop_back();
  }
}

std::vector<std::string> strings(const toml::node& n, const std::string& key) {
  std::vector<std::string> out;
  if (n.is_string()) return {n.as_string()->get()};
  const toml::array* a = n.as_array();
  if (!a || a->empty()) fail(n, key, "expected a string or a non-empty list of strings");
  for (const auto& item : *a) {
    if (!item.is_string()) fail(item, key, "expected a string or a non-empty list of strings");
    out.push_back(item.as_string()->get());
  }
  return out;
}

double number(const toml::node& n, const std::string& key) {
  if (const auto i = n.as_integer()) return static_cast<double>(i->get());
  if (const auto f = n.as_floating_point()) return f->get();
  fail(n, key, "expected a number");
}

std::string text(const toml::node& n, const std::string& key) {
  if (!n.is_string()) fail(n, key, "expected a string");
  return n.as_string()->get();
}

ClaimSpec read_claim(const toml::table& t, const std::string& path, const std::set<std::string>& variants) {
  ClaimSpec c;
  c.where = toml_where(t);
  c.task = "*";
  const auto key = [&](const std::string& k) { return path + "." + k; };
  for (const auto& [k, v] : t)
    if (std::find(std::begin(kKeys), std::end(kKeys), k.str()) == std::end(kKeys))
      fail(v, key(std::string(k.str())), "unknown key" + engine::did_you_mean(std::string(k.str()), names_of(kKeys)));
  const auto required = [&](const char* k) -> const toml::node& {
    const toml::node* n = t.get(k);
    if (!n) throw UserError(c.where + ": key '" + key(k) + "': missing");
    return *n;
  };
  c.id = text(required("id"), key("id"));
  c.text = text(required("text"), key("text"));
  const toml::node& kind = required("kind");
  c.kind = text(kind, key("kind"));
  if (std::find(std::begin(kKinds), std::end(kKinds), c.kind) == std::end(kKinds))
    fail(kind, key("kind"), "unknown kind '" + c.kind + "'" + engine::did_you_mean(c.kind, names_of(kKinds)));
  if (const toml::node* n = t.get("task")) c.task = text(*n, key("task"));
  if (const toml::node* n = t.get("family")) {
    if (t.get("task")) fail(*n, key("family"), "a claim names a task or a family, not both");
    c.family = text(*n, key("family"));
  }

  const toml::node& vs = required("variants");
  c.variants = strings(vs, key("variants"));
  const size_t want = c.kind == "share" ? 1 : 2;
  if (c.variants.size() != want)
    fail(vs, key("variants"), "a " + c.kind + " claim names " + std::to_string(want) + " variant" +
                                  (want > 1 ? "s" : "") + ", found " + std::to_string(c.variants.size()));
  const std::vector<std::string> known(variants.begin(), variants.end());
  for (const auto& v : c.variants)
    if (v != kBaseline && !variants.count(v))
      fail(vs, key("variants"), "unknown variant '" + v + "'" +
                                    (known.empty() ? std::string(" (the file and its includes define no [variants])")
                                                   : engine::did_you_mean(v, known)));

  const toml::node& ms = required("metric");
  c.metrics = strings(ms, key("metric"));
  for (const auto& m : c.metrics) {
    if (!metric_info(m)) {
      std::vector<std::string> all;
      for (const auto& info : kMetrics) all.push_back(info.name);
      fail(ms, key("metric"), "unknown metric '" + m + "'" + engine::did_you_mean(m, all));
    }
    if ((m == "share") != (c.kind == "share"))
      fail(ms, key("metric"), c.kind == "share" ? "a share claim measures 'share'" : "only a share claim measures 'share'");
  }
  const toml::node& bs = required("better");
  c.better = strings(bs, key("better"));
  if (c.better.size() != c.metrics.size())
    fail(bs, key("better"), "expected one direction per metric (" + std::to_string(c.metrics.size()) + "), found " +
                                std::to_string(c.better.size()));
  for (const auto& b : c.better)
    if (b != "lower" && b != "higher") fail(bs, key("better"), "expected \"lower\" or \"higher\", found '" + b + "'");

  if (const toml::node* p = t.get("paper")) {
    const toml::array* a = p->as_array();
    if (!a) fail(*p, key("paper"), "expected a list of numbers");
    for (const auto& item : *a) c.paper.push_back(number(item, key("paper")));
  }
  // Keys that belong to one kind only.
  const auto only = [&](const char* k, const std::string& kind_of_key) {
    if (const toml::node* n = t.get(k); n && c.kind != kind_of_key)
      fail(*n, key(k), "only a " + kind_of_key + " claim takes it");
  };
  for (const char* k : {"reduction", "tolerance"}) only(k, "reduction");
  for (const char* k : {"operator", "role", "threshold"}) only(k, "share");
  if (c.kind == "reduction") {
    c.reduction = number(required("reduction"), key("reduction"));
    c.tolerance = number(required("tolerance"), key("tolerance"));
  }
  if (c.kind == "share") {
    const toml::node* op = t.get("operator");
    const toml::node* role = t.get("role");
    if (!op == !role) throw UserError(c.where + ": key '" + key("operator") + "': a share claim names an operator or a role");
    if (op) c.op = text(*op, key("operator"));
    if (role) {
      c.role = text(*role, key("role"));
      if (std::find(std::begin(kRoles), std::end(kRoles), c.role) == std::end(kRoles))
        fail(*role, key("role"), "unknown role '" + c.role + "'" + engine::did_you_mean(c.role, names_of(kRoles)));
    }
    c.threshold = number(required("threshold"), key("threshold"));
  }
  return c;
}

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

std::string shown(const MetricInfo& m, double value) { return fmt(m.format, value * m.scale); }

bool is_pattern(const std::string& task) { return task.find_first_of("*?[") != std::string::npos; }

bool matches(const std::string& pattern, const std::string& task) {
  return fnmatch(pattern.c_str(), task.c_str(), 0) == 0;
}

// Whether a claim speaks about a task: by its family when it names one,
// else by the task name or glob.
bool about(const ClaimSpec& c, const std::string& task, const std::string& family) {
  if (!c.family.empty()) return family == c.family;
  return is_pattern(c.task) ? matches(c.task, task) : task == c.task;
}

// How the report names a task a claim is about: with the family it stands
// for, so that a CPU-scale corpus standing in for the paper's says so.
std::string task_label(const ClaimSpec& c, const std::string& task) {
  return c.family.empty() ? task : task + " (family: " + c.family + ")";
}

// What a claim about no measured task lacks.
std::string needs(const ClaimSpec& c, const std::string& a, const std::string& b) {
  if (!c.family.empty()) return "needs " + a + " and " + b + " on a task of family '" + c.family + "'";
  return "needs " + a + " and " + b + (is_pattern(c.task) ? " on one task" : " on task " + c.task);
}

// A variant's test metric per seed (the best-validation checkpoint), for
// the finished runs that report it.
std::map<int64_t, double> per_seed(const VariantSummary& v, const std::string& metric) {
  std::map<int64_t, double> out;
  for (const RunRow* r : v.runs) {
    if (metric == "attention_gflops") out[r->seed] = r->attn_fwd / 1e9;
    else if (metric == "total_gflops") out[r->seed] = r->total_fwd / 1e9;
    else if (const auto it = r->test_best.find(metric); it != r->test_best.end()) out[r->seed] = it->second;
  }
  return out;
}

std::vector<double> values(const std::map<int64_t, double>& by_seed) {
  std::vector<double> out;
  for (const auto& [seed, value] : by_seed) out.push_back(value);
  return out;
}

// The runs of a variant on a task that give it no value (diverged, failed or
// unfinished), e.g. "chiar_soft 2 diverged, 1 unfinished"; "" for none. Only
// finished runs are compared, so a variant judged on its survivors says so.
std::string left_out(const Summary& s, const std::string& task, const std::string& variant) {
  int diverged = 0, failed = 0, unfinished = 0;
  for (const RunRow* r : s.problems) {  // every run not done
    if (r->task != task || r->variant != variant) continue;
    if (r->status == engine::RunStatus::Diverged) ++diverged;
    else if (r->status == engine::RunStatus::Failed) ++failed;
    else ++unfinished;
  }
  std::string out;
  const auto add = [&](int n, const char* what) {
    if (n > 0) out += (out.empty() ? variant + " " : ", ") + std::to_string(n) + " " + what;
  };
  add(diverged, "diverged");
  add(failed, "failed");
  add(unfinished, "unfinished");
  return out;
}

// Both sides' values over the seeds both finished, aligned by seed.
std::pair<std::vector<double>, std::vector<double>> shared_seeds(const std::map<int64_t, double>& x,
                                                                 const std::map<int64_t, double>& y) {
  std::pair<std::vector<double>, std::vector<double>> out;
  for (const auto& [seed, value] : x)
    if (const auto it = y.find(seed); it != y.end()) {
      out.first.push_back(value);
      out.second.push_back(it->second);
    }
  return out;
}

// "a beats b" on one task, by the first metric of the claim's list that a
// reports; nullopt when either variant has no finished run there.
std::optional<Comparison> compare_on(const Summary& s, const ClaimSpec& c, const std::string& task,
                                     const std::string& a, const std::string& b) {
  const VariantSummary* w = find(s, task, a);
  const VariantSummary* l = find(s, task, b);
  if (!w || !l) return std::nullopt;
  for (size_t i = 0; i < c.metrics.size(); ++i) {
    const auto x = per_seed(*w, c.metrics[i]);
    if (x.empty()) continue;
    const auto y = per_seed(*l, c.metrics[i]);
    if (y.empty()) return std::nullopt;
    Comparison out;
    out.task = task_label(c, task);
    out.a = a;
    out.b = b;
    out.metric = c.metrics[i];
    out.lower_better = c.better[i] == "lower";
    out.n_a = static_cast<int>(x.size());
    out.n_b = static_cast<int>(y.size());
    out.mean_a = stat_of(values(x)).mean;
    out.mean_b = stat_of(values(y)).mean;
    for (const std::string& side : {a, b})
      if (const std::string missing = left_out(s, task, side); !missing.empty())
        out.left_out += (out.left_out.empty() ? "" : "; ") + missing;
    if (out.n_a >= kMinSeedsPerSide && out.n_b >= kMinSeedsPerSide) {
      // A seed fixes both variants' initialisation and data order, so the
      // test is paired over the seeds both finished when there are enough:
      // what the seed alone explains cancels, and a seed one variant lost
      // (diverged, failed) leaves the other's run out too. Else Welch's t.
      const auto [shared_x, shared_y] = shared_seeds(x, y);
      out.test = static_cast<int>(shared_x.size()) >= kMinSeedsPerSide ? paired_difference(shared_x, shared_y)
                                                                       : welch_difference(values(x), values(y));
      out.p_adjusted = out.test->p;
    }
    return out;
  }
  return std::nullopt;
}

constexpr double kAlpha = 0.05;

// A comparison's verdict once its p-value is adjusted.
std::string decide(const Comparison& c) {
  if (!c.test) return "not enough seeds";
  const Difference& d = *c.test;
  const bool below = d.hi < 0, above = d.lo > 0;
  if ((!below && !above) || c.p_adjusted >= kAlpha) return "inconclusive";
  return below == c.lower_better ? "holds" : "does not hold";
}

std::string p_text(double p) { return p < 0.001 ? "p < 0.001" : fmt("p = %.3f", p); }

// One comparison as the report states it, e.g. "wikitext103: chiar_dct_attn
// 32.00 vs baseline 62.00 (3 and 3 seeds); difference -30.00, 95% CI
// [-31.20, -28.80], paired by seed, p < 0.001 (Holm, 5 tests), d_z = -12.10".
std::string describe(const Comparison& c, size_t tests) {
  const MetricInfo& m = *metric_info(c.metric);
  std::string out = c.task + ": " + c.a + " " + shown(m, c.mean_a) + " vs " + c.b + " " + shown(m, c.mean_b) +
                    fmt(" (%.0f and %.0f seeds", c.n_a, c.n_b);
  if (!c.left_out.empty()) out += "; left out: " + c.left_out;
  if (!c.test) return out + fmt("; a verdict needs %.0f per side)", kMinSeedsPerSide);
  const Difference& d = *c.test;
  const std::string unit = m.scale == 100 ? " pp" : "";  // percentages differ by percentage points
  out += fmt("); difference %+.2f", d.diff * m.scale) + unit +
         fmt(", 95%% CI [%+.2f, %+.2f]", d.lo * m.scale, d.hi * m.scale) +
         (!d.paired                                  ? ", Welch's t, "
          : d.n_a == c.n_a && d.n_b == c.n_b ? ", paired by seed, "
                                               : fmt(", paired by seed over the %.0f both finished, ", d.n_a)) +
         p_text(c.p_adjusted);
  if (tests > 1) out += fmt(" (Holm, %.0f tests)", static_cast<double>(tests));
  if (std::isnan(d.effect)) return out + (d.paired ? ", d_z n/a (no spread)" : ", g n/a (no spread)");
  return out + fmt(d.paired ? ", d_z = %+.2f" : ", g = %+.2f", d.effect);
}

// Whether our difference (a - b) points the way the paper's values do.
std::string direction_of(const ClaimSpec& spec, const Claim& claim) {
  if (spec.paper.size() != 2 || claim.comparisons.empty()) return "";
  int agree = 0, disagree = 0;
  for (const auto& c : claim.comparisons) {
    const double ours = c.mean_a - c.mean_b, theirs = spec.paper[0] - spec.paper[1];
    if (ours == 0 || theirs == 0) continue;
    ((ours > 0) == (theirs > 0) ? agree : disagree) += 1;
  }
  if (agree + disagree == 0) return "";
  return disagree == 0 ? "agrees" : agree == 0 ? "disagrees" : "mixed";
}

// The claim's verdict and text from its comparisons, after Holm: one task
// decides alone; over a pattern every task must be tested and agree.
void conclude(Claim& claim, size_t tests) {
  if (claim.comparisons.empty()) return;
  std::vector<std::string> verdicts;
  for (auto& c : claim.comparisons) {
    c.verdict = decide(c);
    claim.measured += (claim.measured.empty() ? "" : "; ") + describe(c, tests);
    if (c.verdict != "not enough seeds") verdicts.push_back(c.verdict);
  }
  if (verdicts.size() < claim.comparisons.size()) {
    claim.verdict = "not enough seeds";
    return;
  }
  const bool same = std::all_of(verdicts.begin(), verdicts.end(), [&](const std::string& v) { return v == verdicts[0]; });
  claim.verdict = same ? verdicts[0] : "inconclusive";
}

// A FLOP reduction on one task, executed and analytic, with the one sentence
// that explains a gap: "wikitext103: -58.1% executed (1.8790 -> 0.7870
// GFLOPs per sequence; 3 and 3 seeds), -62.9% for a sparse execution of the
// 37.1% of routed-layer tokens attention got; the gap is attention computed
// densely for every position".
std::string reduction_on(const Summary& s, const ClaimSpec& c, const std::string& task, const VariantSummary& x,
                         const VariantSummary& y) {
  const MetricInfo& m = *metric_info(c.metrics.front());
  const auto vx = per_seed(x, c.metrics.front()), vy = per_seed(y, c.metrics.front());
  const double ex = stat_of(values(vx)).mean, ey = stat_of(values(vy)).mean;
  const double executed = ey > 0 ? 100.0 * (1.0 - ex / ey) : 0;
  std::string out = task_label(c, task) + fmt(": %.1f%% executed (", -executed) + shown(m, ey) + " -> " + shown(m, ex) + m.unit +
                    fmt("; %.0f and %.0f seeds", static_cast<double>(vy.size()), static_cast<double>(vx.size()));
  if (static_cast<int>(std::min(vx.size(), vy.size())) < kMinSeedsPerSide)
    return out + fmt("; a verdict needs %.0f per side)", kMinSeedsPerSide);
  out += ")";
  if (c.metrics.front() != "attention_gflops") return out;
  // The analytic count: what a sparse execution of the routed share needs.
  std::vector<double> sparse_x, sparse_y, share;
  for (const RunRow* r : x.runs) {
    sparse_x.push_back(r->attn_fwd_sparse);
    double routed = 0;
    for (const auto& [op, value] : r->final_share)
      if (s.operators.traits(op).attention_flops) routed += value;
    if (!r->final_share.empty()) share.push_back(routed);
  }
  for (const RunRow* r : y.runs) sparse_y.push_back(r->attn_fwd_sparse);
  const double sy = stat_of(sparse_y).mean;
  if (!(sy > 0)) return out;
  const double sparse = 100.0 * (1.0 - stat_of(sparse_x).mean / sy);
  out += fmt(", %.1f%% for a sparse execution", -sparse);
  if (!share.empty()) out += fmt(" of the %.1f%% of routed-layer tokens attention got", 100 * stat_of(share).mean);
  const double gap_to_claim = std::abs(executed - c.reduction);
  if (gap_to_claim <= c.tolerance) return out;
  // Which of the two explains the distance from the claim.
  if (std::abs(sparse - c.reduction) <= c.tolerance)
    return out + fmt("; the %.1f points to the claim are attention computed densely for every position "
                     "(dense routed execution)", gap_to_claim);
  return out + fmt("; the claim's %.1f%% needs a different routed share: the share drifted from the one "
                   "the claim assumes", c.reduction);
}

}  // namespace

std::vector<ClaimSpec> load_claims(const std::string& file) {
  boost::system::error_code ec;
  if (!boost::filesystem::is_regular_file(file, ec))
    throw UserError(file + ": no such claims file (chiar report takes one with --claims FILE)");
  const toml::table root = toml_parse_file(file);
  for (const auto& [k, v] : root)
    if (k.str() != "include" && k.str() != "claims")
      fail(v, std::string(k.str()), "unknown key" + engine::did_you_mean(std::string(k.str()), {"claims", "include"}));
  std::set<std::string> variants;
  std::vector<std::string> chain{boost::filesystem::weakly_canonical(file).string()};
  collect_variants(file, root, variants, chain);
  std::vector<ClaimSpec> out;
  const toml::node* claims = root.get("claims");
  if (!claims) return out;
  const toml::array* list = claims->as_array();
  if (!list || !list->is_array_of_tables()) fail(*claims, "claims", "expected [[claims]] tables");
  std::set<std::string> ids;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = "claims[" + std::to_string(i) + "]";
    out.push_back(read_claim(*list->get(i)->as_table(), path, variants));
    if (!ids.insert(out.back().id).second)
      fail(*list->get(i)->as_table()->get("id"), path + ".id", "claim '" + out.back().id + "' appears twice");
  }
  return out;
}

std::string default_claims_file() {
  const std::string relative = "configs/claims.toml";
  boost::system::error_code ec;
  if (boost::filesystem::is_regular_file(relative, ec)) return relative;
  const auto prefix = boost::dll::program_location(ec).parent_path().parent_path();
  if (ec) return relative;
  // build/chiar in the source tree; <prefix>/bin/chiar once installed.
  for (const auto& candidate : {prefix / relative, prefix / "share/chiar" / relative})
    if (boost::filesystem::is_regular_file(candidate, ec)) return candidate.string();
  return relative;
}

namespace {

// A claim's measurements; compare claims get their verdicts in conclude().
Claim measure_claim(const ClaimSpec& c, const Summary& s, const std::string& baseline) {
  const auto variant = [&](size_t i) { return c.variants[i] == kBaseline ? baseline : c.variants[i]; };
  const std::string a = variant(0);
  Claim out{c.id, c.text, "", "", "not enough seeds", "", {}};
  for (double p : c.paper) out.paper += (out.paper.empty() ? "" : " vs ") + fmt("%g", p);

  if (c.kind == "compare") {
    const std::string b = variant(1);
    for (const auto& t : s.tasks)
      if (about(c, t.task, t.family))
        if (auto one = compare_on(s, c, t.task, a, b)) out.comparisons.push_back(std::move(*one));
    if (out.comparisons.empty()) out.measured = needs(c, a, b);
    return out;
  }

  if (c.kind == "reduction") {
    const std::string b = variant(1);
    int holds = 0, total = 0, thin = 0;
    for (const auto& t : s.tasks) {
      if (!about(c, t.task, t.family)) continue;
      const VariantSummary* x = find(s, t.task, a);
      const VariantSummary* y = find(s, t.task, b);
      if (!x || !y) continue;
      const auto vx = per_seed(*x, c.metrics.front()), vy = per_seed(*y, c.metrics.front());
      if (vx.empty() || vy.empty()) continue;
      const std::string part = reduction_on(s, c, t.task, *x, *y);
      out.measured += (out.measured.empty() ? "" : "; ") + part;
      if (static_cast<int>(std::min(vx.size(), vy.size())) < kMinSeedsPerSide) {
        ++thin;
        continue;
      }
      const double cut = 100.0 * (1.0 - stat_of(values(vx)).mean / stat_of(values(vy)).mean);
      ++total;
      holds += std::abs(cut - c.reduction) <= c.tolerance;
    }
    // Like a comparison over a pattern: every task, or no verdict.
    if (total && !thin) out.verdict = holds == total ? "holds" : "does not hold";
    else if (!thin) out.measured = needs(c, a, b);
    return out;
  }

  // "share": the operator's (or role's) share over the routed layers at the
  // end of training, averaged over the variant's finished runs.
  std::vector<double> shares;
  std::vector<std::string> seen;  // operators counted, for the text
  for (const auto& r : s.runs) {
    if (r.variant != a || r.status != engine::RunStatus::Done || !about(c, r.task, r.family)) continue;
    double share = 0;
    bool any = false;
    for (const auto& [op, value] : r.final_share) {
      const bool counted = c.op.empty() ? s.operators.traits(op).role == role_of(c.role) : op == c.op;
      if (!counted) continue;
      share += value;
      any = true;
      if (std::find(seen.begin(), seen.end(), op) == seen.end()) seen.push_back(op);
    }
    if (any) shares.push_back(share);
  }
  if (shares.empty()) {
    out.measured = "needs finished " + a + " runs";
    return out;
  }
  const bool enough = static_cast<int>(shares.size()) >= kMinSeedsPerSide;
  std::sort(seen.begin(), seen.end(), [&](const std::string& x, const std::string& y) {
    return s.operators.order(x) != s.operators.order(y) ? s.operators.order(x) < s.operators.order(y) : x < y;
  });
  std::string who;
  for (const auto& op : seen) who += (who.empty() ? "" : " + ") + s.operators.traits(op).display_name;
  const Stat st = stat_of(shares);
  const MetricInfo& share = *metric_info("share");
  out.measured = "mean " + who + " share in routed layers at the end of training: " + shown(share, st.mean) +
                 fmt(" over %.0f runs", st.n);
  if (!enough) return out;
  // Like a comparison, a share is judged by its interval, not its mean: the
  // claim holds when the runs' whole 95% interval lies on its side of the
  // threshold, fails when it lies wholly on the other.
  const double lo = st.mean - st.ci95, hi = st.mean + st.ci95;
  out.measured += ", 95% CI [" + shown(share, lo) + ", " + shown(share, hi) + "] against the claim's " +
                  shown(share, c.threshold);
  const bool lower = c.better.front() == "lower";
  if (lower ? hi < c.threshold : lo > c.threshold) out.verdict = "holds";
  else if (lower ? lo > c.threshold : hi < c.threshold) out.verdict = "does not hold";
  else out.verdict = "inconclusive";
  return out;
}

}  // namespace

Claim evaluate_claim(const ClaimSpec& c, const Summary& s, const std::string& baseline) {
  return evaluate_claims({c}, s, baseline).front();
}

std::vector<Claim> evaluate_claims(const std::vector<ClaimSpec>& claims, const Summary& s,
                                   const std::string& baseline) {
  std::vector<Claim> out;
  for (const auto& c : claims) out.push_back(measure_claim(c, s, baseline));
  // Holm over every comparison with a test, across all claims.
  std::vector<double> p;
  for (const auto& claim : out)
    for (const auto& comparison : claim.comparisons)
      if (comparison.test) p.push_back(comparison.test->p);
  const std::vector<double> adjusted = holm_adjusted(p);
  size_t next = 0;
  for (auto& claim : out)
    for (auto& comparison : claim.comparisons)
      if (comparison.test) comparison.p_adjusted = adjusted[next++];
  for (size_t i = 0; i < out.size(); ++i) {
    conclude(out[i], p.size());
    out[i].direction = direction_of(claims[i], out[i]);
  }
  return out;
}

}  // namespace chiar::report
