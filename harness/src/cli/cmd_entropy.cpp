#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "engine/runtime/runtime.h"
#include "engine/text/vector_text.h"
#include "chiar/error.h"
#include "chiar/spectral.h"
#include "commands.h"

namespace chiar::cli {

int run_entropy(const Global& g, const std::string& input, const std::string& dct_impl) {
  engine::configure_threads(g.threads);
  const DctImpl impl = dct_impl_from_string(dct_impl);
  at::Tensor vectors;  // (N, d) float64
  if (input.empty() || input == "-") {
    vectors = engine::read_vectors(std::cin, "<stdin>");
  } else {
    std::ifstream file(input);
    if (!file) throw UserError(input + ": cannot open the file");
    vectors = engine::read_vectors(file, input);
  }
  const auto h = spectral_entropy(vectors, impl).contiguous();
  const double* values = h.data_ptr<double>();
  for (int64_t i = 0; i < h.numel(); ++i) std::printf("%.12g\n", values[i] + 0.0);  // + 0.0: no "-0"
  return 0;
}

}  // namespace chiar::cli
