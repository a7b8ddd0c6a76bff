#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "chiar/params.h"

namespace chiar {

class PluginRegistry;

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

// The first option of a task that its plugin does not declare, or whose value
// is of another kind than declared: the key and what is wrong ("unknown
// option of task 'wikitext' (did you mean 'seq_len'?)", "expected an integer,
// found a string ("abc")"). Empty key when all are fine, or when the plugin
// declares nothing (the registry then reports unread keys after making it).
struct TaskOptionProblem {
  std::string key, what;
};
TaskOptionProblem find_task_option_problem(const TaskConfig& config, const PluginRegistry& registry);

// The same as a UserError located by config.where ("task 'NAME': key 'KEY'"
// where it has no entry). Runs before the task is made, so before any of its
// files is opened.
void check_task_options(const TaskConfig& config, const PluginRegistry& registry);

}  // namespace chiar
