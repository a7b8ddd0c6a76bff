#include "matrix.h"

#include <fnmatch.h>

#include <algorithm>
#include <boost/filesystem.hpp>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

#include "engine/config/option_table.h"
#include "engine/config/suggest.h"
#include "engine/runtime/device.h"
#include "chiar/error.h"
#include "chiar/random.h"

namespace chiar::engine {
namespace {

// A key a table may hold, with the kind of value it takes.
struct KeyKind {
  std::string key;
  OptionKind kind;
};

const std::vector<KeyKind> kMatrixKeys = {{"name", OptionKind::String},
                                          {"variants", OptionKind::Strings},
                                          {"tasks", OptionKind::Strings},
                                          {"seeds", OptionKind::Ints}};

template <class Options>
std::vector<KeyKind> key_kinds(const std::vector<OptionField<Options>>& fields) {
  std::vector<KeyKind> out;
  for (const auto& f : fields) out.push_back({f.key, f.kind});
  return out;
}
const std::vector<KeyKind>& model_keys() {
  static const std::vector<KeyKind> keys = key_kinds(model_option_fields());
  return keys;
}
const std::vector<KeyKind>& train_keys() {
  static const std::vector<KeyKind> keys = key_kinds(train_option_fields());
  return keys;
}

// The files of the matrix being read, as parsed (with source positions):
// merging tables copies nodes without their positions, so errors found after
// the merge are located by key path here.
thread_local const std::vector<toml::table>* t_sources = nullptr;

// The node at key path `path` in the last of `files` that sets it (later
// files override earlier ones), or null.
const toml::node* node_in(const std::vector<toml::table>& files, const std::string& path) {
  for (auto it = files.rbegin(); it != files.rend(); ++it)
    if (const toml::node* n = it->at_path(path).node()) return n;
  return nullptr;
}

std::string where(const toml::node& node, const std::string& path) {
  if (node.source().path) return toml_where(node);
  if (t_sources)
    if (const toml::node* n = node_in(*t_sources, path)) return toml_where(*n);
  return "<matrix>";
}

[[noreturn]] void fail_at(const toml::node& node, const std::string& path, const std::string& what) {
  throw UserError(where(node, path) + ": key '" + path + "': " + what);
}

// Checks every key of a table against `keys`; `allowed` lists extra keys
// handled by the caller.
void check_fields(const toml::table& t, const std::vector<KeyKind>& keys, const std::string& path,
                  const std::vector<std::string>& allowed = {}) {
  std::vector<std::string> known(allowed);
  for (const auto& k : keys) known.push_back(k.key);
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    auto f = std::find_if(keys.begin(), keys.end(), [&](const KeyKind& f) { return key == f.key; });
    if (f == keys.end()) fail_at(v, path + "." + key, "unknown key" + did_you_mean(key, known));
    if (!has_kind(v, f->kind)) fail_at(v, path + "." + key, std::string("expected ") + kind_name(f->kind));
  }
}

// dst <- src, tables merged key by key, other values replaced.
void merge_into(toml::table& dst, const toml::table& src) {
  for (const auto& [k, v] : src) {
    toml::node* existing = dst.get(k);
    if (existing && existing->is_table() && v.is_table())
      merge_into(*existing->as_table(), *v.as_table());
    else
      dst.insert_or_assign(k, v);
  }
}

toml::table load_with_includes(const std::string& file, std::vector<std::string>& chain,
                               std::vector<toml::table>& sources) {
  const std::string canonical = boost::filesystem::weakly_canonical(file).string();
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) throw UserError(file + ": include cycle");
  boost::system::error_code ec;
  if (!boost::filesystem::is_regular_file(file, ec)) throw UserError(file + ": cannot open the file");
  chain.push_back(canonical);
  toml::table root = toml_parse_file(file);
  toml::table merged;
  if (const toml::node* inc = root.get("include")) {
    if (!has_kind(*inc, OptionKind::Strings)) fail_at(*inc, "include", "expected a list of file names");
    const auto dir = boost::filesystem::path(file).parent_path();
    for (const auto& item : *inc->as_array()) {
      const boost::filesystem::path name = item.as_string()->get();  // absolute, or relative to this file
      const std::string included = (name.is_absolute() ? name : dir / name).string();
      // Named at the entry that includes it: the file alone says not where.
      if (!boost::filesystem::is_regular_file(included, ec)) fail_at(item, "include", "cannot open '" + included + "'");
      if (std::find(chain.begin(), chain.end(), boost::filesystem::weakly_canonical(included).string()) != chain.end())
        fail_at(item, "include", "'" + included + "' includes this file again (an include cycle)");
      merge_into(merged, load_with_includes(included, chain, sources));
    }
    root.erase("include");
  }
  merge_into(merged, root);
  sources.push_back(std::move(root));
  chain.pop_back();
  return merged;
}

