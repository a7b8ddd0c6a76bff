#include "chiar/registry.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "chiar/plugin.h"
#include "core/plugin_descriptor_check.h"

namespace chiar {
namespace fs = boost::filesystem;
using Library = std::shared_ptr<boost::dll::shared_library>;

namespace {

constexpr const char* kEntryPoint = "chiar_plugin_entry";

struct Factory {
  PluginEntry entry;
  Library library;  // keeps the code of the factory loaded
  OperatorFactory make_operator;
  RouterFactory make_router;
  TaskFactory make_task;
  std::optional<std::vector<PluginOption>> options;  // what it declared it reads, if it declared anything
};

// Collects what one library registers; committed only if registration succeeds.
class CollectingRegistrar final : public Registrar {
 public:
  CollectingRegistrar(std::string file, uint32_t api, std::string kinds, Library lib)
      : file_(std::move(file)), api_(api), kinds_("," + kinds + ","), lib_(std::move(lib)) {}

  void add_operator(const std::string& name, const std::string& description, OperatorFactory factory,
                    const std::vector<std::string>& aliases) override {
    add(name, "operator", description, aliases).make_operator = std::move(factory);
  }
  void add_router(const std::string& name, const std::string& description, RouterFactory factory,
                  const std::vector<std::string>& aliases) override {
    add(name, "router", description, aliases).make_router = std::move(factory);
  }
  void add_task(const std::string& name, const std::string& description, TaskFactory factory,
                const std::vector<std::string>& aliases) override {
    add(name, "task", description, aliases).make_task = std::move(factory);
  }

  void declare_options(const std::string& kind, const std::string& name, std::vector<PluginOption> options) {
    for (size_t i = 0; i < options.size(); ++i) {
      if (options[i].key.empty()) throw UserError("it declares an option of " + kind + " '" + name + "' with no key");
      for (size_t j = 0; j < i; ++j)
        if (options[j].key == options[i].key)
          throw UserError("it declares the option '" + options[i].key + "' of " + kind + " '" + name + "' twice");
    }
    for (auto& f : added)
      if (f.entry.kind == kind && f.entry.name == name) {
        f.options = std::move(options);
        return;
      }
    throw UserError("it declares the options of " + kind + " '" + name + "', which it did not register before");
  }

  std::vector<Factory> added;

 private:
  Factory& add(const std::string& name, const std::string& kind, const std::string& description,
               const std::vector<std::string>& aliases) {
    // A plugin registers only the kinds its descriptor declared.
    if (kinds_.find("," + kind + ",") == std::string::npos)
      throw UserError("it registers " + kind + " '" + name + "' but declares kinds '" +
                      kinds_.substr(1, kinds_.size() - 2) + "'");
    added.push_back(Factory{{name, kind, description, file_, api_, aliases}, lib_, {}, {}, {}, std::nullopt});
    return added.back();
  }

