#include "matrix_checks.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "chiar/error.h"
#include "engine/config/task_config.h"
#include "model/model.h"

namespace chiar::cli {
namespace {

// Where a run's value of `path` was set, else `fallback` (a table's header).
std::string origin_or(const engine::Matrix& matrix, const engine::RunSpec& run, const std::string& path,
                      const std::string& fallback) {
  const std::string origin = matrix.origin_of(run, path);
  return origin.empty() ? fallback : origin;
}

// Every task option of every run checked against what its plugin declares,
// before run_matrix opens the store or a task reads its data. Tasks of an
// unknown plugin are left to check_plugin_names_of.
void check_task_options_of(const engine::Matrix& matrix, const PluginRegistry& registry) {
  std::vector<std::string> checked;  // task and options, each combination once
  for (const auto& r : matrix.runs) {
    const std::string id = r.task + "\n" + r.task_config.plugin + "\n" + r.task_config.params.describe();
    if (std::find(checked.begin(), checked.end(), id) != checked.end()) continue;
    checked.push_back(id);
    if (!registry.has("task", r.task_config.plugin)) continue;
    const engine::PluginOptionProblem problem =
        engine::find_option_problem(registry, "task", r.task_config.plugin, r.task_config.params);
    if (problem.key.empty()) continue;
    const std::string table = "tasks." + r.task;
    throw UserError(origin_or(matrix, r, "task." + problem.key,
                              matrix.where.at(table) + ": key '" + table + "." + problem.key + "'") +
                    ": " + engine::task_option_problem_text(problem));
  }
}

// Every run's task plugin, operators, and router where a layer is routed,
// named by a loaded plugin.
void check_plugin_names_of(const engine::Matrix& matrix, const PluginRegistry& registry) {
  for (const auto& r : matrix.runs) {
    try {
      registry.canonical("task", r.task_config.plugin);
    } catch (const UserError& e) {
      throw UserError(origin_or(matrix, r, "task.plugin", matrix.where.at("tasks." + r.task)) + ": task '" + r.task +
                      "': " + e.what());
    }
    const std::string at_variant = matrix.where.at("variants." + r.variant) + ": variant '" + r.variant + "'";
    bool routed = false;
    try {
      for (const auto& layer : r.model.layers()) {
        const auto names = model::split_layer_spec(layer);
        for (const auto& name : names) registry.canonical("operator", name);
        routed = routed || names.size() > 1;
      }
    } catch (const UserError& e) {
      throw UserError(origin_or(matrix, r, "model.layers", at_variant) + ": " + e.what());
    }
    try {
      if (routed) registry.canonical("router", r.model.router());
    } catch (const UserError& e) {
      throw UserError(origin_or(matrix, r, "model.router", at_variant) + ": " + e.what());
    }
  }
}

// One plugin's options in a matrix against what it declared: an unknown key
// (with a did-you-mean) or a value of another kind, at the key's own line.
// `origin` says where a key was set; a plugin that declared nothing is left
// to the check that makes it.
void check_declared(const PluginRegistry& registry, const std::string& kind, const std::string& name,
                    const Params& params, const std::function<std::string(const std::string&)>& origin) {
  if (!registry.has(kind, name)) return;
  const engine::PluginOptionProblem problem = engine::find_option_problem(registry, kind, name, params);
  if (problem.key.empty()) return;
  if (problem.unknown())
    throw UserError(origin(problem.key) + ": unknown option of " + problem.plugin + problem.suggestion);
  throw UserError(origin(problem.key) + ": " + problem.plugin + " takes " + problem.expected + ", found " +
                  problem.found);
}

// The router's and operators' options of every run checked against their
// declarations, before any of them is made.
void check_declared_layer_options_of(const engine::Matrix& matrix, const PluginRegistry& registry) {
  for (const auto& r : matrix.runs) {
    const model::ModelOptions& o = r.model;
    const std::string at_variant = matrix.where.at("variants." + r.variant) + ": variant '" + r.variant + "'";
    check_declared(registry, "router", o.router(), o.router_params(), [&](const std::string& key) {
      std::string at = matrix.origin_of(r, "router." + key);  // a --set router.KEY
      if (at.empty()) at = matrix.origin_of(r, "model.router_params." + key);
      return at.empty() ? origin_or(matrix, r, "model.router_params", at_variant) : at;
    });
    for (const auto& [name, params] : o.operator_params()) {
      // Options for an operator no plugin provides would apply to nothing,
      // yet change the run's hash.
      try {
        registry.canonical("operator", name);
      } catch (const UserError& e) {
        std::string at = matrix.origin_of(r, "model.operators." + name);
        if (at.empty()) at = origin_or(matrix, r, "model.operators", at_variant);
        throw UserError(at + ": " + e.what());
      }
      check_declared(registry, "operator", name, params, [&, &name = name](const std::string& key) {
        const std::string at = matrix.origin_of(r, "model.operators." + name + "." + key);
        return at.empty() ? origin_or(matrix, r, "model.operators", at_variant) : at;
      });
    }
  }
}

// What the operators and routers of a model read from their options, as a
// key: models alike in it are checked once.
std::string layer_plugins_key(const model::ModelOptions& o) {
  std::string key = std::to_string(o.d_model()) + "/" + std::to_string(o.n_heads()) + "\n" + o.router() + "(" +
                    o.router_params().describe() + ")";
  for (const auto& layer : o.layers()) key += "\n" + layer;
  for (const auto& [name, params] : o.operator_params()) key += "\n" + name + "(" + params.describe() + ")";
  return key;
}

// Where a router's refusal came from: where the option it names ('KEY') was
// set; else where every option was, when that is one place (a --set
// router.KEY, or a router_params table); else where router_params was, or
// `fallback`.
std::string router_problem_origin(const engine::Matrix& matrix, const engine::RunSpec& r, const std::string& what,
                                  const std::string& fallback) {
  const auto origin_of_key = [&](const std::string& key) {
    const std::string at = matrix.origin_of(r, "router." + key);  // only a --set gives router.KEY
    return at.empty() ? matrix.origin_of(r, "model.router_params") : at;
  };
  std::vector<std::string> origins;
  for (const auto& [key, value] : r.model.router_params().values()) {
    const std::string at = origin_of_key(key);
    if (what.find("'" + key + "'") != std::string::npos && !at.empty()) return at;
    if (std::find(origins.begin(), origins.end(), at) == origins.end()) origins.push_back(at);
  }
  if (origins.size() == 1 && !origins[0].empty()) return origins[0];
  return origin_or(matrix, r, "model.router_params", fallback);
}

// Layer `layer`'s operators and router of run `r`, made and dropped; a
// refusal named where the option was set.
void check_layer_plugins(const engine::Matrix& matrix, const PluginRegistry& registry, const engine::RunSpec& r,
                         size_t layer, const std::string& at_variant) {
  model::LayerOperators made;
  try {
    made = model::make_layer_operators(registry, r.model, layer);
  } catch (const UserError& e) {
    throw UserError(origin_or(matrix, r, "model.operators", at_variant) + ": " + e.what());
  }
  if (made.names.size() < 2) return;
  try {
    model::make_layer_router(registry, r.model, layer, made.names);
  } catch (const UserError& e) {
    throw UserError(router_problem_origin(matrix, r, e.what(), at_variant) + ": " + e.what());
  }
}

// Every layer's operators and router made once per distinct model, as the
// run will make them, so that an option they do not know (model.operators,
// router.KEY) or refuse is named before anything runs. Built on the CPU and
// dropped: the weights of a layer's operators, never the embedding. Whether
// an operator suits the task's head is the task's to say, when it is made.
void check_layer_plugins_of(const engine::Matrix& matrix, const PluginRegistry& registry) {
  std::vector<std::string> checked;
  for (const auto& r : matrix.runs) {
    const model::ModelOptions& o = r.model;
    if (!model::model_shape_problem(o).empty()) continue;  // the model's own check names it
    const std::string key = layer_plugins_key(o);
    if (std::find(checked.begin(), checked.end(), key) != checked.end()) continue;
    checked.push_back(key);
    const std::string at_variant = matrix.where.at("variants." + r.variant) + ": variant '" + r.variant + "'";
    for (size_t i = 0; i < o.layers().size(); ++i) {
      try {
        check_layer_plugins(matrix, registry, r, i, at_variant);
      } catch (const UserError&) {
        throw;
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) throw;
        throw EnvironmentError(at_variant + ": out of memory making layer " + std::to_string(i + 1) +
                               "'s operators on the CPU: " + out_of_memory_message(e));
      }
    }
  }
}

}  // namespace

void check_against_plugins(const engine::Matrix& matrix, const PluginRegistry& registry) {
  check_plugin_names_of(matrix, registry);
  check_task_options_of(matrix, registry);
  check_declared_layer_options_of(matrix, registry);
  check_layer_plugins_of(matrix, registry);
}

}  // namespace chiar::cli
