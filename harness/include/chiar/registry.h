#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chiar/export.h"
#include "chiar/operator.h"
#include "chiar/router.h"
#include "chiar/task.h"
#include "chiar/task_options.h"

namespace chiar {

// One registered factory as `chiar plugins` lists it.
struct PluginEntry {
  std::string name;
  std::string kind;  // "operator" | "router" | "task"
  std::string description;
  std::string file;  // absolute path of the library that registered it
  uint32_t api_version = 0;
  std::vector<std::string> aliases;
};

// Loads plugin libraries and makes objects from their factories. Every object
// made holds its library open, so a library stays loaded while any object from
// it lives, even after the registry is gone. All errors are UserErrors naming
// the file and what is wrong.
class CHIAR_API PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // Every *.so in dir, in name order. A missing folder is an error.
  void load_directory(const std::string& dir);
  void load_file(const std::string& path);
  // default_plugin_dirs(), then CHIAR_PLUGIN_PATH, then extra_dirs.
  void load_default(const std::vector<std::string>& extra_dirs = {});

  std::shared_ptr<Operator> make_operator(const std::string& name, const OperatorSpec& spec) const;
  std::shared_ptr<Router> make_router(const std::string& name, const RouterSpec& spec) const;
  // A task whose plugin declared its options has its spec's keys and kinds
  // checked before its factory runs (before it opens any file).
  std::shared_ptr<Task> make_task(const std::string& name, const TaskSpec& spec) const;
  // The options a task's plugin declared (Registrar::declare_task_options);
  // nullopt when it declared none. Throws a UserError for an unknown name.
  std::optional<std::vector<TaskOption>> task_options(const std::string& name) const;
  // The options a plugin declared for the operator, router or task `name`
  // (a name or an alias) of `kind`, with defaults and meanings where it gave
  // them (Registrar::declare_options or, keys and kinds only,
  // declare_task_options); nullopt when it declared none. Throws a UserError
  // for an unknown name.
  std::optional<std::vector<PluginOption>> declared_options(const std::string& kind, const std::string& name) const;

  // An operator's traits without a model: asked of an instance made once
  // (d_model 8, 2 heads, default options) and remembered. An empty display
  // name or colour comes back as the registered name or the default colour.
  // Making the instance leaves the global random generator as it was. Throws
  // a UserError for an unknown name, a failing factory or a colour that is
  // not "#rrggbb".
  OperatorTraits operator_traits(const std::string& name) const;

  bool has(const std::string& kind, const std::string& name) const;
  // The registered name behind a name or alias; throws for an unknown name.
  std::string canonical(const std::string& kind, const std::string& name) const;
  std::vector<PluginEntry> entries() const;  // sorted by kind, then name

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The plugin folders found next to the core library: <libdir>/plugins (build
// tree) and <libdir>/chiar/plugins (installed tree), those that exist.
CHIAR_API std::vector<std::string> default_plugin_dirs();

}  // namespace chiar
