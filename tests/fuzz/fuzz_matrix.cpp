// TOML matrix reader with includes (engine/config/matrix.cpp load_matrix). The input
// is split on "-----" lines into up to four files, f0.toml (the matrix read)
// to f3.toml, so includes between them (and cycles) are exercised; a fifth
// part holds --set assignments, one per line. Bad input must surface as
// chiar::UserError. Every run read must rebuild from its resolved TOML, as
// the store later does (run_spec_from_toml).
#include <cstdint>
#include <sstream>
#include <string>

#include "chiar/error.h"
#include "engine/config/matrix.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chiar;
  const auto parts = fuzz::split_parts(std::string(reinterpret_cast<const char*>(data), size), 5);
  const std::string& dir = fuzz::scratch().fresh_dir();
  engine::MatrixOptions options;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i < 4) {
      fuzz::write_file(dir + "/f" + std::to_string(i) + ".toml", parts[i]);
      continue;
    }
    std::istringstream lines(parts[i]);
    for (std::string line; std::getline(lines, line);) options.set.push_back(line);
  }
  engine::Matrix m;
  try {
    m = engine::load_matrix(dir + "/f0.toml", options);
  } catch (const UserError&) {
    return 0;
  }
  for (const auto& run : m.runs) {
    try {
      const engine::RunSpec again = engine::run_spec_from_toml(run.resolved_toml);
      if (again.variant != run.variant || again.task != run.task || again.seed != run.seed)
        fuzz::contract_broken("run " + run.name() + " does not rebuild from its resolved TOML");
    } catch (const UserError& e) {
      fuzz::contract_broken("run " + run.name() + " cannot be rebuilt from its resolved TOML: " + e.what());
    }
  }
  return 0;
}
