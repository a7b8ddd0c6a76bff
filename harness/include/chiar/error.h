#pragma once
#include <stdexcept>
#include <string>

#include "chiar/export.h"

namespace chiar {

// Bad input from the user (config, data file, plugin, CLI argument). The CLI
// prints what() alone and exits with status 2; nothing is written anywhere.
class CHIAR_API UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message);
  ~UserError() override;
};

// The environment failed under a correct request: a full disk, a read-only
// or vanished folder, an I/O error, a dead peer. what() names the file and
// the cause; the CLI prints it alone and exits with status 3. Whatever was
// finished before stays intact, and rerunning the command resumes.
class CHIAR_API EnvironmentError : public std::runtime_error {
 public:
  explicit EnvironmentError(const std::string& message);
  ~EnvironmentError() override;
};

}  // namespace chiar
