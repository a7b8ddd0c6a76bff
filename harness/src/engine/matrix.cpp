#include "matrix.h"

#include <fnmatch.h>

#include <algorithm>
#include <boost/filesystem.hpp>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

#include "../core/toml_values.h"
#include "chiar/error.h"
#include "chiar/random.h"

namespace chiar::engine {
namespace {

enum class Kind { Int, Number, String, Bool, Strings, Ints, Table };

struct Field {
  const char* name;
  Kind kind;
};

const std::vector<Field> kMatrixFields = {
    {"name", Kind::String}, {"variants", Kind::Strings}, {"tasks", Kind::Strings}, {"seeds", Kind::Ints}};
const std::vector<Field> kModelFields = {
    {"d_model", Kind::Int},         {"n_heads", Kind::Int},      {"ffn_mult", Kind::Int},
    {"dropout", Kind::Number},      {"layers", Kind::Strings},   {"router", Kind::String},
    {"router_params", Kind::Table}, {"operators", Kind::Table},  {"meta_router", Kind::String},
    {"execution", Kind::String}};
const std::vector<Field> kTrainFields = {
    {"steps", Kind::Int},          {"batch_size", Kind::Int},       {"grad_accum", Kind::Int},
    {"lr", Kind::Number},          {"min_lr_ratio", Kind::Number},  {"warmup", Kind::Int},
    {"weight_decay", Kind::Number}, {"beta1", Kind::Number},        {"beta2", Kind::Number},
    {"clip", Kind::Number},        {"eval_every", Kind::Int},       {"eval_batches", Kind::Int},
    {"eval_batch_size", Kind::Int}, {"checkpoint_every", Kind::Int}, {"calibration_batches", Kind::Int},
    {"threads", Kind::Int},        {"log_every", Kind::Int},        {"precision", Kind::String},
    {"fail_loss_above", Kind::Number}};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;
  for (const auto& k : known) {
    const size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  std::string all;
  for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
  return " (known: " + all + ")";
}

// The files of the matrix being read, as parsed (with source positions):
// merging tables copies nodes without their positions, so errors found after
// the merge are located by key path here.
thread_local const std::vector<toml::table>* t_sources = nullptr;

std::string where(const toml::node& node, const std::string& path) {
  if (node.source().path) return toml_where(node);
  if (t_sources)
    for (auto it = t_sources->rbegin(); it != t_sources->rend(); ++it)
      if (const toml::node* n = it->at_path(path).node()) return toml_where(*n);
  return "<matrix>";
}

[[noreturn]] void fail_at(const toml::node& node, const std::string& path, const std::string& what) {
  throw UserError(where(node, path) + ": key '" + path + "': " + what);
}

bool has_kind(const toml::node& n, Kind kind) {
  switch (kind) {
    case Kind::Int: return n.is_integer();
    case Kind::Number: return n.is_integer() || n.is_floating_point();
    case Kind::String: return n.is_string();
    case Kind::Bool: return n.is_boolean();
    case Kind::Table: return n.is_table();
    case Kind::Strings:
    case Kind::Ints: {
      if (!n.is_array()) return false;
      for (const auto& item : *n.as_array())
        if (kind == Kind::Strings ? !item.is_string() : !item.is_integer()) return false;
      return true;
    }
  }
  return false;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Int: return "an integer";
    case Kind::Number: return "a number";
    case Kind::String: return "a string";
    case Kind::Bool: return "a boolean";
    case Kind::Table: return "a table";
    case Kind::Strings: return "a list of strings";
    case Kind::Ints: return "a list of integers";
  }
  return "?";
}

// Checks every key of a table against fields; `allowed` lists extra keys
// handled by the caller.
void check_fields(const toml::table& t, const std::vector<Field>& fields, const std::string& path,
                  const std::vector<std::string>& allowed = {}) {
  std::vector<std::string> known(allowed);
  for (const auto& f : fields) known.push_back(f.name);
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    auto f = std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return key == f.name; });
    if (f == fields.end()) fail_at(v, path + "." + key, "unknown key" + suggestion(key, known));
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
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end())
    throw UserError(file + ": include cycle");
  boost::system::error_code ec;
  if (!boost::filesystem::is_regular_file(file, ec)) throw UserError(file + ": cannot open the file");
  chain.push_back(canonical);
  toml::table root = toml_parse_file(file);
  toml::table merged;
  if (const toml::node* inc = root.get("include")) {
    if (!has_kind(*inc, Kind::Strings)) fail_at(*inc, "include", "expected a list of file names");
    const auto dir = boost::filesystem::path(file).parent_path();
    for (const auto& item : *inc->as_array()) {
      const boost::filesystem::path name = item.as_string()->get();  // absolute, or relative to this file
      merge_into(merged, load_with_includes((name.is_absolute() ? name : dir / name).string(), chain, sources));
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

toml::table model_defaults() {
  const ModelOptions d;
  toml::array layers;
  for (const auto& l : d.layers_) layers.push_back(l);
  return toml::table{{"d_model", d.d_model_},       {"n_heads", d.n_heads_},
                     {"ffn_mult", d.ffn_mult_},     {"dropout", d.dropout_},
                     {"layers", layers},            {"router", d.router_},
                     {"router_params", toml::table{}}, {"operators", toml::table{}},
                     {"meta_router", "none"},       {"execution", "auto"}};
}

toml::table train_defaults() {
  const TrainOptions d;
  return toml::table{{"steps", d.steps},           {"batch_size", d.batch_size},
                     {"grad_accum", d.grad_accum}, {"lr", d.lr},
                     {"min_lr_ratio", d.min_lr_ratio}, {"warmup", d.warmup},
                     {"weight_decay", d.weight_decay}, {"beta1", d.beta1},
                     {"beta2", d.beta2},           {"clip", d.clip},
                     {"eval_every", d.eval_every}, {"eval_batches", d.eval_batches},
                     {"eval_batch_size", d.eval_batch_size}, {"checkpoint_every", d.checkpoint_every},
                     {"calibration_batches", d.calibration_batches}, {"threads", d.threads},
                     {"log_every", d.log_every},   {"precision", d.precision},
                     {"fail_loss_above", d.fail_loss_above}};
}

void put_value(toml::table& t, const std::string& key, const Params::Value& v) {
  switch (v.index()) {
    case 0: t.insert_or_assign(key, std::get<bool>(v)); break;
    case 1: t.insert_or_assign(key, std::get<int64_t>(v)); break;
    case 2: t.insert_or_assign(key, std::get<double>(v)); break;
    case 3: t.insert_or_assign(key, std::get<std::string>(v)); break;
    default: {
      toml::array a;
      for (double x : std::get<std::vector<double>>(v)) a.push_back(x);
      t.insert_or_assign(key, a);
    }
  }
}

double number(const toml::table& t, const char* key) {
  const toml::node& n = *t.get(key);
  return n.is_integer() ? static_cast<double>(n.as_integer()->get()) : n.as_floating_point()->get();
}
int64_t integer(const toml::table& t, const char* key) { return t.get(key)->as_integer()->get(); }
std::string string(const toml::table& t, const char* key) { return t.get(key)->as_string()->get(); }

ModelOptions model_options(const toml::table& m, const std::string& where) {
  ModelOptions o;
  o.d_model(integer(m, "d_model")).n_heads(integer(m, "n_heads")).ffn_mult(integer(m, "ffn_mult"))
      .dropout(number(m, "dropout")).router(string(m, "router"))
      .router_params(toml_params(*m.get("router_params")->as_table(), "router_params"));
  std::vector<std::string> layers;
  for (const auto& l : *m.get("layers")->as_array()) layers.push_back(l.as_string()->get());
  o.layers(layers);
  OperatorParams ops;
  for (const auto& [name, table] : *m.get("operators")->as_table()) {
    if (!table.is_table()) fail_at(table, "operators." + std::string(name.str()), "expected a table of options");
    ops[std::string(name.str())] = toml_params(*table.as_table(), "operators." + std::string(name.str()));
  }
  o.operator_params(ops);
  try {
    o.meta_router(meta_router_from_string(string(m, "meta_router")));
    o.execution(execution_from_string(string(m, "execution")));
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  return o;
}

TrainOptions train_options(const toml::table& t) {
  TrainOptions o;
  o.steps = integer(t, "steps");
  o.batch_size = integer(t, "batch_size");
  o.grad_accum = integer(t, "grad_accum");
  o.lr = number(t, "lr");
  o.min_lr_ratio = number(t, "min_lr_ratio");
  o.warmup = integer(t, "warmup");
  o.weight_decay = number(t, "weight_decay");
  o.beta1 = number(t, "beta1");
  o.beta2 = number(t, "beta2");
  o.clip = number(t, "clip");
  o.eval_every = integer(t, "eval_every");
  o.eval_batches = integer(t, "eval_batches");
  o.eval_batch_size = integer(t, "eval_batch_size");
  o.checkpoint_every = integer(t, "checkpoint_every");
  o.calibration_batches = integer(t, "calibration_batches");
  o.threads = integer(t, "threads");
  o.log_every = integer(t, "log_every");
  o.precision = string(t, "precision");
  o.fail_loss_above = number(t, "fail_loss_above");
  return o;
}

void check_train_values(const TrainOptions& t, const std::string& where) {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw UserError(where + ": " + what);
  };
  need(t.steps >= 1, "train.steps must be at least 1");
  need(t.batch_size >= 1 && t.grad_accum >= 1 && t.eval_batch_size >= 1, "batch sizes and grad_accum must be positive");
  need(t.lr > 0, "train.lr must be positive");
  need(t.eval_every >= 1 && t.checkpoint_every >= 1 && t.log_every >= 1, "eval_every, checkpoint_every and log_every must be positive");
  need(t.precision == "fp32" || t.precision == "bf16", "train.precision must be \"fp32\" or \"bf16\"");
  need(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1, "train.beta1 and train.beta2 must lie in [0, 1)");
}

std::string value_text(const toml::node& v) {
  std::ostringstream s;
  if (v.is_string()) s << v.as_string()->get();
  else if (v.is_integer()) s << v.as_integer()->get();
  else if (v.is_floating_point()) s << v.as_floating_point()->get();
  else if (v.is_boolean()) s << (v.as_boolean()->get() ? "true" : "false");
  else s << "?";
  return s.str();
}

// A --set or sweep assignment into the resolved run.
void apply(toml::table& run, const std::string& path, const toml::node& value, const std::string& origin) {
  const auto dot = path.find('.');
  const std::string section = path.substr(0, dot), key = dot == std::string::npos ? "" : path.substr(dot + 1);
  if (key.empty() || (section != "model" && section != "train" && section != "task" && section != "router"))
    throw UserError(origin + ": '" + path + "': expected model.KEY, train.KEY, task.KEY or router.KEY");
  if (section == "task") {
    run.get("task")->as_table()->get("params")->as_table()->insert_or_assign(key, value);
  } else if (section == "router") {
    run.get("model")->as_table()->get("router_params")->as_table()->insert_or_assign(key, value);
  } else {
    const auto& fields = section == "model" ? kModelFields : kTrainFields;
    std::vector<std::string> known;
    for (const auto& f : fields) known.push_back(f.name);
    auto f = std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return key == f.name; });
    if (f == fields.end()) throw UserError(origin + ": '" + path + "': unknown key" + suggestion(key, known));
    if (!has_kind(value, f->kind))
      throw UserError(origin + ": '" + path + "': expected " + kind_name(f->kind));
    run.get(section)->as_table()->insert_or_assign(key, value);
  }
}

