#include "engine/config/suggest.h"

#include <algorithm>

namespace chiar::engine {
namespace {

// Levenshtein distance over bytes, one row at a time.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(const std::string& given, const std::vector<std::string>& known) {
  if (known.empty()) return "";
  std::string best;
  size_t best_distance = 3;  // two edits at most: a typo, not another name
  for (const auto& k : known) {
    const size_t d = edit_distance(given, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  std::string all;
  for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
  return " (known: " + all + ")";
}

}  // namespace chiar::engine