  std::string file_;
  uint32_t api_;
  std::string kinds_;
  Library lib_;
};

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The first option that was not declared or whose value is of another kind,
// as a message; "" when all are fine. The CLI checks the same earlier, with
// positions and suggestions; this guards every other caller.
std::string declared_option_problem(const Params& params, const std::vector<PluginOption>& declared) {
  for (const auto& [key, value] : params.values()) {
    const auto option =
        std::find_if(declared.begin(), declared.end(), [&key = key](const PluginOption& o) { return o.key == key; });
    if (option == declared.end()) {
      std::vector<std::string> known;
      for (const auto& o : declared) known.push_back(o.key);
      std::sort(known.begin(), known.end());
      return "unknown parameter '" + key + "' (known: " + (known.empty() ? std::string("none") : join(known, ", ")) +
             ")";
    }
    if (!option_accepts(*option, value))
      return "parameter '" + key + "': expected " + option_kind_name(*option) + ", found " +
             param_value_kind_name(value) + " (" + describe_value(value) + ")";
  }
  return "";
}

// The value an option's documented default stands for, when it is one of
// the option's kind written as a matrix writes it ("128", "0.001", "true",
// "auto" for a string or a word it accepts, "[0.5, 0.5]"); nothing when it
// describes a value instead ("model.n_heads", "1 / d_model", "equal shares").
std::optional<Params::Value> declared_default(const PluginOption& o) {
  if (o.default_value.empty()) return std::nullopt;
  Params parsed;
  try {
    parsed = Params::from_assignments({o.key + "=" + o.default_value});
  } catch (const UserError&) {
    return std::nullopt;  // "[0.75, 0.25]; 3 operators [...]": prose about values
  }
  const Params::Value& value = parsed.values().at(o.key);
  if (!option_accepts(o, value)) return std::nullopt;
  if (o.kind != ParamKind::String && std::holds_alternative<std::string>(value) &&
      std::find(o.words.begin(), o.words.end(), std::get<std::string>(value)) == o.words.end())
    return std::nullopt;
  return value;
}

}  // namespace

void Registrar::declare_task_options(const std::string& name, std::vector<TaskOption> options) {
  std::vector<PluginOption> declared;
  for (auto& o : options) declared.push_back({std::move(o.key), o.kind, "", ""});
  declare_options("task", name, std::move(declared));
}

void Registrar::declare_options(const std::string& kind, const std::string& name, std::vector<PluginOption> options) {
  if (auto* collecting = dynamic_cast<CollectingRegistrar*>(this))
    collecting->declare_options(kind, name, std::move(options));
}

struct PluginRegistry::Impl {
  std::vector<Factory> factories;
  std::vector<std::string> loaded_files;  // canonical paths, to skip repeats
  std::mutex traits_mutex;
  std::map<std::string, OperatorTraits> traits;  // by registered name, once asked

  const Factory* find(const std::string& kind, const std::string& name) const {
    for (const auto& f : factories) {
      if (f.entry.kind != kind) continue;
      if (f.entry.name == name) return &f;
      if (std::find(f.entry.aliases.begin(), f.entry.aliases.end(), name) != f.entry.aliases.end()) return &f;
    }
    return nullptr;
  }

  const Factory& require(const std::string& kind, const std::string& name) const {
    if (const Factory* f = find(kind, name)) return *f;
    std::vector<std::string> known;
    for (const auto& f : factories) {
      if (f.entry.kind != kind) continue;
      std::string n = f.entry.name;
      if (!f.entry.aliases.empty()) n += " (" + join(f.entry.aliases, ", ") + ")";
      known.push_back(n);
    }
    std::sort(known.begin(), known.end());
    throw UserError("unknown " + kind + " '" + name +
                    "' (known: " + (known.empty() ? std::string("none; no plugins loaded") : join(known, ", ")) + ")");
  }

