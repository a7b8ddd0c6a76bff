#pragma once
// Shared by the TOML readers (task tables, matrices): values with their
// source position. Include only from .cpp files: toml++ is heavy.
#include <toml++/toml.h>

#include <functional>
#include <string>

#include "chiar/error.h"
#include "chiar/params.h"

namespace chiar::engine {

// "file:line:column" of a node (the file as toml++ recorded it).
std::string toml_where(const toml::node& node);

// A value toml_to_value refuses. what() is "file:line:column: key 'KEY':
// PROBLEM"; a node copied into a resolved run table has lost its position,
// so readers of those rethrow key() and problem() where the matrix locates
// the key (RefusedValue).
class RefusedOptionValue : public UserError {
 public:
  RefusedOptionValue(const std::string& where, std::string key, std::string problem)
      : UserError(where + ": key '" + key + "': " + problem), key_(std::move(key)), problem_(std::move(problem)) {}
  const std::string& key() const { return key_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string key_, problem_;
};

// "nan", "inf" or "-inf" for a number that is not finite, "" for one that
// is: how refusals of non-finite option values name what they found.
std::string non_finite_name(double v);

// A plugin option: boolean, integer, float, string, or list of numbers.
// Throws RefusedOptionValue for any other value, or a number that is not
// finite.
Params::Value toml_to_value(const toml::node& node, const std::string& key);

// Parses a file; a syntax error becomes a UserError at file:line:column.
toml::table toml_parse_file(const std::string& file);

// Every value of a table as plugin options (key path prefix for errors).
Params toml_params(const toml::table& t, const std::string& path);

// A task table as configs write it: key "plugin" (default: the table's name)
// and the plugin's options, type-checked; the "model" and "train" override
// tables are not options. `where` locates a node for errors.
struct TaskTable {
  std::string plugin;
  toml::table options;
  // Key "family": what the task stands for ("large natural text"), which
  // claims may name instead of a task. Metadata: not an option of the task
  // and not part of a run's hash.
  std::string family;
};
TaskTable read_task_table(const toml::table& t, const std::string& name, const std::string& path,
                          const std::function<std::string(const toml::node&)>& where = toml_where);

}  // namespace chiar::engine
