#include "task_config.h"

#include <toml++/toml.h>

#include <sstream>

#include "chiar/error.h"

namespace chiar {
namespace {

std::string where(const std::string& file, const toml::source_region& r) {
  return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

Params::Value to_value(const toml::node& node, const std::string& file, const std::string& key) {
  if (auto b = node.as_boolean()) return b->get();
  if (auto i = node.as_integer()) return i->get();
  if (auto f = node.as_floating_point()) return f->get();
  if (auto s = node.as_string()) return s->get();
  if (auto a = node.as_array()) {
    std::vector<double> list;
    for (const auto& item : *a) {
      if (auto i = item.as_integer()) list.push_back(static_cast<double>(i->get()));
      else if (auto f = item.as_floating_point()) list.push_back(f->get());
      else throw UserError(where(file, item.source()) + ": key '" + key + "': expected a list of numbers");
    }
    return list;
  }
  throw UserError(where(file, node.source()) + ": key '" + key +
                  "': expected a boolean, number, string or list of numbers");
}

}  // namespace

TaskConfig load_task_config(const std::string& file, const std::string& table) {
  toml::table root;
  try {
    root = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << file << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
        << e.description();
    throw UserError(msg.str());
  }
  const toml::node* node = root.at_path(table).node();
  if (!node || !node->is_table()) throw UserError(file + ": no table [" + table + "]");
  TaskConfig config;
  config.name = table.substr(table.rfind('.') + 1);
  config.plugin = config.name;
  for (const auto& [key, value] : *node->as_table()) {
    const std::string k(key.str());
    if (k == "plugin") {
      if (!value.is_string())
        throw UserError(where(file, value.source()) + ": key 'plugin': expected a string");
      config.plugin = value.as_string()->get();
      continue;
    }
    config.params.set(k, to_value(value, file, table + "." + k));
  }
  return config;
}

TaskConfig task_config_from_assignments(const std::string& plugin,
                                        const std::vector<std::string>& assignments) {
  TaskConfig config;
  config.name = plugin;
  config.plugin = plugin;
  config.params = Params::from_assignments(assignments);
  return config;
}

}  // namespace chiar
