#pragma once
#include <istream>
#include <string>

#include <ATen/core/Tensor.h>

namespace chiar::engine {

// Reads one vector per line (whitespace-separated numbers, every line the same
// length) into an (N, d) float64 tensor. `source` names the input in errors,
// which give the line: ragged lines, non-numbers, blank lines, empty input.
at::Tensor read_vectors(std::istream& in, const std::string& source);

}  // namespace chiar::engine
