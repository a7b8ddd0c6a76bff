#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "chiar/linear.h"

namespace chiar::engine {

// Below this a 512x512 fp32 GEMM is slow enough to warn about: the reference
// BLAS runs it at ~6-8 GFLOP/s, OpenBLAS at ~90 per core
// (docs/performance.md, 'GEMM libraries').
constexpr double kSlowGemmGflops = 20.0;

// What every run records about the machine it ran on.
struct RuntimeInfo {
  int threads = 0;            // intra-op threads in force
  std::string blas;           // the BLAS library libtorch's GEMM resolved to, with its config
  std::string blas_core;      // the kernels OpenBLAS chose (openblas_get_corename), "" for another BLAS
  double gemm_gflops = 0;     // median fp32 GEMM rate of the library the model's products use
  int64_t gemm_size = 0;      // n of the n x n x n GEMM measured
  std::string torch_version;  // libtorch the core was built against
  std::string build_type;     // CMAKE_BUILD_TYPE of the core
  std::string host;
  std::string cpu;
  std::vector<std::string> cpu_flags;  // the first processor's "flags" in /proc/cpuinfo
  std::string allocator;               // what configure_allocator() set
  std::string gemm;                    // what configure_gemm() chose, and why
  std::string gemm_library;            // ... its name: "blas" | "onednn"
  bool gemm_timed = false;             // ... chosen by timing both ("auto"), rather than as asked
  double blas_gflops = 0;              // the same GEMM through libtorch's BLAS, for comparison
  double onednn_gflops = 0;            // ... and through oneDNN (0 when this build has none)
};

// Rough bytes a training step keeps alive for backward: per token and layer
// about 16 d floats of mixing, residual and norms plus 3 of the FFN's m-wide
// ones, plus 3 vocabulary-wide ones per token for a language-model head.
int64_t estimate_activation_bytes(int64_t batch, int64_t seq, int64_t d_model, int64_t layers, int64_t ffn_width,
                                  int64_t lm_vocab);

// Sets glibc's treatment of large blocks for a run whose training step keeps
// about expected_bytes alive (0: small), and returns a description for the
// records. glibc serves every block above 32 MiB with mmap and returns it on
// free, so each step page-faults its large tensors afresh; keeping freed
// memory in the process instead (mmap off) speeds up training and evaluation
// of small LMs and T 4096 byte-level classification alike. The price is heap
// fragmentation, a higher peak (far higher before attention capped its
// transient blocks at 32 MiB; docs/performance.md, 'Allocator'). So freed
// memory is kept unless the step's activations alone would take 3/4 of
// physical memory, where fragmentation could exhaust it.
// CHIAR_MALLOC=default always leaves glibc as it is,
// CHIAR_MALLOC=retain always keeps freed memory.
std::string configure_allocator(int64_t expected_bytes = 0);

// Sets libtorch's intra-op threads: requested > 0 as given, 0 = all cores.
// Returns the number in force.
int configure_threads(int requested);
// The CPUs this process may run on (its affinity mask: what Slurm, a
// container or taskset allow), the default thread count.
int usable_cores();

// The BLAS library whose sgemm_ this process binds to (resolved through the
// Debian alternatives symlink), plus OpenBLAS's own configuration when present.
std::string detect_blas();

// The name of the kernels OpenBLAS runs ("Haswell", "SkylakeX"; "Prescott"
// where a DYNAMIC_ARCH build did not know the processor), asked of the
// library that provides sgemm_; "" when that library is not OpenBLAS.
std::string detect_blas_core();

// What is wrong with the BLAS as one "warning: ..." line, or "" when nothing
// is. From the facts alone (blas, blas_core, cpu, cpu_flags, blas_gflops):
// OpenBLAS on kernels older than AVX2 on a processor with AVX2 or AVX-512
// (whatever the rate) names the OPENBLAS_CORETYPE to set; a GEMM slower than
// kSlowGemmGflops blames the reference BLAS only when that is the library
// loaded, and otherwise just names the library.
std::string blas_warning(const RuntimeInfo& info);

// Chooses the library behind chiar::linear and gemm_into (chiar/linear.h):
// "blas", "onednn", or "auto", the faster of the two on a product of the
// model's shape (2048 x 256 x 1024) timed here, BLAS where the build has no
// oneDNN. CHIAR_GEMM in the environment, when set, replaces "auto". The same
// choice again returns the first answer without measuring. Returns the
// description runs record.
std::string configure_gemm(const std::string& choice = "auto");

// The product library a claimed run trains on, what its record says of it,
// and a note for the console ("" for none).
struct RunGemm {
  std::string library;  // "blas" | "onednn"
  std::string record;   // runs.gemm
  std::string note;
};

// The library of a run this process claims. A run that began in an earlier
// process (began_record: its runs.gemm, "" for none) keeps the library it
// began on when this process chose by timing: the two libraries round
// differently and threshold routing follows the rounding (docs/performance.md,
// 'GEMM libraries'), so a start-up timing that flips on a busy machine must not
// switch a run half-way. A library asked for (--gemm, CHIAR_GEMM) is obeyed,
// and so is the lack of oneDNN in this build (onednn_built): the record and
// the note then say that the run switched. A record keeps what it said of
// earlier switches.
RunGemm gemm_for_run(const RuntimeInfo& process, const std::string& began_record,
                     bool onednn_built = onednn_available());

// The middle value (upper middle for an even count); 0 for none.
double median(std::vector<double> values);

// An (m, k) x (k, n) fp32 matrix product (n x n x n by default) into a kept
// output, warmed up twice on construction; each gflops() call times one
// product on the library the model's products use now (gemm_into), or on the
// BLAS when blas_only. Cheap enough to probe the GEMM rate between other work
// (bench-train does, once per round).
class GemmProbe {
 public:
  explicit GemmProbe(int64_t n, bool blas_only = false) : GemmProbe(n, n, n, blas_only) {}
  GemmProbe(int64_t m, int64_t k, int64_t n, bool blas_only = false);
  double seconds();  // one product
  double gflops() { return flops() / seconds() / 1e9; }
  double flops() const { return 2.0 * static_cast<double>(m_) * static_cast<double>(k_) * static_cast<double>(n_); }

 private:
  int64_t m_, k_, n_;
  bool blas_only_;
  at::Tensor a_, b_, c_;  // (m, k), (k, n), (m, n)
};

// Median GFLOP/s of an n x n fp32 matrix product over `repeats` timed runs
// after two warm-up runs (on the BLAS when blas_only).
double measure_gemm_gflops(int64_t n = 512, int repeats = 10, bool blas_only = false);

// Threads, GEMM library (configure_gemm(gemm)), BLAS, GEMM rates and machine
// facts in one call.
RuntimeInfo probe_runtime(int requested_threads, const std::string& gemm = "auto");

// One-line summary, e.g. for a log header, and blas_warning's line under it
// when there is one.
std::string describe(const RuntimeInfo& info);

}  // namespace chiar::engine