const toml::table& table_at(const toml::table& root, const char* path) {
  static const toml::table empty;
  const toml::node* n = root.at_path(path).node();
  return n && n->is_table() ? *n->as_table() : empty;
}

int64_t integer(const toml::table& t, const char* key) { return t.get(key)->as_integer()->get(); }
std::string string(const toml::table& t, const char* key) { return t.get(key)->as_string()->get(); }

const Locate kLocate = [](const toml::node& node, const std::string& path) { return where(node, path); };

// What a resolved run table says of its run: names, seed, task, options
// (unchecked); `task_path` locates the task's options in errors. Throws
// RefusedValue for a model value its type refuses (an unknown execution).
RunSpec read_run_table(const toml::table& run, const std::string& task_path) {
  RunSpec spec;
  spec.matrix = string(run, "matrix");
  spec.variant = string(run, "variant");
  spec.seed = integer(run, "seed");
  const toml::table& task = *run.get("task")->as_table();
  spec.task = string(task, "name");
  spec.task_config.name = spec.task;
  spec.task_config.plugin = string(task, "plugin");
  try {
    spec.task_config.params = toml_params(*task.get("params")->as_table(), task_path);
  } catch (const RefusedOptionValue& e) {
    throw RefusedValue("task." + e.key().substr(task_path.size() + 1), e.problem());
  }
  spec.model = read_options(*run.get("model")->as_table(), model_option_fields(), "model", kLocate);
  spec.model.seed(static_cast<uint64_t>(spec.seed));
  spec.train = read_options(*run.get("train")->as_table(), train_option_fields(), "train", kLocate);
  return spec;
}

// A sweep point's value as its run's name shows it (",layers=dct+attn"): a
// scalar as written, a list as its items joined by '+' ("[]" when empty), and
// a table, which has no short form, as its 1-based place among the axis's
// values ("#2"): the points of an axis get names of their own.
std::string value_text(const toml::node& v, size_t place) {
  std::ostringstream s;
  if (v.is_string())
    s << v.as_string()->get();
  else if (v.is_integer())
    s << v.as_integer()->get();
  else if (v.is_floating_point())
    s << v.as_floating_point()->get();
  else if (v.is_boolean())
    s << (v.as_boolean()->get() ? "true" : "false");
  else if (v.is_array() && v.as_array()->empty())
    s << "[]";
  else if (v.is_array()) {
    const toml::array& items = *v.as_array();
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string item = value_text(*items.get(i), place);
      if (item.rfind('#', 0) == 0) return "#" + std::to_string(place + 1);  // a table inside
      s << (i ? "+" : "") << item;
    }
  } else
    s << "#" << place + 1;
  return s.str();
}

// nan, inf or -inf where `value` (or a list or table in it) holds one, else "".
std::string non_finite_in(const toml::node& value) {
  if (const auto* f = value.as_floating_point()) return non_finite_name(f->get());
  if (const auto* a = value.as_array())
    for (const auto& item : *a)
      if (std::string found = non_finite_in(item); !found.empty()) return found;
  if (const auto* t = value.as_table())
    for (const auto& [k, item] : *t)
      if (std::string found = non_finite_in(item); !found.empty()) return found;
  return "";
}

