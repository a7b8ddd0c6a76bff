#pragma once
#include <string>
#include <vector>

#include "chiar/params.h"

namespace chiar {

// A task as a matrix names it: the plugin and its options.
struct TaskConfig {
  std::string name;    // the table's name (e.g. "wikitext2")
  std::string plugin;  // the task plugin (key "plugin"; defaults to name)
  Params params;       // every other key
};

// Reads table `table` (dotted, e.g. "tasks.wikitext2") of a TOML file. Values
// must be booleans, integers, floats, strings or arrays of numbers; errors
// give file:line:column and the key.
TaskConfig load_task_config(const std::string& file, const std::string& table);

// A task from --task NAME and --set key=value assignments.
TaskConfig task_config_from_assignments(const std::string& plugin,
                                                  const std::vector<std::string>& assignments);

}  // namespace chiar
