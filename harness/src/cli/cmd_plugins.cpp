#include <algorithm>
#include <iomanip>
#include <iostream>

#include "chiar/registry.h"
#include "commands.h"

namespace chiar::cli {

int run_plugins(const Global& g) {
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  const auto entries = registry.entries();
  if (entries.empty()) {
    std::cout << "no plugins found (searched the default folder, CHIAR_PLUGIN_PATH and --plugin-dir)\n";
    return 0;
  }
  size_t wname = 4, wdesc = 11;
  for (const auto& e : entries) {
    std::string name = e.name;
    for (const auto& a : e.aliases) name += ", " + a;
    wname = std::max(wname, name.size());
    wdesc = std::max(wdesc, e.description.size());
  }
  std::cout << std::left << std::setw(static_cast<int>(wname) + 2) << "name" << std::setw(10) << "kind"
            << std::setw(static_cast<int>(wdesc) + 2) << "description" << std::setw(5) << "api"
            << "file\n";
  for (const auto& e : entries) {
    std::string name = e.name;
    for (const auto& a : e.aliases) name += ", " + a;
    std::cout << std::setw(static_cast<int>(wname) + 2) << name << std::setw(10) << e.kind
              << std::setw(static_cast<int>(wdesc) + 2) << e.description << std::setw(5) << e.api_version << e.file
              << "\n";
  }
  return 0;
}

}  // namespace chiar::cli
