#include "bench_train.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>

#include <boost/filesystem.hpp>

#include "core/autocast_compat.h"
#include "model/model.h"
#include "engine/config/matrix.h"
#include "engine/runtime/device.h"
#include "engine/runtime/gpu_memory.h"
#include "engine/runtime/runtime.h"
#include "engine/training/accounting.h"
#include "chiar/adamw.h"
#include "chiar/error.h"

namespace chiar::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Resets the kernel's resident-set high-water mark, then reads it (VmHWM).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// A plan of L layers in the variant's shape: its first layer, its middle
// (routed) layer repeated, its last layer.
std::vector<std::string> stretch(const std::vector<std::string>& plan, int64_t layers) {
  if (static_cast<int64_t>(plan.size()) == layers || plan.size() < 3) return plan;
  std::vector<std::string> out{plan.front()};
  for (int64_t i = 0; i < layers - 2; ++i) out.push_back(plan[1]);
  out.push_back(plan.back());
  return out;
}

// The model's parameters, once it is on the device (built on the CPU under
// its seed, so every device starts from the same weights).
std::vector<at::Tensor> parameters_on(model::ChiarModel& model, const at::Device& device) {
  if (!device.is_cpu()) model.to(device);
  return model.parameters();
}

// One variant under test: its model, optimiser and the step it times.
class Variant {
 public:
  Variant(const PluginRegistry& registry, const model::ModelOptions& options, const at::Tensor& tokens, bool bf16)
      : model_(registry, options),
        opt_(parameters_on(model_, tokens.device()), torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95})),
        bf16_(bf16) {
    const autocast::Bf16Scope cast(bf16_, tokens.device());  // as a run calibrates: in its precision
    model_.calibrate_routers(tokens);
  }

  // tokens: (B, T); targets: (B, T) for a language model, (B,) for a classifier.
  void train_step(const at::Tensor& tokens, const at::Tensor& targets, int64_t outputs) {
    model_.train();
    opt_.clear_gradients();
    at::Tensor loss;
    {
      const autocast::Bf16Scope cast(bf16_, tokens.device());
      // A language model's loss through the fused head, as `chiar run` trains it.
      auto out = model_.forward(tokens, {}, /*logits=*/false);
      loss = out.hidden.defined()
                 ? model_.lm_loss(out, targets)
                 : at::cross_entropy_loss(out.logits.to(at::kFloat).reshape({-1, outputs}), targets.reshape({-1}));
      if (out.aux_loss.defined()) loss = loss + out.aux_loss;
    }
    loss.backward();
    opt_.step();
    engine::synchronize_device(tokens.device());
  }

  // Keeps the logits until the next call, as a caller consuming them would.
  void infer(const at::Tensor& tokens) {
    model_.eval();
    at::NoGradGuard no_grad;
    const autocast::Bf16Scope cast(bf16_, tokens.device());
    last_ = model_.forward(tokens);
    engine::synchronize_device(tokens.device());
  }

  // FLOPs of a training step as executed, from the model's own accounting
  // (training-mode routing decides dense or sparse per layer).
  double step_flops(const at::Tensor& tokens, int64_t batch, int64_t seq) {
    model_.train();
    {
      // In the step's precision, so that routing decides as in the timed steps.
      at::NoGradGuard no_grad;
      const autocast::Bf16Scope cast(bf16_, tokens.device());
      last_ = model_.forward(tokens);
    }
    double flops = 0;
    for (const auto& row : engine::account(model_, last_, {}, seq).flops)
      flops += row.train_executed * static_cast<double>(batch);
    return flops;
  }

 private:
  model::ChiarModel model_;
  FusedAdamW opt_;
  bool bf16_;
  model::ModelOutput last_;
};

// The device's matrix-product rate in the training precision: one n^3
// product per call, timed between synchronisations (the GPU's counterpart
// of engine::GemmProbe).
class DeviceGemmProbe {
 public:
  DeviceGemmProbe(const at::Device& device, bool bf16, int64_t n) : device_(device), n_(n) {
    const auto options = at::TensorOptions().device(device).dtype(bf16 ? at::kBFloat16 : at::kFloat);
    a_ = at::randn({n, n}, options);
    b_ = at::randn({n, n}, options);
    for (int i = 0; i < 2; ++i) at::mm(a_, b_);  // warm-up: the library's first call picks its kernels
    engine::synchronize_device(device_);
  }
  double gflops() {
    const auto t0 = Clock::now();
    c_ = at::mm(a_, b_);
    engine::synchronize_device(device_);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return 2.0 * static_cast<double>(n_) * static_cast<double>(n_) * static_cast<double>(n_) / seconds / 1e9;
  }