// A --set or sweep assignment into the resolved run.
void apply(toml::table& run, const std::string& path, const toml::node& value, const std::string& origin) {
  const auto dot = path.find('.');
  const std::string section = path.substr(0, dot), key = dot == std::string::npos ? "" : path.substr(dot + 1);
  if (key.empty() || (section != "model" && section != "train" && section != "task" && section != "router"))
    throw UserError(origin + ": '" + path + "': expected model.KEY, train.KEY, task.KEY or router.KEY");
  // No option means anything by nan or inf, and range checks such as v > 0
  // would let inf through.
  if (const std::string found = non_finite_in(value); !found.empty())
    throw UserError(origin + ": '" + path + "': expected finite numbers, found " + found);
  if (section == "task" || section == "router") {
    // Plugin options hold what Params holds; a list of strings or a table
    // (which a --set written as TOML may give) is refused here, at its origin.
    try {
      toml_to_value(value, path);
    } catch (const UserError&) {
      throw UserError(origin + ": '" + path + "': expected a boolean, number, string or list of numbers");
    }
    if (section == "task")
      run.get("task")->as_table()->get("params")->as_table()->insert_or_assign(key, value);
    else
      run.get("model")->as_table()->get("router_params")->as_table()->insert_or_assign(key, value);
  } else {
    const auto& keys = section == "model" ? model_keys() : train_keys();
    std::vector<std::string> known;
    for (const auto& k : keys) known.push_back(k.key);
    auto f = std::find_if(keys.begin(), keys.end(), [&](const KeyKind& k) { return key == k.key; });
    if (f == keys.end()) throw UserError(origin + ": '" + path + "': unknown key" + did_you_mean(key, known));
    if (!has_kind(value, f->kind)) throw UserError(origin + ": '" + path + "': expected " + kind_name(f->kind));
    run.get(section)->as_table()->insert_or_assign(key, value);
  }
}

// A --set value written as TOML, as the table { v = VALUE }.
toml::table toml_assignment(const std::string& path, const std::string& text) {
  try {
    return toml::parse("v = " + text, "--set " + path);
  } catch (const toml::parse_error& e) {
    throw UserError("--set " + path + ": " + text + " is not a TOML value (" + std::string(e.description()) +
                    "); quote the strings of a list: model.layers=[\"dct\", \"dct|attn\"]");
  }
}

// A --set value as the table { v = VALUE }. Written as a plugin option is
// (true/false, an integer, a number, a list of numbers, else a bare word,
// taken as a string), it is read as Params reads one, so that a --set keeps
// its value's type and its runs their hashes; a quoted string, a list that
// holds strings, or an inline table is read as TOML.
toml::table node_from_assignment(const std::string& path, const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  const char lead = first == std::string::npos ? '\0' : text[first];
  if (lead == '"' || lead == '\'' || lead == '{') return toml_assignment(path, text);
  Params p;
  try {
    p = Params::from_assignments({"v=" + text});
  } catch (const UserError&) {
    return toml_assignment(path, text);  // a list of strings, say
  }
  toml::table t;
  put_value(t, "v", p.values().at("v"));
  return t;
}

}  // namespace

RunSpec run_spec_from_toml(const std::string& text) {
  toml::table run;
  try {
    run = toml::parse(text);
  } catch (const toml::parse_error& e) {
    throw UserError(std::string("stored run spec: ") + std::string(e.description()));
  }
  RunSpec spec;
  try {
    spec = read_run_table(run, "task");
  } catch (const RefusedValue& e) {
    throw UserError("stored run spec: key '" + e.path() + "': " + e.what());
  }
  spec.resolved_toml = text;
  return spec;
}

std::string RunSpec::name() const {
  std::string n = variant + "/" + task + "/seed=" + std::to_string(seed);
  for (const auto& [axis, value] : sweep) n += "," + axis + "=" + value;
  return n;
}

