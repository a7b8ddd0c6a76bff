#pragma once
// The claims table as data, one record per (claim, task): what the report's
// claims table shows, with the unadjusted intervals and Holm's p-values
// beside the simultaneous ones.
#include <ostream>

#include "claims.h"

namespace chiar::report {

void write_claims_csv(const ClaimsTable& table, std::ostream& out);
void write_claims_json(const ClaimsTable& table, std::ostream& out);

}  // namespace chiar::report