 private:
  at::Device device_;
  int64_t n_;
  at::Tensor a_, b_, c_;
};

void check_options(const TrainBenchOptions& o) {
  const auto at_least = [](const char* flag, int64_t value, int64_t low) {
    if (value < low)
      throw UserError(std::string(flag) + ": must be at least " + std::to_string(low) + ", found " +
                      std::to_string(value));
  };
  at_least("--steps", o.steps, 1);
  at_least("--warmup", o.warmup, 0);
  at_least("--op-times", o.op_time_steps, 0);
  if (o.op_time_steps > 0 && !at::Device(o.device).is_cpu())
    throw UserError("--op-times: the CPU only (on a GPU an operator's time is its launch)");
  at_least("--batch", o.batch, 1);
  at_least("--seq", o.seq, 1);
  at_least("--d-model", o.d_model, 1);
  at_least("--layers", o.layers, 1);
  at_least("--heads", o.heads, 1);
  at_least("--vocab", o.vocab, 1);
  if (o.d_model % o.heads != 0)
    throw UserError("--heads: " + std::to_string(o.heads) + " does not divide --d-model " + std::to_string(o.d_model));
  if (o.classes < 0 || o.classes == 1)
    throw UserError("bench-train: --classes must be 0 (language model) or at least 2");
  if (o.precisions.empty()) throw UserError("bench-train: no precision to measure");
  for (size_t i = 0; i < o.precisions.size(); ++i) {
    if (o.precisions[i] != "fp32" && o.precisions[i] != "bf16")
      throw UserError("--compare-precision: must be fp32 or bf16, found '" + o.precisions[i] + "'");
    if (std::find(o.precisions.begin(), o.precisions.begin() + static_cast<std::ptrdiff_t>(i), o.precisions[i]) !=
        o.precisions.begin() + static_cast<std::ptrdiff_t>(i))
      throw UserError("--compare-precision: '" + o.precisions[i] + "' is given twice");
  }
  if (o.device != "cpu" && !o.gemm_backends.empty())
    throw UserError("bench-train: --compare-gemm compares the CPU's libraries; it does not go with --device " +
                    o.device);
}