namespace {

// Key and kind checks on each file as written, where every node knows its
// position.
void check_schema(const std::vector<toml::table>& sources) {
  for (const auto& src : sources) {
    check_fields(src, {}, "", {"matrix", "model", "train", "sweep", "variants", "tasks"});
    check_fields(table_at(src, "matrix"), kMatrixKeys, "matrix");
    check_fields(table_at(src, "model"), model_keys(), "model");
    check_fields(table_at(src, "train"), train_keys(), "train");
    for (const auto& [name, v] : table_at(src, "variants")) {
      const std::string path = "variants." + std::string(name.str());
      if (!v.is_table()) fail_at(v, path, "expected a table");
      check_fields(*v.as_table(), model_keys(), path, {"description", "model", "train"});
      check_fields(table_at(*v.as_table(), "model"), model_keys(), path + ".model");
      check_fields(table_at(*v.as_table(), "train"), train_keys(), path + ".train");
    }
    for (const auto& [name, v] : table_at(src, "tasks")) {
      const std::string path = "tasks." + std::string(name.str());
      if (!v.is_table()) fail_at(v, path, "expected a table");
      check_fields(table_at(*v.as_table(), "model"), model_keys(), path + ".model");
      check_fields(table_at(*v.as_table(), "train"), train_keys(), path + ".train");
    }
  }
}

const toml::table& matrix_table(const toml::table& root, const std::string& file) {
  const toml::node* node = root.get("matrix");
  if (!node || !node->is_table()) throw UserError(file + ": no [matrix] table");
  const toml::table& mt = *node->as_table();
  for (const char* required : {"name", "variants", "tasks"})
    if (!mt.get(required)) throw UserError(where(mt, "matrix") + ": [matrix] needs '" + required + "'");
  return mt;
}

std::vector<int64_t> seeds_of(const toml::table& mt) {
  const toml::node* s = mt.get("seeds");
  if (!s) return {0};
  std::vector<int64_t> seeds;
  for (const auto& item : *s->as_array()) {
    // Seeds feed unsigned generators: -1 would run as 2^64 - 1.
    if (item.as_integer()->get() < 0) fail_at(item, "matrix.seeds", "a seed must not be negative");
    seeds.push_back(item.as_integer()->get());
  }
  if (seeds.empty()) fail_at(*s, "matrix.seeds", "expected at least one seed");
  return seeds;
}

// One [sweep] axis: "model.d_model" and its values.
using SweepAxis = std::pair<std::string, const toml::array*>;

std::vector<SweepAxis> sweep_axes(const toml::table& root) {
  std::vector<SweepAxis> axes;
  for (const auto& [section, table] : table_at(root, "sweep")) {
    if (!table.is_table()) fail_at(table, "sweep." + std::string(section.str()), "expected model.KEY = [values]");
    for (const auto& [key, values] : *table.as_table()) {
      const std::string path = std::string(section.str()) + "." + std::string(key.str());
      if (!values.is_array() || values.as_array()->empty())
        fail_at(values, "sweep." + path, "expected a non-empty list of values");
      axes.emplace_back(path, values.as_array());
    }
  }
  return axes;
}

// --set path=value, each value as a node under the key "v".
std::vector<std::pair<std::string, toml::table>> set_assignments(const MatrixOptions& options) {
  std::vector<std::pair<std::string, toml::table>> sets;
  for (const auto& s : options.set) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw UserError("--set: expected key=value, found '" + s + "'");
    sets.emplace_back(s.substr(0, eq), node_from_assignment(s.substr(0, eq), s.substr(eq + 1)));
  }
  return sets;
}