toml::table node_from_assignment(const std::string& text) {
  const Params p = Params::from_assignments({"v=" + text});
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
  spec.matrix = string(run, "matrix");
  spec.variant = string(run, "variant");
  spec.seed = integer(run, "seed");
  const toml::table& task = *run.get("task")->as_table();
  spec.task = string(task, "name");
  spec.task_config.name = spec.task;
  spec.task_config.plugin = string(task, "plugin");
  spec.task_config.params = toml_params(*task.get("params")->as_table(), "task");
  spec.model = model_options(*run.get("model")->as_table(), "stored run spec");
  spec.model.seed(static_cast<uint64_t>(spec.seed));
  spec.train = train_options(*run.get("train")->as_table());
  spec.resolved_toml = text;
  return spec;
}

std::string RunSpec::name() const {
  std::string n = variant + "/" + task + "/seed=" + std::to_string(seed);
  for (const auto& [axis, value] : sweep) n += "," + axis + "=" + value;
  return n;
}

Matrix load_matrix(const std::string& file, const MatrixOptions& options) {
  std::vector<std::string> chain;
  std::vector<toml::table> sources;
  const toml::table root = load_with_includes(file, chain, sources);
  struct Scope {
    explicit Scope(const std::vector<toml::table>* s) { t_sources = s; }
    ~Scope() { t_sources = nullptr; }
  } scope(&sources);
  // Schema checks on each file as written, where every node knows its position.
  for (const auto& src : sources) {
    check_fields(src, {}, "", {"matrix", "model", "train", "sweep", "variants", "tasks"});
    check_fields(table_at(src, "matrix"), kMatrixFields, "matrix");
    check_fields(table_at(src, "model"), kModelFields, "model");
    check_fields(table_at(src, "train"), kTrainFields, "train");
    for (const auto& [name, v] : table_at(src, "variants")) {
      const std::string path = "variants." + std::string(name.str());
      if (!v.is_table()) fail_at(v, path, "expected a table");
      check_fields(*v.as_table(), kModelFields, path, {"description", "model", "train"});
      check_fields(table_at(*v.as_table(), "model"), kModelFields, path + ".model");
      check_fields(table_at(*v.as_table(), "train"), kTrainFields, path + ".train");
    }
    for (const auto& [name, v] : table_at(src, "tasks")) {
      const std::string path = "tasks." + std::string(name.str());
      if (!v.is_table()) fail_at(v, path, "expected a table");
      check_fields(table_at(*v.as_table(), "model"), kModelFields, path + ".model");
      check_fields(table_at(*v.as_table(), "train"), kTrainFields, path + ".train");
    }
  }
  const toml::node* matrix_node = root.get("matrix");
  if (!matrix_node || !matrix_node->is_table()) throw UserError(file + ": no [matrix] table");
  const toml::table& mt = *matrix_node->as_table();
  for (const char* required : {"name", "variants", "tasks"})
    if (!mt.get(required)) throw UserError(where(mt, "matrix") + ": [matrix] needs '" + required + "'");

  Matrix out;
  out.file = file;
  out.name = mt.get("name")->as_string()->get();
  std::vector<int64_t> seeds = {0};
  if (const toml::node* s = mt.get("seeds")) {
    seeds.clear();
    for (const auto& item : *s->as_array()) seeds.push_back(item.as_integer()->get());
    if (seeds.empty()) fail_at(*s, "matrix.seeds", "expected at least one seed");
  }

  // Sweep axes: [sweep] model.X = [...], train.X = [...], task.X = [...].
  std::vector<std::pair<std::string, const toml::array*>> axes;
  for (const auto& [section, table] : table_at(root, "sweep")) {
    if (!table.is_table()) fail_at(table, "sweep." + std::string(section.str()), "expected model.KEY = [values]");
    for (const auto& [key, values] : *table.as_table()) {
      const std::string path = std::string(section.str()) + "." + std::string(key.str());
      if (!values.is_array() || values.as_array()->empty())
        fail_at(values, "sweep." + path, "expected a non-empty list of values");
      axes.emplace_back(path, values.as_array());
    }
  }
  std::vector<std::pair<std::string, toml::table>> sets;  // --set path -> value node
  for (const auto& s : options.set) {
    const auto eq = s.find('=');
    if (eq == std::string::npos) throw UserError("--set: expected key=value, found '" + s + "'");
    sets.emplace_back(s.substr(0, eq), node_from_assignment(s.substr(eq + 1)));
  }

  int64_t index = 0;
  for (const auto& vnode : *mt.get("variants")->as_array()) {
    const std::string variant = vnode.as_string()->get();
    const toml::node* vdef = root.at_path("variants." + variant).node();
    if (!vdef || !vdef->is_table()) {
      std::vector<std::string> known;
      for (const auto& [k, v] : table_at(root, "variants")) known.push_back(std::string(k.str()));
      fail_at(vnode, "matrix.variants", "no variant '" + variant + "' is defined" + suggestion(variant, known));
    }
    const toml::table& vt = *vdef->as_table();
    out.where["variants." + variant] = where(vt, "variants." + variant);

    for (const auto& tnode : *mt.get("tasks")->as_array()) {
      const std::string task = tnode.as_string()->get();
      const toml::node* tdef = root.at_path("tasks." + task).node();
      if (!tdef || !tdef->is_table()) {
        std::vector<std::string> known;
        for (const auto& [k, v] : table_at(root, "tasks")) known.push_back(std::string(k.str()));
        fail_at(tnode, "matrix.tasks", "no task '" + task + "' is defined" + suggestion(task, known));
      }
      const toml::table& tt = *tdef->as_table();
      out.where["tasks." + task] = where(tt, "tasks." + task);

      // Resolve: defaults <- [model]/[train] <- variant <- task overrides.
      toml::table model = model_defaults(), train = train_defaults();
      merge_into(model, table_at(root, "model"));
      merge_into(train, table_at(root, "train"));
      for (const auto& [k, v] : vt)
        if (k.str() != "description" && k.str() != "model" && k.str() != "train") {
          if (v.is_table()) merge_into(*model.get(k)->as_table(), *v.as_table());
          else model.insert_or_assign(k, v);
        }
      merge_into(model, table_at(vt, "model"));
      merge_into(train, table_at(vt, "train"));
      merge_into(model, table_at(tt, "model"));
      merge_into(train, table_at(tt, "train"));
      const TaskTable task_table = read_task_table(
          tt, task, "tasks." + task, [&](const toml::node& n) { return where(n, "tasks." + task + ".plugin"); });
      const std::string& plugin = task_table.plugin;
      const toml::table& task_params = task_table.options;

      // Every point of the sweep grid.
      std::vector<size_t> pick(axes.size(), 0);
      while (true) {
        for (int64_t seed : seeds) {
          toml::table run{{"matrix", out.name}, {"variant", variant}, {"task", toml::table{{"name", task}, {"plugin", plugin}, {"params", task_params}}},
                          {"seed", seed}, {"model", model}, {"train", train}};
          RunSpec spec;
          for (size_t a = 0; a < axes.size(); ++a) {
            const toml::node& value = *axes[a].second->get(pick[a]);
            apply(run, axes[a].first, value, where(value, "sweep." + axes[a].first));
            spec.sweep.emplace_back(axes[a].first.substr(axes[a].first.find('.') + 1), value_text(value));
          }
          for (const auto& [path, value] : sets) apply(run, path, *value.get("v"), "--set " + path);
          spec.matrix = out.name;
          spec.variant = variant;
          spec.task = task;
          spec.seed = seed;
          const toml::table& rm = *run.get("model")->as_table();
          const std::string vwhere = where(vt, "variants." + variant);
          spec.model = model_options(rm, vwhere + ": variant '" + variant + "'");
          spec.model.seed(static_cast<uint64_t>(seed));
          spec.train = train_options(*run.get("train")->as_table());
          check_train_values(spec.train, vwhere + ": variant '" + variant + "' on task '" + task + "'");
          spec.task_config.name = task;
          spec.task_config.plugin = plugin;
          spec.task_config.params = toml_params(*run.get("task")->as_table()->get("params")->as_table(), "tasks." + task);
          std::ostringstream json, text;
          json << toml::json_formatter{run};
          text << toml::toml_formatter{run};
          spec.canonical = json.str();
          spec.resolved_toml = text.str();
          char hex[17];
          std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(spec.canonical)));
          spec.hash = hex;
          const bool in_shard = index % options.shard_count == options.shard_index - 1;
          ++index;
          if (!in_shard) continue;
          if (!options.only.empty() && fnmatch(options.only.c_str(), spec.name().c_str(), 0) != 0) continue;
          out.runs.push_back(std::move(spec));
        }
        size_t a = 0;
        while (a < axes.size() && ++pick[a] == axes[a].second->size()) pick[a++] = 0;
        if (a == axes.size()) break;
      }
    }
  }
  return out;
}

}  // namespace chiar::engine
