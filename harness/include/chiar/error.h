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

}  // namespace chiar