// The [variants.NAME] or [tasks.NAME] table a matrix list names.
const toml::table& definition(const toml::table& root, const toml::node& name, const std::string& section,
                              const char* what) {
  const std::string n = name.as_string()->get();
  // A '.' would split the name in the key-path lookup below (and in
  // `--table tasks.NAME`), and a '/' or a glob character in a run's name
  // (variant/task/seed=N, which --only matches) would split it or match by
  // accident.
  if (n.empty() ||
      n.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
    fail_at(name, "matrix." + section,
            std::string("a ") + what +
                " name takes letters, digits, '_' and '-' (it is part of key paths and of "
                "run names), found '" +
                n + "'");
  const toml::node* def = root.at_path(section + "." + n).node();
  if (!def || !def->is_table()) {
    std::vector<std::string> known;
    for (const auto& [k, v] : table_at(root, section.c_str())) known.push_back(std::string(k.str()));
    fail_at(name, "matrix." + section, std::string("no ") + what + " '" + n + "' is defined" + did_you_mean(n, known));
  }
  return *def->as_table();
}

// One variant on one task before sweeps, seeds and --set: defaults <-
// [model]/[train] <- the variant <- the task's overrides.
toml::table resolve_run(const toml::table& root, const Matrix& out, const std::string& variant, const toml::table& vt,
                        const std::string& task, const toml::table& tt) {
  toml::table model = option_defaults(model_option_fields()), train = option_defaults(train_option_fields());
  merge_into(model, table_at(root, "model"));
  merge_into(train, table_at(root, "train"));
  for (const auto& [k, v] : vt)
    if (k.str() != "description" && k.str() != "model" && k.str() != "train") {
      if (v.is_table())
        merge_into(*model.get(k)->as_table(), *v.as_table());
      else
        model.insert_or_assign(k, v);
    }
  merge_into(model, table_at(vt, "model"));
  merge_into(train, table_at(vt, "train"));
  merge_into(model, table_at(tt, "model"));
  merge_into(train, table_at(tt, "train"));
  TaskTable task_table;
  try {
    task_table = read_task_table(tt, task, "tasks." + task,
                                 [&](const toml::node& n) { return where(n, "tasks." + task + ".plugin"); });
  } catch (const RefusedOptionValue& e) {
    // The merged table's nodes have lost their positions; the file's have not.
    const toml::node* at = t_sources ? node_in(*t_sources, e.key()) : nullptr;
    throw UserError((at ? toml_where(*at) : where(tt, "tasks." + task)) + ": key '" + e.key() + "': " + e.problem());
  }
  return toml::table{
      {"matrix", out.name},
      {"variant", variant},
      {"task", toml::table{{"name", task}, {"plugin", task_table.plugin}, {"params", task_table.options}}},
      {"model", model},
      {"train", train}};
}

// Where a run's value of an option was set, as an error's prefix:
// "--set train.steps", "m.toml:12:9: key 'variants.fast.train.lr'"; ""
// for a default (Matrix::origin_of).
using ValueOrigin = std::function<std::string(const std::string& path)>;

// The spec of a fully resolved run table: options read and checked, the
// canonical JSON and its hash. A refused value is reported where it was set
// (`origin_of`), else at the variant (`vwhere`).
RunSpec spec_of(const toml::table& run, const std::string& vwhere, const ValueOrigin& origin_of) {
  const std::string variant = string(run, "variant"), task = string(*run.get("task")->as_table(), "name");
  const std::string at_variant = vwhere + ": variant '" + variant + "' on task '" + task + "': ";
  auto refused = [&](const std::string& path, const std::string& what) {
    const std::string origin = origin_of(path);
    return UserError((origin.empty() ? at_variant + "key '" + path + "'" : origin) + ": " + what);
  };
  RunSpec spec;
  try {
    spec = read_run_table(run, "tasks." + task);
  } catch (const RefusedValue& e) {
    throw refused(e.path(), e.what());
  }
  if (const OptionProblem bad = check_options(spec.model, model_option_fields(), "model"); !bad.path.empty())
    throw refused(bad.path, bad.what);
  if (const OptionProblem bad = check_options(spec.train, train_option_fields(), "train"); !bad.path.empty())
    throw refused(bad.path, bad.what);
  // Refused here as well as where the model is built, so that --dry-run and
  // `chiar slurm` refuse it before anything is listed or submitted.
  if (spec.model.layers().empty())
    throw UserError(at_variant + model::missing_layers_message("`chiar plugins` lists the operators"));
  if (const std::string m = model::missing_router_message(spec.model, "`chiar plugins` lists the routers"); !m.empty())
    throw UserError(at_variant + m);
  if (const std::string m = model::model_shape_problem(spec.model); !m.empty()) {
    // Named at the heads where they were set, else at the width, else the variant.
    std::string origin = origin_of("model.n_heads");
    if (origin.empty()) origin = origin_of("model.d_model");
    throw UserError((origin.empty() ? at_variant : origin + ": ") + m);
  }
  std::ostringstream json, text;
  // The keys the option tables leave out of hashes: train.device (where a
  // run trains, like the thread count on the command line) and old defaults
  // at the values every run stored before their options existed had.
  toml::table hashed = run;
  erase_unhashed(hashed, "model", spec.model, model_option_fields());
  erase_unhashed(hashed, "train", spec.train, train_option_fields());
  json << toml::json_formatter{hashed};
  text << toml::toml_formatter{run};
  spec.canonical = json.str();
  spec.resolved_toml = text.str();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(spec.canonical)));
  spec.hash = hex;
  return spec;
}

