#include <cstdio>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include "bench/bench_train.h"
#include "bench/round_stats.h"
#include "chiar/registry.h"
#include "engine/runtime/device.h"
#include "engine/runtime/runtime.h"
#include "chiar/error.h"
#include "commands.h"
#include "output_file.h"

namespace chiar::cli {

namespace {

bench::TrainBenchOptions options_from(const Global& g, const BenchTrainArgs& a, const std::string& device) {
  bench::TrainBenchOptions o;
  if (!a.variants.empty()) o.variants = a.variants;
  o.variants_file = a.variants_file;
  o.vocab = a.vocab;
  o.batch = a.batch;
  o.seq = a.seq;
  o.d_model = a.d_model;
  o.layers = a.layers;
  o.heads = a.heads;
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.classes = a.classes;
  o.op_time_steps = a.op_time_steps;
  o.threads = g.threads;
  o.device = device;
  o.precisions =
      a.precisions.empty() ? std::vector<std::string>{engine::resolve_precision(a.precision, device)} : a.precisions;
  for (const auto& b : a.gemm_backends) o.gemm_backends.push_back(gemm_backend_from_string(b));
  return o;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " and ") + p;
  return out;
}

void print_header(const bench::TrainBenchOptions& o, const engine::RuntimeInfo& info) {
  const bool cpu = o.device == "cpu";
  std::cout << "bench-train: batch " << o.batch << ", seq " << o.seq << ", d " << o.d_model << ", " << o.layers
            << " layers, " << o.heads << " heads, vocab " << o.vocab
            << (o.classes > 0 ? ", classifier of " + std::to_string(o.classes) + " classes" : ", causal LM")
            << "; medians of " << o.steps << " steps after " << o.warmup
            << " warm-up, variants interleaved step by step (their order turning each round) with "
            << (cpu ? "2048^3 GEMMs" : "8192^3 GEMMs on " + o.device) << " each round; " << joined(o.precisions)
            << (cpu ? "" : "; peak MB is the host's, GPU MiB the caching allocator's peaks") << "\n"
            << engine::describe(info) << "\n\n";
}

void print_table(const std::vector<bench::TrainBenchResult>& results, bool cpu) {
  std::cout << std::left << std::setw(22) << "variant" << std::right << std::setw(12) << "train tok/s" << std::setw(12)
            << "infer tok/s" << std::setw(11) << "step ms" << std::setw(14) << "step GFLOP" << std::setw(12)
            << "GFLOP/s" << std::setw(12) << "of GEMM" << std::setw(11) << "peak MB";
  if (!cpu) std::cout << std::setw(24) << "GPU MiB alloc/reserved";
  std::cout << std::setw(10) << "train x" << std::setw(10) << "infer x"
            << "\n";
  const auto& base = results.front();
  for (const auto& r : results) {
    std::cout << std::left << std::setw(22) << r.variant << std::right << std::fixed << std::setprecision(0)
              << std::setw(12) << r.train_tokens_per_s << std::setw(12) << r.infer_tokens_per_s << std::setprecision(1)
              << std::setw(11) << r.train_ms << std::setw(14) << r.step_flops / 1e9 << std::setw(12)
              << r.achieved_gflops << std::setw(11) << 100 * r.achieved_gflops / r.gemm_gflops << "%" << std::setw(11)
              << r.peak_rss_mb;
    if (!cpu)
      std::cout << std::setprecision(0) << std::setw(24)
                << (std::to_string(static_cast<int64_t>(r.peak_gpu_allocated_mb)) + " / " +
                    std::to_string(static_cast<int64_t>(r.peak_gpu_reserved_mb)));
    std::cout << std::setprecision(2) << std::setw(10) << r.train_tokens_per_s / base.train_tokens_per_s
              << std::setw(10) << r.infer_tokens_per_s / base.infer_tokens_per_s << "\n";
  }
}

// Each GEMM rate the entries are held against, once.
void print_rates(const std::vector<bench::TrainBenchResult>& results, bool cpu) {
  std::cout << "allocator: " << results.front().allocator << "\n";
  std::cout << (cpu ? "GEMM 2048^3" : "GEMM 8192^3") << " in this process (median of the rounds):";
  std::set<std::string> shown;
  for (const auto& r : results) {
    const std::string by = r.precision == "bf16" && cpu ? "libtorch" : r.gemm;
    if (shown.insert(by + " " + r.precision).second)
      std::cout << " " << by << " " << r.precision << " " << std::setprecision(1) << r.gemm_gflops << " GFLOP/s;";
  }
  if (cpu && !shown.count("blas fp32"))
    std::cout << " libtorch's BLAS fp32 " << std::setprecision(1) << results.front().blas_gflops << " GFLOP/s;";
  std::cout << "\n\"of GEMM\" is against the rate of the library and precision that ran the variant's products; "
               "ratios are against "
            << results.front().variant << "\n";
}

// Each timed round's share of that round's GEMM rate.
std::vector<double> gemm_shares(const bench::TrainBenchResult& r) {
  std::vector<double> out;
  for (size_t i = 0; i < r.train_round_s.size() && i < r.gemm_round_gflops.size(); ++i)
    out.push_back(r.step_flops / r.train_round_s[i] / 1e9 / r.gemm_round_gflops[i]);
  return out;
}

// "1.53x [1.49, 1.57]", values times `scale`; the interval left out where
// the rounds are too few for one (the block's header says so).
std::string with_interval(const bench::MedianInterval& m, double scale, int digits, const std::string& unit) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << scale * m.median << unit;
  if (m.bounded) out << " [" << scale * m.low << ", " << scale * m.high << "]";
  return out.str();
}

