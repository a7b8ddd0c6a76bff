#pragma once
// The hint a "no such name" message ends with.
#include <string>
#include <vector>

namespace chiar::engine {

// " (did you mean 'x'?)" when a known name lies within two edits of `given`,
// else " (known: a, b, ...)"; "" when nothing is known.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& known);

}  // namespace chiar::engine