// Keeps the runs of this shard that --only matches; counts every run so
// shards partition the whole expansion.
struct RunFilter {
  const MatrixOptions& options;
  int64_t index = 0;
  bool only_matched = false;  // whether --only named any run, in whichever shard
  bool keep(const RunSpec& spec) {
    const bool in_shard = index++ % options.shard_count == options.shard_index - 1;
    const bool named = options.only.empty() || fnmatch(options.only.c_str(), spec.name().c_str(), 0) == 0;
    only_matched = only_matched || named;
    return in_shard && named;
  }
};

// precision = "auto" made what it is on the run's device (--device, else
// train.device), before the run is hashed: the hash names the arithmetic.
// A value of another kind is left for spec_of to refuse at its key.
void resolve_precision_of(toml::table& run, const MatrixOptions& options) {
  toml::table& train = *run["train"].as_table();
  const auto* precision = train["precision"].as_string();
  const auto* device = train["device"].as_string();
  if (!precision || !device) return;
  const std::string name = options.device.empty() ? device->get() : options.device;
  train.insert_or_assign("precision", resolve_precision(precision->get(), name, options.host_only));
}

// The key path `path` where one of the matrix's files sets it, as
// "file:line:column: key 'PATH'", or "".
std::string located_key(const std::vector<toml::table>& files, const std::string& path) {
  const toml::node* n = node_in(files, path);
  return n ? toml_where(*n) + ": key '" + path + "'" : "";
}

}  // namespace

struct MatrixSources {
  std::vector<toml::table> files;      // as parsed, includes first
  std::vector<std::string> set_paths;  // the keys of --set, which apply last
};

namespace {

// Matrix::origin_of for a run of `variant` on `task` whose sweep axes set
// `swept`.
std::string value_origin(const MatrixSources& sources, const std::string& variant, const std::string& task,
                         const std::vector<std::string>& swept, const std::string& path) {
  // A --set of a table (model.operators={...}) sets every key in it.
  for (const auto& set : sources.set_paths)
    if (path == set || path.rfind(set + ".", 0) == 0) return "--set " + set;
  // So does a swept table (model.router_params = [{...}, {...}]).
  for (const auto& axis : swept)
    if (path == axis || path.rfind(axis + ".", 0) == 0) return located_key(sources.files, "sweep." + axis);
  const auto dot = path.find('.');
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  std::vector<std::string> tables;
  if (section == "task") {
    tables = {"tasks." + task};  // a task's options stand at the top of its table
  } else {
    tables = {"tasks." + task + "." + section, "variants." + variant + "." + section};
    if (section == "model") tables.push_back("variants." + variant);  // so may a variant's model keys
    tables.push_back(section);
  }
  for (const auto& table : tables)
    if (std::string at = located_key(sources.files, table + "." + key); !at.empty()) return at;
  return "";
}

// Every point of the sweep grid, each seed: the runs of one variant on one task.
void expand(const toml::table& base, const std::vector<SweepAxis>& axes, const std::vector<int64_t>& seeds,
            const std::vector<std::pair<std::string, toml::table>>& sets, const MatrixOptions& options,
            const MatrixSources& sources, const std::string& vwhere, RunFilter& filter, std::vector<RunSpec>& runs) {
  const std::string variant = string(base, "variant"), task = string(*base.get("task")->as_table(), "name");
  std::vector<size_t> pick(axes.size(), 0);
  while (true) {
    for (int64_t seed : seeds) {
      toml::table run = base;
      run.insert_or_assign("seed", seed);
      std::vector<std::pair<std::string, std::string>> sweep;
      std::vector<std::string> swept;
      for (size_t a = 0; a < axes.size(); ++a) {
        const toml::node& value = *axes[a].second->get(pick[a]);
        apply(run, axes[a].first, value, where(value, "sweep." + axes[a].first));
        sweep.emplace_back(axes[a].first.substr(axes[a].first.find('.') + 1), value_text(value, pick[a]));
        swept.push_back(axes[a].first);
      }
      for (const auto& [path, value] : sets) apply(run, path, *value.get("v"), "--set " + path);
      resolve_precision_of(run, options);
      RunSpec spec = spec_of(
          run, vwhere, [&](const std::string& path) { return value_origin(sources, variant, task, swept, path); });
      spec.sweep = std::move(sweep);
      spec.swept = std::move(swept);
      if (filter.keep(spec)) runs.push_back(std::move(spec));
    }
    size_t a = 0;
    while (a < axes.size() && ++pick[a] == axes[a].second->size()) pick[a++] = 0;
    if (a == axes.size()) break;
  }
}

}  // namespace

