// Plugin descriptor check (core/registry.cpp check_plugin_descriptor): what
// the loader checks of a chiar_plugin_descriptor before any plugin code runs,
// then the registration the loader does next (CollectingRegistrar, reached
// by including registry.cpp). The input's lines are: the API version (or
// "<none>" for an entry point returning nothing), torch_version, kinds (each
// "<null>" for a null pointer), "<null>" or anything for register_all, then
// "KIND NAME" registrations the plugin makes. "<current>" as the API version
// and "<built>" as torch_version stand for this build's own: a seed written
// with numbers would stop at the version checks once either moves on, and
// never again reach the checks after them. Bad descriptors must surface as
// chiar::UserError, and a descriptor that passes the check must be safe to
// register from.
#include "../../harness/src/core/registry.cpp"

#include <cstdlib>
#include <sstream>

#include "fuzz_support.h"

namespace {

std::vector<std::pair<std::string, std::string>> g_registrations;  // kind, name

void register_from_input(void* registrar) {
  auto& r = *static_cast<chiar::Registrar*>(registrar);
  for (const auto& [kind, name] : g_registrations) {
    if (kind == "operator")
      r.add_operator(name, "fuzz", nullptr);
    else if (kind == "router")
      r.add_router(name, "fuzz", nullptr);
    else
      r.add_task(name, "fuzz", nullptr);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string api, torch_version, kinds, reg;
  std::getline(in, api);
  std::getline(in, torch_version);
  std::getline(in, kinds);
  std::getline(in, reg);
  g_registrations.clear();
  for (std::string line; std::getline(in, line);) {
    const auto space = line.find(' ');
    g_registrations.emplace_back(line.substr(0, space), space == std::string::npos ? "" : line.substr(space + 1));
  }
  const auto api_version = api == "<current>" ? uint32_t{CHIAR_PLUGIN_API_VERSION}
                                              : static_cast<uint32_t>(std::strtoul(api.c_str(), nullptr, 10));
  if (torch_version == "<built>") torch_version = CHIAR_TORCH_VERSION_STRING;
  const chiar_plugin_descriptor descriptor{api_version, torch_version == "<null>" ? nullptr : torch_version.c_str(),
                                           kinds == "<null>" ? nullptr : kinds.c_str(),
                                           reg == "<null>" ? nullptr : &register_from_input};
  const chiar_plugin_descriptor* d = api == "<none>" ? nullptr : &descriptor;
  try {
    chiar::check_plugin_descriptor("fuzz.so", d);
  } catch (const chiar::UserError&) {
    return 0;
  }
  // What PluginRegistry::load_file does next with a descriptor that passed.
  if (!d || !d->register_all) chiar::fuzz::contract_broken("a descriptor without register_all passed the check");
  chiar::CollectingRegistrar registrar("fuzz.so", d->api_version, d->kinds ? d->kinds : "", nullptr);
  try {
    d->register_all(&registrar);
  } catch (const chiar::UserError&) {
    return 0;
  }
  for (const auto& f : registrar.added)
    if (("," + std::string(d->kinds ? d->kinds : "") + ",").find("," + f.entry.kind + ",") == std::string::npos)
      chiar::fuzz::contract_broken("registered a " + f.entry.kind + " the descriptor did not declare");
  return 0;
}
