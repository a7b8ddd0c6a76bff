#pragma once
// The bodies of the chiar subcommands. main.cpp owns argument parsing; each
// function gets plain values and returns the process exit status. Errors are
// thrown as chiar::UserError and reported by main (exit status 2).
#include <string>
#include <vector>

namespace chiar::cli {

struct Global {
  int threads = 0;  // 0 = all cores
  std::vector<std::string> plugin_dirs;
};

// Sets the threads and checks the BLAS once (a 512^3 GEMM, ~30 ms); warns on
// stderr when libtorch is on the reference BLAS. Commands that compute call it.
void start_compute(const Global& g);

int run_info(const Global& g);
int run_plugins(const Global& g);
int run_entropy(const Global& g, const std::string& input, const std::string& dct_impl);

struct ModelArgs {
  std::vector<std::string> layers;
  std::string router = "threshold";
  std::vector<std::string> router_set;    // key=value
  std::vector<std::string> operator_set;  // op.key=value
  std::string head = "lm";
  std::string meta_router = "none";
  int64_t vocab = 8192, d_model = 256, heads = 4, classes = 2;
  int64_t batch = 0, seq = 0;  // > 0: run one forward pass and print routing shares
  uint64_t seed = 0;
};
int run_model(const Global& g, const ModelArgs& a);

}  // namespace chiar::cli