Matrix load_matrix(const std::string& file, const MatrixOptions& options) {
  // Checked here, not only where a run resolves it, so that --dry-run
  // refuses what a run would.
  if (const std::string problem = device_name_problem(options.device); !options.device.empty() && !problem.empty())
    throw UserError("--device: \"" + options.device + "\" " + problem);
  std::vector<std::string> chain;
  auto sources = std::make_shared<MatrixSources>();
  const toml::table root = load_with_includes(file, chain, sources->files);
  struct Scope {
    explicit Scope(const std::vector<toml::table>* s) { t_sources = s; }
    ~Scope() { t_sources = nullptr; }
  } scope(&sources->files);
  check_schema(sources->files);
  const toml::table& mt = matrix_table(root, file);
  Matrix out;
  out.file = file;
  out.name = mt.get("name")->as_string()->get();
  // The default store is results/NAME.db: a '/' or a leading '.' would put
  // it elsewhere. Nothing else is refused: the name is part of every run's
  // hash, so a store made under any other name must stay resumable.
  if (out.name.empty() || out.name.front() == '.' || out.name.find('/') != std::string::npos)
    fail_at(*mt.get("name"), "matrix.name",
            "a matrix name may not contain '/' or begin with '.' (the default store is results/NAME.db), found '" +
                out.name + "'");
  const std::vector<int64_t> seeds = seeds_of(mt);
  const std::vector<SweepAxis> axes = sweep_axes(root);
  const auto sets = set_assignments(options);
  for (const auto& set : sets) sources->set_paths.push_back(set.first);

  for (const char* list : {"variants", "tasks"})
    if (mt.get(list)->as_array()->empty())
      fail_at(*mt.get(list), std::string("matrix.") + list, "expected at least one name");
  RunFilter filter{options};
  for (const auto& vnode : *mt.get("variants")->as_array()) {
    const std::string variant = vnode.as_string()->get();
    const toml::table& vt = definition(root, vnode, "variants", "variant");
    const std::string vwhere = where(vt, "variants." + variant);
    out.where["variants." + variant] = vwhere;
    for (const auto& tnode : *mt.get("tasks")->as_array()) {
      const std::string task = tnode.as_string()->get();
      const toml::table& tt = definition(root, tnode, "tasks", "task");
      out.where["tasks." + task] = where(tt, "tasks." + task);
      const size_t first = out.runs.size();
      expand(resolve_run(root, out, variant, vt, task, tt), axes, seeds, sets, options, *sources, vwhere, filter,
             out.runs);
      const std::string family = read_task_table(tt, task, "tasks." + task).family;
      for (size_t i = first; i < out.runs.size(); ++i) out.runs[i].task_family = family;
    }
  }
  // A glob that names no run is a mistyped name, not a finished matrix.
  if (!options.only.empty() && !filter.only_matched)
    throw UserError("--only '" + options.only + "': no run of " + file +
                    " has a matching name (VARIANT/TASK/seed=N; `chiar run " + file + " --dry-run` lists them)");
  out.sources = std::move(sources);
  return out;
}

std::string Matrix::origin_of(const RunSpec& run, const std::string& path) const {
  return sources ? value_origin(*sources, run.variant, run.task, run.swept, path) : "";
}

}  // namespace chiar::engine