// An entry's rate over the base's, round by round: the base's seconds over
// the entry's (training or inference rounds).
bench::MedianInterval paired_ratio(const std::vector<double>& base_s, const std::vector<double>& entry_s) {
  return bench::median_interval(bench::per_round_ratios(base_s, entry_s));
}

// The rounds paired (round_stats.h): each entry's share of its GEMM rate and
// its rates against the first entry's, as medians of the rounds' own values
// with distribution-free intervals, so that a target can be read against
// this run's spread and not only its medians.
void print_round_intervals(const std::vector<bench::TrainBenchResult>& results) {
  const auto& base = results.front();
  std::vector<bench::MedianInterval> shares;  // per entry
  for (const auto& r : results) shares.push_back(bench::median_interval(gemm_shares(r)));
  const auto& first = shares.front();  // every entry has the same rounds
  std::cout << "per round, paired (" << first.count << (first.count == 1 ? " round" : " rounds") << "; medians";
  if (first.bounded)
    std::cout << " [distribution-free intervals of " << std::fixed << std::setprecision(1) << 100 * first.coverage
              << "% coverage]";
  else
    std::cout << "; an interval needs 6 rounds or more";
  std::cout << "):\n";
  for (size_t k = 0; k < results.size(); ++k) {
    const auto& r = results[k];
    std::cout << "  " << std::left << std::setw(22) << r.variant << std::right << " of GEMM "
              << with_interval(shares[k], 100, 1, "%");
    if (k > 0)
      std::cout << "   train x " << with_interval(paired_ratio(base.train_round_s, r.train_round_s), 1, 2, "")
                << "   infer x " << with_interval(paired_ratio(base.infer_round_s, r.infer_round_s), 1, 2, "");
    std::cout << "\n";
  }
}

// With several precisions: each variant's rate in each against its first,
// paired by round like the block above.
void print_precision_ratios(const std::vector<bench::TrainBenchResult>& results,
                            const std::vector<std::string>& precisions) {
  if (precisions.size() < 2) return;
  const std::string first = "@" + precisions.front();
  for (const auto& r : results) {
    const auto at = r.variant.rfind('@');
    if (r.precision == precisions.front() || at == std::string::npos) continue;
    const std::string stem = r.variant.substr(0, at);
    for (const auto& base : results)
      if (base.variant == stem + first)
        std::cout << stem << ": " << r.precision << " / " << precisions.front() << " train "
                  << with_interval(paired_ratio(base.train_round_s, r.train_round_s), 1, 2, "x") << ", infer "
                  << with_interval(paired_ratio(base.infer_round_s, r.infer_round_s), 1, 2, "x")
                  << " (per round, paired)\n";
  }
}

// An operator's name as the table shows it: anonymous namespaces left out,
// an autograd node named for what it differentiates.
std::string short_name(std::string name) {
  for (const std::string anonymous = "(anonymous namespace)::";;) {
    const auto at = name.find(anonymous);
    if (at == std::string::npos) break;
    name.erase(at, anonymous.size());
  }
  const std::string node = "torch::autograd::CppNode<", engine = "autograd::engine::evaluate_function: ";
  if (name.rfind(engine, 0) == 0) return "engine: " + short_name(name.substr(engine.size()));
  if (name.rfind(node, 0) == 0 && name.back() == '>')
    return name.substr(node.size(), name.size() - node.size() - 1) + " backward";
  return name;
}

