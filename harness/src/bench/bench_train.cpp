#include "bench_train.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <string>

#include "../core/model.h"
#include "../core/runtime.h"
#include "../engine/accounting.h"
#include "../engine/matrix.h"
#include "chiar/error.h"

namespace chiar::bench {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

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

}  // namespace

std::vector<TrainBenchResult> bench_train(const PluginRegistry& registry, const TrainBenchOptions& o) {
  if (o.steps < 1 || o.batch < 1 || o.seq < 1) throw UserError("bench-train: steps, batch and seq must be positive");
  if (o.classes < 0 || o.classes == 1) throw UserError("bench-train: --classes must be 0 (language model) or at least 2");
  configure_threads(o.threads);
  // The variants' definitions, through a one-task matrix over them.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.variants_file, ec))
    throw UserError(o.variants_file + ": cannot open the file");
  const std::string variants = std::filesystem::absolute(o.variants_file).string();
  std::string matrix = "include = [\"" + variants + "\"]\n[matrix]\nname = \"bench\"\ntasks = [\"synthetic\"]\nvariants = [";
  for (size_t i = 0; i < o.variants.size(); ++i) matrix += (i ? ", \"" : "\"") + o.variants[i] + "\"";
  matrix += "]\n[tasks.synthetic]\nplugin = \"none\"\n";
  const std::string tmp = "/tmp/chiar-bench-" + std::to_string(::getpid()) + ".toml";
  { std::ofstream(tmp) << matrix; }
  engine::Matrix m;
  try {
    m = engine::load_matrix(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::remove(tmp.c_str());
  const double gemm = measure_gemm_gflops(2048, 5);

  std::vector<TrainBenchResult> out;
  for (const auto& run : m.runs) {
    TrainBenchResult r;
    r.variant = run.variant;
    r.gemm_gflops = gemm;
    ModelOptions mo = run.model;
    mo.vocab_size(o.vocab).d_model(o.d_model).n_heads(o.heads).layers(stretch(run.model.layers_, o.layers)).seed(0);
    if (o.classes > 0) mo.head(HeadKind::Classifier).n_classes(o.classes);
    else mo.head(HeadKind::LanguageModel);
    r.allocator = configure_allocator(estimate_activation_bytes(o.batch, o.seq, o.d_model, o.layers,
                                                                mo.ffn_mult_ * o.d_model, o.classes > 0 ? 0 : o.vocab));
    reset_peak_rss();
    ChiarModel model(registry, mo);
    const auto longs = at::TensorOptions().dtype(at::kLong);
    auto tokens = at::randint(o.vocab, {o.batch, o.seq}, longs);  // (B, T)
    auto targets = o.classes > 0 ? at::randint(o.classes, {o.batch}, longs)           // (B,)
                                 : at::randint(o.vocab, {o.batch, o.seq}, longs);  // (B, T)
    const int64_t outputs = o.classes > 0 ? o.classes : o.vocab;
    model.calibrate_routers(tokens);
    torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}));
    model.train();
    std::vector<double> train_s;
    for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      auto out_i = model.forward(tokens);
      auto loss = at::cross_entropy_loss(out_i.logits.reshape({-1, outputs}), targets.reshape({-1}));
      if (out_i.aux_loss.defined()) loss = loss + out_i.aux_loss;
      loss.backward();
      opt.step();
      if (i >= o.warmup) train_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    model.eval();
    std::vector<double> infer_s;
    ModelOutput last;
    {
      at::NoGradGuard no_grad;
      for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
        const auto t0 = Clock::now();
        last = model.forward(tokens);
        if (i >= o.warmup) infer_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    // FLOPs of a training step as executed, from the model's own accounting
    // (training-mode routing decides dense or sparse per layer).
    model.train();
    {
      at::NoGradGuard no_grad;
      last = model.forward(tokens);
    }
    const auto acc = engine::account(model, last, {}, o.seq);
    for (const auto& row : acc.flops) r.step_flops += row.train_executed * static_cast<double>(o.batch);
    r.train_ms = 1e3 * median(train_s);
    r.infer_ms = 1e3 * median(infer_s);
    r.train_tokens_per_s = static_cast<double>(o.batch * o.seq) / median(train_s);
    r.infer_tokens_per_s = static_cast<double>(o.batch * o.seq) / median(infer_s);
    r.achieved_gflops = r.step_flops / median(train_s) / 1e9;
    r.peak_rss_mb = peak_rss_mb();
    out.push_back(r);
  }
  return out;
}

}  // namespace chiar::bench
