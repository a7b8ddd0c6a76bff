#pragma once
#include <string>
#include <utility>
#include <vector>

#include "summary.h"

namespace chiar::report {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::vector<bool>> best;  // per cell: the best value of its column
};

// One table per task, in the paper's shape (rows = variants).
std::vector<std::pair<std::string, Table>> task_tables(const Summary& s, const std::string& baseline);

struct ReportFiles {
  std::string markdown, html;
  std::string claims_csv, claims_json;  // the claims table, one record per (claim, task)
  std::vector<std::string> images;
};

// Writes <out>.md (images beside it), <out>.html (self-contained: the
// charts inlined, no network fetches) and the claims table as
// <out>-claims.csv and <out>-claims.json, from the store, the claims file
// (claims.h) and the registry's operator traits. source names the stores
// in the report's opening line (default: db). allow_mixed_code judges claim
// rows whose runs come from several code states instead of leaving them
// without a verdict.
ReportFiles write_report(const std::string& db, const std::string& out, const std::string& baseline,
                         const std::string& claims_file, const PluginRegistry& registry, const std::string& source = "",
                         bool allow_mixed_code = false);

}  // namespace chiar::report
