#include "claims.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <set>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/config/suggest.h"
#include "engine/config/toml_values.h"

namespace chiar::report {
namespace {

const MetricInfo kMetrics[] = {
    {"token_ppl", 1, 2, "", false},
    {"word_ppl", 1, 2, "", false},
    {"bits_per_byte", 1, 4, "", false},
    {"accuracy", 100, 2, "", false},
    {"attention_gflops", 1, 4, " GFLOPs per sequence", true},
    {"total_gflops", 1, 4, " GFLOPs per sequence", true},
    {"share", 100, 1, "", false},
};

const char* const kKinds[] = {"compare", "equivalent", "reduction", "share"};
const char* const kRoles[] = {"cheap_mixing", "intermediate_mixing", "global_mixing"};
const char* const kKeys[] = {"id",        "text",      "kind",     "task",   "family",       "variants",
                             "metric",    "better",    "paper",    "effect", "effect_ratio", "margin",
                             "reduction", "tolerance", "operator", "role",   "threshold"};
constexpr const char* kBaseline = "$baseline";

template <class Names>
std::vector<std::string> names_of(const Names& names) {
  return std::vector<std::string>(std::begin(names), std::end(names));
}

[[noreturn]] void fail(const toml::node& at, const std::string& key, const std::string& what) {
  throw UserError(engine::toml_where(at) + ": key '" + key + "': " + what);
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
    collect_variants(path, engine::toml_parse_file(path), variants, chain);
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

// A compare or equivalent claim's `margin`.
void read_margin(const toml::node& m, const std::string& key, ClaimSpec& c) {
  c.margin = number(m, key);
  if (!(c.margin > 0)) fail(m, key, "expected a margin above 0");
}

// A compare claim's `effect` or `effect_ratio`, and `margin`.
void read_effect(const toml::table& t, const std::string& path, ClaimSpec& c) {
  const auto key = [&](const std::string& k) { return path + "." + k; };
  const toml::node* effect = t.get("effect");
  const toml::node* ratio = t.get("effect_ratio");
  if (effect && ratio)
    fail(*ratio, key("effect_ratio"), "a claim states its effect as a difference or a ratio, not both");
  if (effect) c.effect = number(*effect, key("effect"));
  if (ratio) {
    c.effect_ratio = number(*ratio, key("effect_ratio"));
    if (!(c.effect_ratio > 0)) fail(*ratio, key("effect_ratio"), "expected a ratio above 0");
  }
  if (const toml::node* m = t.get("margin")) read_margin(*m, key("margin"), c);
}

// Reads one [[claims]] table, one group of keys at a time; every error at
// the key's file:line:column.
class ClaimReader {
 public:
  ClaimReader(const toml::table& t, const std::string& path) : t_(t), path_(path) {
    c_.where = engine::toml_where(t);
    c_.task = "*";
  }

  ClaimSpec read(const std::set<std::string>& variants) {
    refuse_unknown_keys();
    read_identity();
    read_variants(variants);
    read_metrics();
    read_kind_keys();
    return c_;
  }

 private:
  std::string key(const std::string& k) const { return path_ + "." + k; }

  const toml::node& required(const char* k) const {
    const toml::node* n = t_.get(k);
    if (!n) throw UserError(c_.where + ": key '" + key(k) + "': missing");
    return *n;
  }

  void refuse_unknown_keys() const {
    for (const auto& [k, v] : t_)
      if (std::find(std::begin(kKeys), std::end(kKeys), k.str()) == std::end(kKeys))
        fail(v, key(std::string(k.str())), "unknown key" + engine::did_you_mean(std::string(k.str()), names_of(kKeys)));
  }

  // id, text, kind, and the task or family it is about.
  void read_identity() {
    c_.id = text(required("id"), key("id"));
    c_.text = text(required("text"), key("text"));
    const toml::node& kind = required("kind");
    c_.kind = text(kind, key("kind"));
    if (std::find(std::begin(kKinds), std::end(kKinds), c_.kind) == std::end(kKinds))
      fail(kind, key("kind"), "unknown kind '" + c_.kind + "'" + engine::did_you_mean(c_.kind, names_of(kKinds)));
    if (const toml::node* n = t_.get("task")) c_.task = text(*n, key("task"));
    if (const toml::node* n = t_.get("family")) {
      if (t_.get("task")) fail(*n, key("family"), "a claim names a task or a family, not both");
      c_.family = text(*n, key("family"));
    }
  }

  // As many variants as the kind compares, each defined by the matrix.
  void read_variants(const std::set<std::string>& variants) {
    const toml::node& vs = required("variants");
    c_.variants = strings(vs, key("variants"));
    const size_t want = c_.kind == "share" ? 1 : 2;
    if (c_.variants.size() != want)
      fail(vs, key("variants"),
           "a " + c_.kind + " claim names " + std::to_string(want) + " variant" + (want > 1 ? "s" : "") + ", found " +
               std::to_string(c_.variants.size()));
    const std::vector<std::string> known(variants.begin(), variants.end());
    for (const auto& v : c_.variants)
      if (v != kBaseline && !variants.count(v))
        fail(vs, key("variants"),
             "unknown variant '" + v + "'" +
                 (known.empty() ? std::string(" (the file and its includes define no [variants])")
                                : engine::did_you_mean(v, known)));
  }

  // The metrics and which direction of each is better.
  void read_metrics() {
    const toml::node& ms = required("metric");
    c_.metrics = strings(ms, key("metric"));
    for (const auto& m : c_.metrics) {
      if (!metric_info(m)) {
        std::vector<std::string> all;
        for (const auto& info : kMetrics) all.push_back(info.name);
        fail(ms, key("metric"), "unknown metric '" + m + "'" + engine::did_you_mean(m, all));
      }
      if ((m == "share") != (c_.kind == "share"))
        fail(ms, key("metric"),
             c_.kind == "share" ? "a share claim measures 'share'" : "only a share claim measures 'share'");
    }
    if (c_.kind == "equivalent") {
      if (const toml::node* b = t_.get("better")) fail(*b, key("better"), "an equivalent claim has no better side");
      c_.better.assign(c_.metrics.size(), "");
      return;
    }
    const toml::node& bs = required("better");
    c_.better = strings(bs, key("better"));
    if (c_.better.size() != c_.metrics.size())
      fail(bs, key("better"),
           "expected one direction per metric (" + std::to_string(c_.metrics.size()) + "), found " +
               std::to_string(c_.better.size()));
    for (const auto& b : c_.better)
      if (b != "lower" && b != "higher") fail(bs, key("better"), "expected \"lower\" or \"higher\", found '" + b + "'");
  }

  // The paper's figures, and the keys that belong to one kind only.
  void read_kind_keys() {
    if (const toml::node* p = t_.get("paper")) {
      const toml::array* a = p->as_array();
      if (!a) fail(*p, key("paper"), "expected a list of numbers");
      for (const auto& item : *a) c_.paper.push_back(number(item, key("paper")));
    }
    // A key that only the given kinds take: "only a compare or an equivalent claim takes it".
    const auto only = [&](const char* k, std::initializer_list<const char*> kinds) {
      const toml::node* n = t_.get(k);
      if (!n || std::find(kinds.begin(), kinds.end(), c_.kind) != kinds.end()) return;
      std::string which;
      for (const char* kind : kinds)
        which += std::string(which.empty() ? "" : " or ") + (std::strchr("aeiou", kind[0]) ? "an " : "a ") + kind;
      fail(*n, key(k), "only " + which + " claim takes it");
    };
    for (const char* k : {"effect", "effect_ratio"}) only(k, {"compare"});
    only("margin", {"compare", "equivalent"});
    for (const char* k : {"reduction", "tolerance"}) only(k, {"reduction"});
    if (c_.kind == "compare") read_effect(t_, path_, c_);
    if (c_.kind == "equivalent") read_margin(required("margin"), key("margin"), c_);
    for (const char* k : {"operator", "role", "threshold"}) only(k, {"share"});
    if (c_.kind == "reduction") read_reduction();
    if (c_.kind == "share") read_share();
  }

  void read_reduction() {
    c_.reduction = number(required("reduction"), key("reduction"));
    const toml::node& tolerance = required("tolerance");
    c_.tolerance = number(tolerance, key("tolerance"));
    if (!(c_.tolerance >= 0)) fail(tolerance, key("tolerance"), "expected 0 or more percentage points");
  }

  void read_share() {
    const toml::node* op = t_.get("operator");
    const toml::node* role = t_.get("role");
    if (!op == !role)
      throw UserError(c_.where + ": key '" + key("operator") + "': a share claim names an operator or a role");
    if (op) c_.op = text(*op, key("operator"));
    if (role) {
      c_.role = text(*role, key("role"));
      if (std::find(std::begin(kRoles), std::end(kRoles), c_.role) == std::end(kRoles))
        fail(*role, key("role"), "unknown role '" + c_.role + "'" + engine::did_you_mean(c_.role, names_of(kRoles)));
    }
    const toml::node& threshold = required("threshold");
    c_.threshold = number(threshold, key("threshold"));
    if (!(c_.threshold > 0 && c_.threshold < 1))
      fail(threshold, key("threshold"), "expected a fraction between 0 and 1");
  }

  const toml::table& t_;
  std::string path_;
  ClaimSpec c_;
};

ClaimSpec read_claim(const toml::table& t, const std::string& path, const std::set<std::string>& variants) {
  return ClaimReader(t, path).read(variants);
}

}  // namespace

const MetricInfo* metric_info(const std::string& name) {
  for (const auto& m : kMetrics)
    if (name == m.name) return &m;
  return nullptr;
}

std::vector<ClaimSpec> load_claims(const std::string& file) {
  boost::system::error_code ec;
  if (!boost::filesystem::is_regular_file(file, ec))
    throw UserError(file + ": no such claims file (chiar report takes one with --claims FILE)");
  const toml::table root = engine::toml_parse_file(file);
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

}  // namespace chiar::report