  template <class Object, class Spec>
  std::shared_ptr<Object> make(const Factory& f, Spec spec) const {
    const std::string who = f.entry.kind + " '" + f.entry.name + "' (" + f.entry.file + ")";
    if (f.options) {
      if (const std::string problem = declared_option_problem(spec.params, *f.options); !problem.empty())
        throw UserError(who + ": " + problem);
      // Operators and routers of API 9 on read their declared defaults from
      // Params (Params::get_int(key) and the like); for them a key with a
      // value default is always set (Params::has). Plugins built for an
      // older API get their Params as given. Tasks keep their own fallbacks:
      // several read whether a key was given at all.
      if constexpr (!std::is_same_v<Object, Task>)
        if (f.entry.api_version >= 9)
          for (const auto& o : *f.options)
            if (const auto value = declared_default(o)) spec.params.set_default(o.key, *value);
    }
    std::unique_ptr<Object> made;
    try {
      if constexpr (std::is_same_v<Object, Operator>)
        made = f.make_operator(spec);
      else if constexpr (std::is_same_v<Object, Router>)
        made = f.make_router(spec);
      else
        made = f.make_task(spec);
    } catch (const UserError& e) {
      throw UserError(who + ": " + e.what());
    } catch (const std::exception& e) {
      // Memory running out is the machine's failure, not the plugin's.
      if (is_out_of_memory(e)) throw;
      throw UserError(who + ": factory failed: " + message_of(e));
    }
    if (!made) throw UserError(who + ": factory returned nothing");
    const auto unread = spec.params.unread_keys();
    if (!unread.empty())
      throw UserError(who + ": unknown parameter" + (unread.size() > 1 ? "s " : " ") + "'" + join(unread, "', '") +
                      "'");
    // The deleter holds the library: its code must outlive the object's destructor.
    Library lib = f.library;
    return std::shared_ptr<Object>(made.release(), [lib](Object* p) { delete p; });
  }
};

void check_plugin_descriptor(const std::string& file, const chiar_plugin_descriptor* d) {
  if (!d) throw UserError("plugin file '" + file + "': its entry point returned nothing");
  if (d->api_version < CHIAR_PLUGIN_API_OLDEST || d->api_version > CHIAR_PLUGIN_API_VERSION)
    throw UserError("plugin file '" + file + "' was built for plugin API version " + std::to_string(d->api_version) +
                    ", but this harness provides version " + std::to_string(CHIAR_PLUGIN_API_VERSION) +
                    "; rebuild the plugin");
  const std::string torch_version = d->torch_version ? d->torch_version : "(none)";
  if (torch_version != CHIAR_TORCH_VERSION_STRING)
    throw UserError("plugin file '" + file + "' was built against libtorch " + torch_version +
                    ", but this harness uses libtorch " + CHIAR_TORCH_VERSION_STRING + "; rebuild the plugin");
  // Called right after the checks: a null one would crash the loader.
  if (!d->register_all) throw UserError("plugin file '" + file + "': its descriptor has no register function");
}

PluginRegistry::PluginRegistry() : impl_(std::make_unique<Impl>()) {}
PluginRegistry::~PluginRegistry() = default;

void PluginRegistry::load_directory(const std::string& dir) {
  boost::system::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UserError("plugin folder '" + dir + "' does not exist or is not a folder");
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir))
    if (fs::is_regular_file(item.path()) && item.path().extension() == ".so") files.push_back(item.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) load_file(file.string());
}

