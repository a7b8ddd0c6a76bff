// Entropy vector reader (engine/text/vector_text.cpp, `chiar entropy` input): one
// vector per line. Bad input must surface as chiar::UserError; what is read
// must be an (N, d) float64 tensor of finite numbers.
#include <ATen/ATen.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "chiar/error.h"
#include "engine/text/vector_text.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const at::Tensor v = chiar::engine::read_vectors(in, "<fuzz>");
    if (v.dim() != 2 || v.scalar_type() != at::kDouble || v.size(0) < 1 || v.size(1) < 1)
      chiar::fuzz::contract_broken("not an (N, d) float64 tensor");
    if (!at::isfinite(v).all().item<bool>()) chiar::fuzz::contract_broken("a non-finite value was read");
  } catch (const chiar::UserError&) {
  }
  return 0;
}
