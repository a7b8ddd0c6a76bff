#include "task_config.h"

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cmath>

#include "chiar/error.h"
#include "chiar/registry.h"
#include "engine/config/suggest.h"
#include "engine/config/toml_values.h"

namespace chiar::engine {

std::string toml_where(const toml::node& node) {
  const auto& r = node.source();
  return (r.path ? *r.path : std::string("<toml>")) + ":" + std::to_string(r.begin.line) + ":" +
         std::to_string(r.begin.column);
}

std::string non_finite_name(double v) {
  if (std::isfinite(v)) return "";
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

namespace {

// A TOML number as a plugin option's value: nan and inf mean nothing to any
// plugin, and range checks such as `v > 0` would let inf through.
double finite_number(const toml::value<double>& f, const std::string& key) {
  const double v = f.get();
  if (const std::string found = non_finite_name(v); !found.empty())
    throw RefusedOptionValue(toml_where(f), key, "expected a finite number, found " + found);
  return v;
}

}  // namespace

Params::Value toml_to_value(const toml::node& node, const std::string& key) {
  if (auto b = node.as_boolean()) return b->get();
  if (auto i = node.as_integer()) return i->get();
  if (auto f = node.as_floating_point()) return finite_number(*f, key);
  if (auto s = node.as_string()) return s->get();
  if (auto a = node.as_array()) {
    std::vector<double> list;
    for (const auto& item : *a) {
      if (auto i = item.as_integer())
        list.push_back(static_cast<double>(i->get()));
      else if (auto f = item.as_floating_point())
        list.push_back(finite_number(*f, key));
      else
        throw RefusedOptionValue(toml_where(item), key, "expected a list of numbers");
    }
    return list;
  }
  throw RefusedOptionValue(toml_where(node), key, "expected a boolean, number, string or list of numbers");
}

toml::table toml_parse_file(const std::string& file) {
  try {
    return toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw UserError(file + ":" + std::to_string(e.source().begin.line) + ":" + std::to_string(e.source().begin.column) +
                    ": " + std::string(e.description()));
  }
}

Params toml_params(const toml::table& t, const std::string& path) {
  Params p;
  for (const auto& [k, v] : t) p.set(std::string(k.str()), toml_to_value(v, path + "." + std::string(k.str())));
  return p;
}

TaskTable read_task_table(const toml::table& t, const std::string& name, const std::string& path,
                          const std::function<std::string(const toml::node&)>& where) {
  TaskTable out{name, {}, {}};
  for (const auto& [key, value] : t) {
    const std::string k(key.str());
    if (k == "model" || k == "train") continue;  // a matrix's per-task overrides
    if (k == "plugin") {
      if (!value.is_string()) throw UserError(where(value) + ": key '" + path + ".plugin': expected a string");
      out.plugin = value.as_string()->get();
      continue;
    }
    if (k == "family") {
      if (!value.is_string()) throw UserError(where(value) + ": key '" + path + ".family': expected a string");
      out.family = value.as_string()->get();
      continue;
    }
    toml_to_value(value, path + "." + k);  // type check
    out.options.insert_or_assign(key, value);
  }
  return out;
}

TaskConfig load_task_config(const std::string& file, const std::string& table) {
  const toml::table root = toml_parse_file(file);
  const toml::node* node = root.at_path(table).node();
  if (!node || !node->is_table()) throw UserError(file + ": no table [" + table + "]");
  TaskConfig config;
  config.name = table.substr(table.rfind('.') + 1);
  const TaskTable t = read_task_table(*node->as_table(), config.name, table);
  config.plugin = t.plugin;
  config.params = toml_params(t.options, table);
  // The options as read keep their positions; the copies in t.options do not.
  for (const auto& [key, value] : *node->as_table())
    config.where[std::string(key.str())] = toml_where(value) + ": key '" + table + "." + std::string(key.str()) + "'";
  return config;
}

TaskConfig task_config_from_assignments(const std::string& plugin, const std::vector<std::string>& assignments) {
  TaskConfig config;
  config.name = plugin;
  config.plugin = plugin;
  config.params = Params::from_assignments(assignments);
  for (const auto& [key, value] : config.params.values()) config.where[key] = "--set " + key;
  return config;
}

PluginOptionProblem find_option_problem(const PluginRegistry& registry, const std::string& kind,
                                        const std::string& name, const Params& params) {
  if (params.empty()) return {};
  const auto declared = registry.declared_options(kind, name);
  if (!declared) return {};
  std::vector<std::string> known;
  for (const auto& o : *declared) known.push_back(o.key);
  std::sort(known.begin(), known.end());
  const std::string plugin = kind + " '" + registry.canonical(kind, name) + "'";
  for (const auto& [key, value] : params.values()) {
    const auto option =
        std::find_if(declared->begin(), declared->end(), [&key = key](const PluginOption& o) { return o.key == key; });
    if (option == declared->end())
      return {key, plugin, known.empty() ? std::string(", which takes none") : engine::did_you_mean(key, known), "",
              ""};
    if (!option_accepts(*option, value))
      return {key, plugin, "", option_kind_name(*option),
              std::string(param_value_kind_name(value)) + " (" + describe_value(value) + ")"};
  }
  return {};
}

std::string task_option_problem_text(const PluginOptionProblem& problem) {
  if (problem.unknown()) return "unknown option of " + problem.plugin + problem.suggestion;
  return "expected " + problem.expected + ", found " + problem.found;
}

void check_task_options(const TaskConfig& config, const PluginRegistry& registry) {
  const PluginOptionProblem problem = find_option_problem(registry, "task", config.plugin, config.params);
  if (problem.key.empty()) return;
  const auto at = config.where.find(problem.key);
  const std::string where =
      at != config.where.end() ? at->second : "task '" + config.name + "': key '" + problem.key + "'";
  throw UserError(where + ": " + task_option_problem_text(problem));
}

}  // namespace chiar::engine