// Per entry recorded with --op-times: its operators by self time per step.
void print_op_times(const std::vector<bench::TrainBenchResult>& results, int64_t steps) {
  constexpr size_t kShown = 30;
  for (const auto& r : results) {
    if (r.op_times.empty()) continue;
    double recorded = 0;
    for (const auto& t : r.op_times) recorded += t.self_ms;
    std::cout << "\n"
              << r.variant << ": operators by self time, ms per training step (" << steps << " recorded steps of "
              << std::fixed << std::setprecision(1) << r.op_times_step_ms << " ms; their self times add up to "
              << recorded << " ms, the rest is outside any operator: the optimiser, the harness)\n"
              << std::right << std::setw(9) << "self ms" << std::setw(10) << "total ms" << std::setw(8) << "calls"
              << "  operator [inside]\n";
    double shown = 0;
    for (size_t i = 0; i < r.op_times.size() && i < kShown; ++i) {
      const auto& t = r.op_times[i];
      shown += t.self_ms;
      std::cout << std::setw(9) << std::setprecision(3) << t.self_ms << std::setw(10) << t.total_ms << std::setw(8)
                << std::setprecision(1) << static_cast<double>(t.calls) / static_cast<double>(steps) << "  "
                << short_name(t.op) << (t.scope.empty() ? "" : " [" + short_name(t.scope) + "]") << "\n";
    }
    if (r.op_times.size() > kShown)
      std::cout << std::setw(9) << std::setprecision(3) << recorded - shown << "  (" << r.op_times.size() - kShown
                << " more)\n";
    std::cout << std::defaultfloat;
  }
}

// [a, b, ...] with every digit a double holds.
std::string json_array(const std::vector<double>& values) {
  std::ostringstream out;
  out << std::setprecision(17) << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

void write_json(const std::string& path, const std::vector<bench::TrainBenchResult>& results,
                const std::string& device) {
  std::ostringstream json;
  json << "{\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    json << "  \"" << r.variant << "\": {\"train_tokens_per_s\": " << r.train_tokens_per_s
         << ", \"infer_tokens_per_s\": " << r.infer_tokens_per_s << ", \"step_flops\": " << r.step_flops
         << ", \"achieved_gflops\": " << r.achieved_gflops << ", \"gemm\": \"" << r.gemm
         << "\", \"gemm_gflops\": " << r.gemm_gflops << ", \"blas_gflops\": " << r.blas_gflops
         << ", \"peak_rss_mb\": " << r.peak_rss_mb << ", \"peak_gpu_allocated_mb\": "
         << (r.peak_gpu_allocated_mb < 0 ? std::string("null") : std::to_string(r.peak_gpu_allocated_mb))
         << ", \"peak_gpu_reserved_mb\": "
         << (r.peak_gpu_reserved_mb < 0 ? std::string("null") : std::to_string(r.peak_gpu_reserved_mb))
         << ", \"device\": \"" << device << "\", \"precision\": \"" << r.precision
         << "\", \"train_round_s\": " << json_array(r.train_round_s)
         << ", \"infer_round_s\": " << json_array(r.infer_round_s)
         << ", \"gemm_round_gflops\": " << json_array(r.gemm_round_gflops) << "}" << (i + 1 < results.size() ? "," : "")
         << "\n";
  }
  json << "}\n";
  write_output_file(path, json.str());
}

}  // namespace

int run_bench_train(const Global& g, const BenchTrainArgs& a) {
  // Refused before anything runs when this build or machine cannot give it.
  const std::string device = engine::resolve_device(a.device, "--device");
  if (!a.json.empty()) check_output_file(a.json);  // before the minutes the benchmark takes
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  const bench::TrainBenchOptions o = options_from(g, a, device);
  const engine::RuntimeInfo info = engine::probe_runtime(g.threads, g.gemm);
  const auto results = bench::bench_train(registry, o);
  print_header(o, info);
  print_table(results, device == "cpu");
  print_rates(results, device == "cpu");
  print_round_intervals(results);
  print_precision_ratios(results, o.precisions);
  print_op_times(results, o.op_time_steps);
  if (!a.json.empty()) write_json(a.json, results, device);
  return 0;
}

}  // namespace chiar::cli
