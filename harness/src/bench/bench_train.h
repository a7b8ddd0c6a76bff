#pragma once
// End-to-end throughput of variants on synthetic tokens: training steps
// (forward, loss, backward, AdamW) and inference, timed as medians after
// warm-up. The variants' steps are interleaved, one of each per round, with
// one 2048^3 GEMM per training round, so that every ratio (variant against
// variant, achieved against GEMM rate) compares the same minutes of a
// machine whose speed drifts. Compared GEMM libraries are interleaved the same
// way (the choice is process-wide and cheap to switch between steps).
#include <cstdint>
#include <string>
#include <vector>

#include "bench/op_times.h"
#include "chiar/registry.h"
#include "chiar/linear.h"

namespace chiar::bench {

struct TrainBenchOptions {
  std::string variants_file = "configs/variants.toml";
  std::vector<std::string> variants = {"baseline", "chiar_dct_attn"};
  int64_t vocab = 8192, batch = 8, seq = 256, d_model = 256, layers = 4, heads = 4;
  int64_t steps = 10, warmup = 3;
  int64_t classes = 0;  // 0: causal language model; N: bidirectional classifier of N classes
  int threads = 0;
  // Each variant under each of these GEMM libraries, interleaved like the
  // variants; empty: the library configured now. CPU only.
  std::vector<GemmBackend> gemm_backends;
  // "cpu" or "cuda:N" (engine::resolve_device). On a GPU every timed region
  // ends with a device synchronisation, and the GEMM rate is the device's
  // (8192^3 in the training precision) instead of the CPU libraries'.
  std::string device = "cpu";
  // Each variant in each of these precisions, interleaved like the variants:
  // "fp32", or "bf16" (bf16 autocast in the forward passes, fp32 master
  // weights). Against its own GEMM rate: a bf16 entry's is the 2048^3 bf16
  // product's (libtorch's, which sums in fp32 where the CPU has bf16
  // instructions).
  std::vector<std::string> precisions = {"fp32"};
  // After the timed rounds, this many more training steps of each entry,
  // timed operator by operator (OpRecorder); 0: none. The CPU only.
  int64_t op_time_steps = 0;
};

struct TrainBenchResult {
  std::string variant;    // "name", "name@backend" when several backends are compared, "...@bf16" several precisions
  std::string gemm;       // the library that ran its fp32 products: blas or onednn (a GPU: the device)
  std::string precision;  // "fp32" or "bf16"
  double train_tokens_per_s = 0, infer_tokens_per_s = 0;
  double step_flops = 0;       // executed FLOPs of one training step (forward + backward)
  double achieved_gflops = 0;  // step_flops / median step time
  // 2048^3 in the entry's precision on its library (bf16: libtorch's
  // product; a GPU: 8192^3 on the device), median of the rounds.
  double gemm_gflops = 0;
  double blas_gflops = 0;  // the same on libtorch's BLAS (0 on a GPU)
  double peak_rss_mb = 0;  // high-water mark of a first pass with this variant alone (host memory)
  double peak_gpu_allocated_mb = -1, peak_gpu_reserved_mb = -1;  // the same pass on a GPU; -1 on the CPU
  double train_ms = 0, infer_ms = 0;                             // medians
  // The timed rounds one by one, in order (round_stats.h pairs entries by
  // round): seconds of this entry's training step and inference pass, and
  // its GEMM rate probe's GFLOP/s in the training rounds.
  std::vector<double> train_round_s, infer_round_s, gemm_round_gflops;
  std::string allocator;  // the allocator behaviour chosen for these shapes
  // With op_time_steps: per training step, by self time, largest first, and
  // the wall time of those recorded steps.
  std::vector<OpTime> op_times;
  double op_times_step_ms = 0;
};

std::vector<TrainBenchResult> bench_train(const PluginRegistry& registry, const TrainBenchOptions& o);

}  // namespace chiar::bench
