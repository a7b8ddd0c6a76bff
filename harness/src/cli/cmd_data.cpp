#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "chiar/registry.h"
#include "engine/config/task_config.h"
#include "engine/runtime/runtime.h"
#include "engine/text/sotu.h"
#include "chiar/error.h"
#include "chiar/listops.h"
#include "commands.h"

namespace chiar::cli {
namespace {

std::string label_distribution(const std::vector<int64_t>& counts) {
  if (counts.empty()) return "-";
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  for (size_t i = 0; i < counts.size(); ++i)
    out << (i ? " " : "") << i << ":" << 100.0 * static_cast<double>(counts[i]) / std::max<int64_t>(total, 1) << "%";
  return out.str();
}

}  // namespace

int run_data_stats(const Global& g, const DataArgs& a) {
  engine::configure_threads(g.threads);
  engine::TaskConfig config;
  if (!a.config_file.empty()) {
    if (a.table.empty()) throw UserError("data stats: --table is required with a TOML file");
    config = engine::load_task_config(a.config_file, a.table);
    const Params extra = Params::from_assignments(a.set);
    for (const auto& kv : extra.values()) {
      config.params.set(kv.first, kv.second);
      config.where[kv.first] = "--set " + kv.first;
    }
  } else if (!a.task.empty()) {
    config = engine::task_config_from_assignments(a.task, a.set);
  } else {
    throw UserError("data stats: give a TOML file with --table, or --task NAME");
  }
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  engine::check_task_options(config, registry);  // keys and kinds before the task reads its data
  TaskSpec spec;
  spec.params = config.params;
  spec.data_root = a.data_root;
  spec.cache_dir = a.cache_dir;
  auto task = registry.make_task(config.plugin, spec);
  std::cout << config.name << ": " << task->describe() << "\n"
            << "vocabulary " << task->vocab_size() << ", "
            << (task->head() == TaskHead::LanguageModel ? std::string("language model")
                                                        : std::to_string(task->n_classes()) + " classes")
            << "\n\n";
  std::cout << std::left << std::setw(7) << "split" << std::right << std::setw(10) << "examples" << std::setw(12)
            << "tokens" << std::setw(12) << "words" << std::setw(12) << "bytes" << std::setw(8) << "vocab"
            << std::setw(8) << "unk %"
            << "  length p0/p50/p90/p99/max      labels\n";
  for (const auto& split : task->splits()) {
    const SplitStats s = task->stats(split);
    std::ostringstream lengths;
    for (size_t i = 0; i < s.lengths.size(); ++i) lengths << (i ? "/" : "") << s.lengths[i];
    char unk[32];
    std::snprintf(unk, sizeof unk, "%.2f",
                  s.tokens ? 100.0 * static_cast<double>(s.unknown) / static_cast<double>(s.tokens) : 0.0);
    std::cout << std::left << std::setw(7) << split << std::right << std::setw(10) << s.examples << std::setw(12)
              << s.tokens << std::setw(12) << (s.words ? std::to_string(s.words) : "-") << std::setw(12) << s.bytes
              << std::setw(8) << s.types << std::setw(8) << unk << "  " << std::left << std::setw(30) << lengths.str()
              << label_distribution(s.label_counts) << "\n";
  }
  return 0;
}

int run_data_listops(const Global&, const ListOpsArgs& a) {
  if (a.out.empty()) throw UserError("data listops: --out FILE.tsv is required");
  if (a.n < 1) throw UserError("data listops: --n must be positive");
  std::vector<ListOpsExample> examples;
  if (a.flat) {
    examples = generate_listops_flat(a.n, a.seed, a.min_args, a.max_args);
  } else {
    ListOpsOptions o;
    o.min_length = a.min_len;
    o.max_length = a.max_len;
    o.max_depth = a.max_depth;
    o.max_args = a.max_args;
    examples = generate_listops(a.n, a.seed, o);
  }
  write_listops_tsv(a.out, examples);
  std::cout << "wrote " << examples.size() << " examples to " << a.out << "\n";
  return 0;
}

int run_data_sotu(const Global&, const SotuArgs& a) {
  const engine::SotuSummary s = engine::convert_sotu(a.from, a.out, a.valid_from, a.test_from);
  const char* names[3] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i)
    std::cout << names[i] << ": " << s.speeches[i] << " speeches, " << s.words[i] << " words -> " << a.out << "/sotu."
              << names[i] << ".tokens\n";
  return 0;
}

}  // namespace chiar::cli
