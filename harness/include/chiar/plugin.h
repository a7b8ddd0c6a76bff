#pragma once
// The plugin boundary. A plugin library exports exactly one C symbol,
// chiar_plugin_entry, returning a descriptor whose leading fields never change
// layout: the loader reads the API version, libtorch version and kinds first,
// refuses a mismatch, and only then calls register_all with a Registrar.
// Write a plugin with CHIAR_PLUGIN(kinds, function) at namespace scope.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/version.h>

#include "chiar/export.h"
#include "chiar/operator.h"
#include "chiar/router.h"
#include "chiar/task.h"
#include "chiar/task_options.h"

// Bumped whenever a type a plugin sees changes layout or meaning: the
// interfaces (Operator, Router, Task, Registrar), their specs and traits, and
// the base classes plugins inherit from (chiar::GatedRouter in chiar/gate.h,
// chiar::ClassificationTask in chiar/class_data.h).
// 2: Router::route takes the OpContext. 3: Operator::flops_at (FLOPs by row position and context), OpContext::spectrum.
// 4: OperatorTraits layout: display name, colour, role and attention FLOPs.
// 5: Registrar::declare_task_options (a plugin calling it needs a harness
//    that has it: the version check refuses the plugin cleanly instead of the
//    loader failing on a missing symbol).
// 6: OpContext::host_rows (its layout), rows_by_choice_and_host and
//    rows_in_host_memory.
// 7: OperatorSpec::pre_norm and OperatorTraits::pre_norm (their layouts).
// 8: Registrar::declare_options. No layout changed, so plugins of API 7 still
//    load (CHIAR_PLUGIN_API_OLDEST); one calling declare_options needs 8.
// 9: the registry fills an operator's or router's declared defaults into
//    its Params before the factory runs, and Params::get_int(key) and its
//    siblings read them. No layout changed; a plugin reading a default
//    that way needs 9.
// 10: gather_rows and place_rows (chiar/rows.h). No layout changed; a
//    plugin calling them needs 10.
#define CHIAR_PLUGIN_API_VERSION 10
// The oldest plugin API whose plugins this harness loads.
#define CHIAR_PLUGIN_API_OLDEST 7

#define CHIAR_STRINGIFY_IMPL(x) #x
#define CHIAR_STRINGIFY(x) CHIAR_STRINGIFY_IMPL(x)
// "major.minor" of the libtorch a translation unit is compiled against.
#define CHIAR_TORCH_VERSION_STRING CHIAR_STRINGIFY(TORCH_VERSION_MAJOR) "." CHIAR_STRINGIFY(TORCH_VERSION_MINOR)

extern "C" {
// Layout frozen across API versions; only the loader reads it.
struct chiar_plugin_descriptor {
  uint32_t api_version;
  const char* torch_version;              // "major.minor"
  const char* kinds;                      // comma-separated: "operator", "router", "task"
  void (*register_all)(void* registrar);  // receives a chiar::Registrar*
};
}

namespace chiar {

using OperatorFactory = std::function<std::unique_ptr<Operator>(const OperatorSpec&)>;
using RouterFactory = std::function<std::unique_ptr<Router>(const RouterSpec&)>;
using TaskFactory = std::function<std::unique_ptr<Task>(const TaskSpec&)>;

// Handed to a plugin's register function; the only way to register anything.
class CHIAR_API Registrar {
 public:
  virtual ~Registrar();
  // aliases: other names the same factory answers to (e.g. "attn").
  virtual void add_operator(const std::string& name, const std::string& description, OperatorFactory factory,
                            const std::vector<std::string>& aliases = {}) = 0;
  virtual void add_router(const std::string& name, const std::string& description, RouterFactory factory,
                          const std::vector<std::string>& aliases = {}) = 0;
  virtual void add_task(const std::string& name, const std::string& description, TaskFactory factory,
                        const std::vector<std::string>& aliases = {}) = 0;

  // Every option the task `name` (registered by this plugin) reads. The
  // harness then refuses an unknown key or a value of another kind before the
  // factory runs, so before any data file is opened. Non-virtual, so the
  // layout plugins see is unchanged: the harness's registrar keeps the list,
  // any other registrar ignores it. A task that declares nothing is checked
  // only after construction (the keys it never read).
  void declare_task_options(const std::string& name, std::vector<TaskOption> options);

  // Every option the operator, router or task `name` of `kind` (registered
  // by this plugin before) reads, with its default and meaning
  // (chiar/task_options.h). Non-virtual, like declare_task_options. An object
  // whose plugin declares nothing is checked after construction (the keys it
  // never read).
  void declare_options(const std::string& kind, const std::string& name, std::vector<PluginOption> options);
};

}  // namespace chiar

#ifndef CHIAR_PLUGIN_API_VERSION_REPORTED
#define CHIAR_PLUGIN_API_VERSION_REPORTED CHIAR_PLUGIN_API_VERSION
#endif
#ifndef CHIAR_PLUGIN_TORCH_VERSION_REPORTED
#define CHIAR_PLUGIN_TORCH_VERSION_REPORTED CHIAR_TORCH_VERSION_STRING
#endif

// KINDS: a string literal such as "operator" or "operator,router".
// FUNCTION: void FUNCTION(chiar::Registrar&).
#define CHIAR_PLUGIN(KINDS, FUNCTION)                                                                                  \
  static void chiar_plugin_register_thunk(void* registrar) { FUNCTION(*static_cast<::chiar::Registrar*>(registrar)); } \
  extern "C" CHIAR_API const chiar_plugin_descriptor* chiar_plugin_entry() {                                           \
    static const chiar_plugin_descriptor descriptor{                                                                   \
        CHIAR_PLUGIN_API_VERSION_REPORTED, CHIAR_PLUGIN_TORCH_VERSION_REPORTED, KINDS, &chiar_plugin_register_thunk};  \
    return &descriptor;                                                                                                \
  }
