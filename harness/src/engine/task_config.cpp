#include "task_config.h"

#include "chiar/error.h"
#include "toml_values.h"

namespace chiar {

std::string toml_where(const toml::node& node) {
  const auto& r = node.source();
  return (r.path ? *r.path : std::string("<toml>")) + ":" + std::to_string(r.begin.line) + ":" +
         std::to_string(r.begin.column);
}

Params::Value toml_to_value(const toml::node& node, const std::string& key) {
  if (auto b = node.as_boolean()) return b->get();
  if (auto i = node.as_integer()) return i->get();
  if (auto f = node.as_floating_point()) return f->get();
  if (auto s = node.as_string()) return s->get();
  if (auto a = node.as_array()) {
    std::vector<double> list;
    for (const auto& item : *a) {
      if (auto i = item.as_integer()) list.push_back(static_cast<double>(i->get()));
      else if (auto f = item.as_floating_point()) list.push_back(f->get());
      else throw UserError(toml_where(item) + ": key '" + key + "': expected a list of numbers");
    }
    return list;
  }
  throw UserError(toml_where(node) + ": key '" + key +
                  "': expected a boolean, number, string or list of numbers");
}

toml::table toml_parse_file(const std::string& file) {
  try {
    return toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw UserError(file + ":" + std::to_string(e.source().begin.line) + ":" +
                    std::to_string(e.source().begin.column) + ": " + std::string(e.description()));
  }
}

Params toml_params(const toml::table& t, const std::string& path) {
  Params p;
  for (const auto& [k, v] : t) p.set(std::string(k.str()), toml_to_value(v, path + "." + std::string(k.str())));
  return p;
}

TaskTable read_task_table(const toml::table& t, const std::string& name, const std::string& path,
                          const std::function<std::string(const toml::node&)>& where) {
  TaskTable out{name, {}};
  for (const auto& [key, value] : t) {
    const std::string k(key.str());
    if (k == "model" || k == "train") continue;  // a matrix's per-task overrides
    if (k == "plugin") {
      if (!value.is_string()) throw UserError(where(value) + ": key '" + path + ".plugin': expected a string");
      out.plugin = value.as_string()->get();
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
