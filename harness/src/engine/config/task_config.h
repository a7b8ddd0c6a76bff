#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "chiar/params.h"

namespace chiar {
class PluginRegistry;
}  // namespace chiar

namespace chiar::engine {

// A task as a matrix names it: the plugin and its options.
struct TaskConfig {
  std::string name;    // the table's name (e.g. "wikitext2")
  std::string plugin;  // the task plugin (key "plugin"; defaults to name)
  Params params;       // every other key
  // Where each option was set, for messages: "file:line:column: key
  // 'tasks.NAME.KEY'" or "--set KEY". Empty where the reader did not know.
  std::map<std::string, std::string> where;
};

// Reads table `table` (dotted, e.g. "tasks.wikitext2") of a TOML file. Values
// must be booleans, integers, floats, strings or arrays of numbers; errors
// give file:line:column and the key.
TaskConfig load_task_config(const std::string& file, const std::string& table);

// A task from --task NAME and --set key=value assignments.
TaskConfig task_config_from_assignments(const std::string& plugin, const std::vector<std::string>& assignments);

// The first option in `params` that the plugin `name` of `kind` does not
// declare, or whose value is of another kind than declared. Empty key when
// all are fine, or when the plugin declares nothing (the registry then
// reports unread keys after making it). Callers word it for where the option
// stands.
struct PluginOptionProblem {
  std::string key;
  std::string plugin;      // the kind and registered name: "router 'threshold'"
  std::string suggestion;  // an unknown key: " (did you mean 'tau'?)", " (known: ...)" or ", which takes none"
  std::string expected;    // a value of another kind: what the option takes, "a list of numbers or \"auto\""
  std::string found;       // and what it is, "a boolean (true)"
  bool unknown() const { return expected.empty(); }
};
PluginOptionProblem find_option_problem(const PluginRegistry& registry, const std::string& kind,
                                        const std::string& name, const Params& params);

// A task option's problem as the task checks say it: "unknown option of task
// 'wikitext' (did you mean 'seq_len'?)", "expected an integer, found a string
// ("abc")".
std::string task_option_problem_text(const PluginOptionProblem& problem);

// The same as a UserError located by config.where ("task 'NAME': key 'KEY'"
// where it has no entry). Runs before the task is made, so before any of its
// files is opened.
void check_task_options(const TaskConfig& config, const PluginRegistry& registry);

}  // namespace chiar::engine