void PluginRegistry::load_file(const std::string& path_text) {
  boost::system::error_code ec;
  fs::path path = fs::absolute(path_text);
  if (!fs::is_regular_file(path, ec)) throw UserError("plugin file '" + path.string() + "' does not exist");
  const std::string file = fs::canonical(path, ec).string();
  if (std::find(impl_->loaded_files.begin(), impl_->loaded_files.end(), file) != impl_->loaded_files.end()) return;

  Library lib;
  try {
    // An absolute path, so dlopen never searches the system folders instead.
    lib = std::make_shared<boost::dll::shared_library>(
        file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw UserError("plugin file '" + file + "' cannot be loaded: " + e.what());
  }
  if (!lib->has(kEntryPoint))
    throw UserError("plugin file '" + file + "' has no entry point '" + kEntryPoint +
                    "' (a chiar plugin declares one with CHIAR_PLUGIN)");

  const chiar_plugin_descriptor* d = lib->get<const chiar_plugin_descriptor*()>(kEntryPoint)();
  check_plugin_descriptor(file, d);

  CollectingRegistrar registrar(file, d->api_version, d->kinds ? d->kinds : "", lib);
  try {
    d->register_all(&registrar);
  } catch (const std::exception& e) {
    throw UserError("plugin file '" + file + "' failed while registering: " + message_of(e));
  }
  // Reject clashes with what is loaded and within the library itself.
  for (size_t i = 0; i < registrar.added.size(); ++i) {
    const auto& entry = registrar.added[i].entry;
    std::vector<std::string> names = entry.aliases;
    names.insert(names.begin(), entry.name);
    for (const auto& name : names) {
      const Factory* clash = impl_->find(entry.kind, name);
      for (size_t j = 0; j < i && !clash; ++j) {
        const auto& earlier = registrar.added[j].entry;
        if (earlier.kind == entry.kind &&
            (earlier.name == name || std::count(earlier.aliases.begin(), earlier.aliases.end(), name)))
          clash = &registrar.added[j];
      }
      if (clash)
        throw UserError("plugin file '" + file + "' registers " + entry.kind + " '" + name + "', which '" +
                        clash->entry.file + "' already registered");
    }
  }
  for (auto& f : registrar.added) impl_->factories.push_back(std::move(f));
  impl_->loaded_files.push_back(file);
}

void PluginRegistry::load_default(const std::vector<std::string>& extra_dirs) {
  std::vector<std::string> dirs = default_plugin_dirs();
  if (const char* env = std::getenv("CHIAR_PLUGIN_PATH")) {
    std::stringstream parts(env);
    std::string dir;
    while (std::getline(parts, dir, ':'))
      if (!dir.empty()) dirs.push_back(dir);
  }
  dirs.insert(dirs.end(), extra_dirs.begin(), extra_dirs.end());
  std::vector<std::string> seen;
  for (const auto& dir : dirs) {
    boost::system::error_code ec;
    const auto canonical = fs::canonical(dir, ec).string();
    if (!ec && std::find(seen.begin(), seen.end(), canonical) != seen.end()) continue;
    load_directory(dir);
    seen.push_back(canonical);
  }
}

std::shared_ptr<Operator> PluginRegistry::make_operator(const std::string& name, const OperatorSpec& spec) const {
  return impl_->make<Operator>(impl_->require("operator", name), spec);
}

std::shared_ptr<Router> PluginRegistry::make_router(const std::string& name, const RouterSpec& spec) const {
  return impl_->make<Router>(impl_->require("router", name), spec);
}

std::shared_ptr<Task> PluginRegistry::make_task(const std::string& name, const TaskSpec& spec) const {
  return impl_->make<Task>(impl_->require("task", name), spec);
}

std::optional<std::vector<TaskOption>> PluginRegistry::task_options(const std::string& name) const {
  const auto& declared = impl_->require("task", name).options;
  if (!declared) return std::nullopt;
  std::vector<TaskOption> out;
  for (const auto& o : *declared) out.push_back({o.key, o.kind});
  return out;
}

std::optional<std::vector<PluginOption>> PluginRegistry::declared_options(const std::string& kind,
                                                                          const std::string& name) const {
  return impl_->require(kind, name).options;
}

OperatorTraits PluginRegistry::operator_traits(const std::string& name) const {
  const Factory& f = impl_->require("operator", name);
  {
    std::lock_guard<std::mutex> lock(impl_->traits_mutex);
    const auto known = impl_->traits.find(f.entry.name);
    if (known != impl_->traits.end()) return known->second;
  }
  OperatorSpec spec;
  spec.d_model = 8;
  spec.n_heads = 2;
  // Parameter initialisation draws from the global generator; asking for
  // traits must not shift what a later model or test draws.
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
  }
  OperatorTraits t;
  try {
    t = impl_->make<Operator>(f, spec)->traits();
  } catch (...) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
  }
  if (t.display_name.empty()) t.display_name = f.entry.name;
  if (t.colour.empty()) t.colour = OperatorTraits().colour;
  if (!std::regex_match(t.colour, std::regex("#[0-9a-fA-F]{6}")))
    throw UserError("operator '" + f.entry.name + "' (" + f.entry.file + "): colour '" + t.colour +
                    "' is not of the form #rrggbb");
  std::lock_guard<std::mutex> lock(impl_->traits_mutex);
  impl_->traits.emplace(f.entry.name, t);
  return t;
}

bool PluginRegistry::has(const std::string& kind, const std::string& name) const {
  return impl_->find(kind, name) != nullptr;
}

std::string PluginRegistry::canonical(const std::string& kind, const std::string& name) const {
  return impl_->require(kind, name).entry.name;
}

std::vector<PluginEntry> PluginRegistry::entries() const {
  std::vector<PluginEntry> out;
  for (const auto& f : impl_->factories) out.push_back(f.entry);
  std::sort(out.begin(), out.end(), [](const PluginEntry& a, const PluginEntry& b) {
    return std::tie(a.kind, a.name) < std::tie(b.kind, b.name);
  });
  return out;
}

std::vector<std::string> default_plugin_dirs() {
  const fs::path libdir = boost::dll::this_line_location().parent_path();
  std::vector<std::string> out;
  for (const fs::path& candidate : {libdir / "plugins", libdir / "chiar" / "plugins"}) {
    boost::system::error_code ec;
    if (fs::is_directory(candidate, ec)) out.push_back(candidate.string());
  }
  return out;
}

}  // namespace chiar
