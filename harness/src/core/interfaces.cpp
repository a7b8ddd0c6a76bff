// Out-of-line destructors and defaults of the public interfaces. Defining the
// key functions here gives each interface one type_info, owned by the core
// library, so dynamic_cast and exceptions work across plugin libraries.
#include "chiar/error.h"
#include "chiar/operator.h"
#include "chiar/plugin.h"
#include "chiar/router.h"

namespace chiar {

UserError::UserError(const std::string& message) : std::runtime_error(message) {}
UserError::~UserError() = default;
EnvironmentError::EnvironmentError(const std::string& message) : std::runtime_error(message) {}
EnvironmentError::~EnvironmentError() = default;

Operator::~Operator() = default;

FlopCount Operator::flops_at(int64_t T, const std::vector<int64_t>& positions, int64_t d, const FlopContext&) const {
  return flops(T, static_cast<int64_t>(positions.size()), d);
}
Router::~Router() = default;
Registrar::~Registrar() = default;
Task::~Task() = default;

void Router::calibrate(const at::Tensor&) {}
std::vector<double> Router::thresholds() const { return {}; }

const char* to_string(RouteMode mode) {
  switch (mode) {
    case RouteMode::Soft: return "soft";
    case RouteMode::HardSTE: return "hard-ste";
    case RouteMode::Hard: return "hard";
  }
  return "?";
}

}  // namespace chiar