// The variants' definitions, through a one-task matrix over them.
engine::Matrix load_variants(const TrainBenchOptions& o) {
  boost::system::error_code ec;
  if (!boost::filesystem::is_regular_file(o.variants_file, ec))
    throw UserError(o.variants_file + ": cannot open the file");
  const std::string variants = boost::filesystem::absolute(o.variants_file).string();
  std::string matrix =
      "include = [\"" + variants + "\"]\n[matrix]\nname = \"bench\"\ntasks = [\"synthetic\"]\nvariants = [";
  for (size_t i = 0; i < o.variants.size(); ++i) matrix += (i ? ", \"" : "\"") + o.variants[i] + "\"";
  matrix += "]\n[tasks.synthetic]\nplugin = \"none\"\n";
  const std::string tmp =
      (boost::filesystem::temp_directory_path() / ("chiar-bench-" + std::to_string(::getpid()) + ".toml")).string();
  { std::ofstream(tmp) << matrix; }
  engine::Matrix m;
  try {
    m = engine::load_matrix(tmp);
  } catch (const UserError& e) {
    std::remove(tmp.c_str());
    // The generated matrix's variant list is the one line of it that comes
    // from the command line: name the option, not the temporary file.
    const std::string what = e.what(), key = "key 'matrix.variants': ";
    const auto at = what.find(key);
    if (what.rfind(tmp + ":", 0) == 0 && at != std::string::npos)
      throw UserError("--variants: " + what.substr(at + key.size()));
    throw;
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::remove(tmp.c_str());
  return m;
}

// The one synthetic batch every variant trains and infers on.
struct Synthetic {
  at::Tensor tokens;   // (B, T)
  at::Tensor targets;  // (B, T) for a language model, (B,) for a classifier
  int64_t outputs;     // classes, or the vocabulary
};

Synthetic synthetic_batch(const TrainBenchOptions& o) {
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const at::Device device(o.device);
  at::manual_seed(0);
  Synthetic s;
  s.tokens = at::randint(o.vocab, {o.batch, o.seq}, longs).to(device);         // (B, T)
  s.targets = (o.classes > 0 ? at::randint(o.classes, {o.batch}, longs)        // (B,)
                             : at::randint(o.vocab, {o.batch, o.seq}, longs))  // (B, T)
                  .to(device);
  s.outputs = o.classes > 0 ? o.classes : o.vocab;
  return s;
}

// Every variant's model from the same seed, in the benchmark's shape.
model::ModelOptions options_for(const engine::RunSpec& run, const TrainBenchOptions& o) {
  model::ModelOptions mo = run.model;
  mo.vocab_size(o.vocab).d_model(o.d_model).n_heads(o.heads).layers(stretch(run.model.layers(), o.layers)).seed(0);
  if (o.classes > 0)
    mo.head(TaskHead::Classifier).n_classes(o.classes);
  else
    mo.head(TaskHead::LanguageModel);
  return mo;
}

// The allocator behaviour for these shapes, sized by the widest feed-forward.
std::string configure_allocator_for(const engine::Matrix& m, const TrainBenchOptions& o) {
  int64_t ffn_mult = 1;
  for (const auto& run : m.runs) ffn_mult = std::max(ffn_mult, run.model.ffn_mult());
  return engine::configure_allocator(engine::estimate_activation_bytes(
      o.batch, o.seq, o.d_model, o.layers, ffn_mult * o.d_model, o.classes > 0 ? 0 : o.vocab));
}

// One measured configuration: a variant on a GEMM library in a precision.
struct Entry {
  const engine::RunSpec* run;
  GemmBackend gemm;
  bool bf16;
  std::string label;
};

std::vector<Entry> entries_for(const engine::Matrix& m, const std::vector<GemmBackend>& backends,
                               const std::vector<std::string>& precisions) {
  std::vector<Entry> entries;
  for (const auto& run : m.runs)
    for (const auto b : backends) {
      set_gemm_backend(b);  // refuses onednn in a build without it, before any work
      for (const auto& precision : precisions) {
        std::string label = run.variant;
        if (backends.size() > 1) label += std::string("@") + to_string(b);
        if (precisions.size() > 1) label += "@" + precision;
        entries.push_back({&run, b, precision == "bf16", label});
      }
    }
  return entries;
}

// The GEMM rates an entry is held against, one probe per (library,
// precision) among the entries: fp32 on each compared CPU library, bf16
// through libtorch's product (no CPU library of ours multiplies bf16), and
// on a GPU the device's 8192^3 product in each precision.
class RateProbes {
 public:
  RateProbes(const std::vector<Entry>& entries, const at::Device& device) : device_(device) {
    for (const auto& e : entries) index_.push_back(add(e));
  }
  size_t size() const { return probes_.size(); }
  size_t of(size_t entry) const { return index_[entry]; }
  double gflops(size_t probe) {
    auto& p = probes_[probe];
    if (p.fp32) {
      set_gemm_backend(p.backend);
      return p.fp32->gflops();
    }
    return p.other->gflops();
  }

 private:
  struct Probe {
    GemmBackend backend;
    bool bf16;
    std::unique_ptr<engine::GemmProbe> fp32;  // the CPU's fp32 product on `backend`
    std::unique_ptr<DeviceGemmProbe> other;
  };
  size_t add(const Entry& e) {
    const bool cpu_fp32 = device_.is_cpu() && !e.bf16;
    for (size_t i = 0; i < probes_.size(); ++i)
      if (probes_[i].bf16 == e.bf16 && (!cpu_fp32 || probes_[i].backend == e.gemm)) return i;
    Probe p{e.gemm, e.bf16, nullptr, nullptr};
    if (cpu_fp32) {
      set_gemm_backend(e.gemm);
      p.fp32 = std::make_unique<engine::GemmProbe>(2048);
    } else {
      p.other = std::make_unique<DeviceGemmProbe>(device_, e.bf16, device_.is_cpu() ? 2048 : 8192);
    }
    probes_.push_back(std::move(p));
    return probes_.size() - 1;
  }
  at::Device device_;
  std::vector<Probe> probes_;
  std::vector<size_t> index_;  // per entry
};

// Pass 1, one variant at a time: peak memory (the kernel's high-water mark
// is per process, and freed memory is handed back between variants so that
// none inherits another's) and the FLOPs of a training step as executed.
std::vector<TrainBenchResult> measure_alone(const PluginRegistry& registry, const std::vector<Entry>& entries,
                                            const TrainBenchOptions& o, const Synthetic& s,
                                            const std::string& allocator) {
  std::vector<TrainBenchResult> out;
  for (const auto& entry : entries) {
    TrainBenchResult r;
    r.variant = entry.label;
    r.gemm = to_string(entry.gemm);
    r.precision = entry.bf16 ? "bf16" : "fp32";
    r.allocator = allocator;
    set_gemm_backend(entry.gemm);
    malloc_trim(0);
    reset_peak_rss();
    engine::release_gpu_cache(s.tokens.device());
    engine::reset_gpu_memory_peak(s.tokens.device());
    {
      Variant v(registry, options_for(*entry.run, o), s.tokens, entry.bf16);
      // At least two steps: the first creates the optimiser's state after its
      // activations are gone, the second holds both, as every later one does.
      for (int64_t i = 0; i < std::max<int64_t>(2, o.warmup); ++i) v.train_step(s.tokens, s.targets, s.outputs);
      v.infer(s.tokens);
      r.step_flops = v.step_flops(s.tokens, o.batch, o.seq);
      r.peak_rss_mb = peak_rss_mb();
      const auto gpu = engine::gpu_memory_peak(s.tokens.device());
      r.peak_gpu_allocated_mb = gpu.allocated_mb;
      r.peak_gpu_reserved_mb = gpu.reserved_mb;
    }
    malloc_trim(0);
    out.push_back(r);
  }
  return out;
}

// Seconds per timed step, and GEMM rates per timed training round.
struct Timings {
  std::vector<std::vector<double>> train_s, infer_s;  // per entry
  std::vector<std::vector<double>> gemm;              // per rate probe
  std::vector<size_t> probe_of;                       // per entry: its probe
  std::vector<double> blas;                           // libtorch's BLAS in fp32 (the CPU only)
};

// Pass 2, all variants alive: each round times one training step of every
// entry (variant, library, precision) and one GEMM per rate probe, so that
// ratios between entries and against the GEMM rate compare the same minutes
// of a machine whose speed drifts. The entries' order turns by one each
// round (round i starts at entry i mod n). In a fixed order, of two
// identical variants the first, whose step follows the probes' 2048^3
// products, trained 2-3% slower than the second (docs/performance.md,
// 'Machine and method'): a bias against entry 0, the baseline in fp32 of
// --compare-precision fp32,bf16.
Timings time_interleaved(const PluginRegistry& registry, const std::vector<Entry>& entries, const TrainBenchOptions& o,
                         const Synthetic& s) {
  std::vector<std::unique_ptr<Variant>> models;
  for (const auto& entry : entries) {
    set_gemm_backend(entry.gemm);
    models.push_back(std::make_unique<Variant>(registry, options_for(*entry.run, o), s.tokens, entry.bf16));
  }
  const int64_t n = static_cast<int64_t>(models.size());
  Timings t;
  t.train_s.resize(static_cast<size_t>(n));
  t.infer_s.resize(static_cast<size_t>(n));
  const at::Device device(o.device);
  RateProbes probes(entries, device);
  t.gemm.resize(probes.size());
  for (size_t k = 0; k < entries.size(); ++k) t.probe_of.push_back(probes.of(k));
  std::unique_ptr<engine::GemmProbe> blas_probe;
  if (device.is_cpu()) blas_probe = std::make_unique<engine::GemmProbe>(2048, /*blas_only=*/true);
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = (i + j) % n;
      set_gemm_backend(entries[k].gemm);
      const auto t0 = Clock::now();
      models[k]->train_step(s.tokens, s.targets, s.outputs);
      if (i >= o.warmup) t.train_s[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (i < o.warmup) continue;
    for (size_t p = 0; p < probes.size(); ++p) t.gemm[p].push_back(probes.gflops(p));
    t.blas.push_back(blas_probe ? blas_probe->gflops() : 0);
  }
  for (int64_t i = 0; i < o.warmup + o.steps; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = (i + j) % n;
      set_gemm_backend(entries[k].gemm);
      const auto t0 = Clock::now();
      models[k]->infer(s.tokens);
      if (i >= o.warmup) t.infer_s[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  return t;
}

// Pass 3, after the timed rounds (recording slows every operator call):
// each entry's operators over o.op_time_steps training steps of its own,
// after its warm-up.
void record_op_times(const PluginRegistry& registry, const std::vector<Entry>& entries, const TrainBenchOptions& o,
                     const Synthetic& s, std::vector<TrainBenchResult>& out) {
  for (size_t k = 0; k < entries.size(); ++k) {
    set_gemm_backend(entries[k].gemm);
    Variant v(registry, options_for(*entries[k].run, o), s.tokens, entries[k].bf16);
    for (int64_t i = 0; i < std::max<int64_t>(2, o.warmup); ++i) v.train_step(s.tokens, s.targets, s.outputs);
    const OpRecorder recorder;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < o.op_time_steps; ++i) v.train_step(s.tokens, s.targets, s.outputs);
    out[k].op_times_step_ms =
        1e3 * std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(o.op_time_steps);
    out[k].op_times = recorder.times();
    for (auto& t : out[k].op_times) {
      t.self_ms /= static_cast<double>(o.op_time_steps);
      t.total_ms /= static_cast<double>(o.op_time_steps);
    }
  }
}

void add_rates(std::vector<TrainBenchResult>& out, const Timings& t, const TrainBenchOptions& o) {
  for (size_t k = 0; k < out.size(); ++k) {
    auto& r = out[k];
    r.gemm_gflops = engine::median(t.gemm[t.probe_of[k]]);
    r.blas_gflops = engine::median(t.blas);
    r.train_ms = 1e3 * engine::median(t.train_s[k]);
    r.infer_ms = 1e3 * engine::median(t.infer_s[k]);
    r.train_tokens_per_s = static_cast<double>(o.batch * o.seq) / engine::median(t.train_s[k]);
    r.infer_tokens_per_s = static_cast<double>(o.batch * o.seq) / engine::median(t.infer_s[k]);
    r.achieved_gflops = r.step_flops / engine::median(t.train_s[k]) / 1e9;
    r.train_round_s = t.train_s[k];
    r.infer_round_s = t.infer_s[k];
    r.gemm_round_gflops = t.gemm[t.probe_of[k]];
  }
}

}  // namespace

std::vector<TrainBenchResult> bench_train(const PluginRegistry& registry, const TrainBenchOptions& o) {
  check_options(o);
  engine::configure_threads(o.threads);
  const engine::Matrix m = load_variants(o);
  engine::configure_device(at::Device(o.device));  // fp32 is IEEE fp32 on a GPU, as in a run
  engine::warn_about_cpu_bf16(at::Device(o.device),
                              std::find(o.precisions.begin(), o.precisions.end(), "bf16") != o.precisions.end());
  const Synthetic batch = synthetic_batch(o);
  const std::string allocator = configure_allocator_for(m, o);

  // Every step sets its entry's library; the process's choice comes back
  // however this ends.
  struct RestoreBackend {
    GemmBackend saved = gemm_backend();
    ~RestoreBackend() { set_gemm_backend(saved); }
  } restore;
  const GemmBackend configured = restore.saved;
  const std::vector<GemmBackend> backends =
      o.gemm_backends.empty() ? std::vector<GemmBackend>{configured} : o.gemm_backends;
  const std::vector<Entry> entries = entries_for(m, backends, o.precisions);

  std::vector<TrainBenchResult> out = measure_alone(registry, entries, o, batch, allocator);
  add_rates(out, time_interleaved(registry, entries, o, batch), o);
  if (o.op_time_steps > 0) record_op_times(registry, entries, o, batch, out);
  if (!at::Device(o.device).is_cpu())
    for (auto& r : out) r.gemm = o.device;  // the device ran the products, not a CPU library
  return out;
}

}  // namespace chiar::bench
