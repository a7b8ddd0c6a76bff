#include <algorithm>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>
#include <string>

#include <boost/filesystem.hpp>

#include "chiar/registry.h"

#include "engine/cluster/data_parallel.h"
#include "engine/cluster/launcher.h"
#include "engine/cluster/process_group.h"
#include "engine/config/suggest.h"
#include "engine/runner.h"
#include "engine/runtime/device.h"
#include "engine/runtime/runtime.h"
#include "engine/store/merge.h"
#include "engine/store/results.h"
#include "engine/training/trainer.h"
#include "report/claims.h"
#include "report/tabular.h"
#include "report/report.h"
#include "chiar/error.h"
#include "cmd_decide.h"
#include "commands.h"
#include "matrix_checks.h"
#include "output_file.h"

namespace chiar::cli {
namespace {

// Every run's device checked against this build and machine (engine/runtime/device.h)
// before a store, a data file or a rank is touched. The processes of a
// data-parallel run (--nproc, or ranks a launcher started) average gradients
// over Gloo in host memory: they train on the CPU.
void check_devices_of(const RunArgs& a, const engine::Matrix& matrix, bool data_parallel) {
  std::vector<std::string> checked;
  for (const auto& r : matrix.runs) {
    const std::string name = a.device.empty() ? r.train.device : a.device;
    if (std::find(checked.begin(), checked.end(), name) != checked.end()) continue;
    checked.push_back(name);
    std::string origin = !a.device.empty() ? "--device" : matrix.origin_of(r, "train.device");
    if (origin.empty()) origin = "train.device";
    if (engine::resolve_device(name, origin, data_parallel) != "cpu" && data_parallel)
      throw UserError(origin + ": \"" + name +
                      "\": the processes of a data-parallel run average gradients over Gloo in host memory; train on "
                      "\"cpu\", or in one process on the GPU");
  }
}

// `chiar run ... --nproc N`: the same command line, less --nproc, as N
// ranks on this machine (engine/cluster/launcher.h). Without --threads each rank
// gets an equal share of the cores.
int launch_ranks(const Global& g, const RunArgs& a) {
  if (engine::world_from_environment().distributed())
    throw UserError("--nproc " + std::to_string(a.nproc) +
                    ": this process is already one rank of a launched world (RANK/WORLD_SIZE or Slurm's "
                    "SLURM_PROCID/SLURM_NTASKS are set); use one launcher, not both");
  std::vector<std::string> argv{own_binary()};
  for (size_t i = 1; i < g.argv.size(); ++i) {
    const std::string& arg = g.argv[i];
    if (arg == "--nproc") {
      ++i;
      continue;
    }
    if (arg.rfind("--nproc=", 0) == 0) continue;
    argv.push_back(arg);
  }
  if (g.threads == 0) {
    argv.push_back("--threads");
    argv.push_back(std::to_string(std::max(1, engine::usable_cores() / a.nproc)));
  }
  const engine::LaunchResult r = engine::launch_local_ranks(a.nproc, argv);
  if (r.exit_status == 0) return 0;
  std::cerr << "chiar: " << r.message << "\n";
  // Interrupted here (SIGINT/SIGTERM forwarded): 130 as for one process. A
  // rank killed by a signal is the environment failing: 3, rerun to resume.
  if (r.message.rfind("interrupted", 0) == 0) return 130;
  return r.message.find(" died ") != std::string::npos ? 3 : r.exit_status;
}

}  // namespace

int run_run(const Global& g, const RunArgs& a) {
  if (!a.decide.empty() && (a.nproc > 1 || (!a.shard.empty() && a.round_from.empty())))
    throw UserError(
        "--decide: runs its rounds of seeds in this process; it does not take --nproc or --shard "
        "(chiar slurm --decide runs a round as a job array)");
  engine::MatrixOptions m;
  m.set = a.set;
  m.only = a.only;
  const bool data_parallel = a.nproc > 1 || engine::world_from_environment().distributed();
  m.device = a.device;
  m.host_only = data_parallel;
  if (!a.shard.empty()) {
    const auto slash = a.shard.find('/');
    try {
      m.shard_index = std::stoi(a.shard.substr(0, slash));
      m.shard_count = std::stoi(a.shard.substr(slash + 1));
    } catch (const std::exception&) {
      throw UserError("--shard: expected K/N, found '" + a.shard + "'");
    }
    if (slash == std::string::npos || m.shard_count < 1 || m.shard_index < 1 || m.shard_index > m.shard_count)
      throw UserError("--shard: expected K/N with 1 <= K <= N, found '" + a.shard + "'");
  }
  const engine::Matrix matrix = engine::load_matrix(a.config, m);
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  check_against_plugins(matrix, registry);
  if (!a.dry_run) check_devices_of(a, matrix, data_parallel);
  engine::check_loss_reads_setting();
  if (a.nproc > 1 && !a.dry_run) {
    engine::check_batches_divide(matrix, a.nproc);  // before any rank starts
    return launch_ranks(g, a);
  }
  engine::RunnerOptions o;
  o.db = a.db;
  o.data_root = a.data_root;
  o.cache_dir = a.cache_dir;
  o.dry_run = a.dry_run;
  o.threads = g.threads;
  o.gemm = g.gemm;
  o.sole_writer = a.sole_writer;
  o.retry_failed = a.retry_failed;
  o.device = a.device;
  if (!a.round_from.empty()) {
    engine::MatrixOptions whole = m;  // the rounds are the whole matrix's
    whole.shard_index = whole.shard_count = 1;
    return run_sequential_round(a, engine::load_matrix(a.config, whole), matrix, registry, o);
  }
  if (!a.decide.empty()) return run_sequential(a, matrix, registry, o);
  return engine::run_matrix(matrix, registry, o);
}

// The report's default name: the store's, or the folder's for a folder of
// shards; "merged" for several paths.
std::string default_report_name(const std::vector<std::string>& paths) {
  if (paths.size() != 1) return "merged";
  const boost::filesystem::path p = boost::filesystem::path(paths[0]).lexically_normal();
  const std::string stem = (p.filename() == "." ? p.parent_path() : p).stem().string();
  return stem.empty() ? "merged" : stem;
}

int run_report(const Global& g, const ReportArgs& a) {
  const std::string out = a.out.empty() ? "reports/" + default_report_name(a.dbs) : a.out;
  const std::string claims = a.claims.empty() ? report::default_claims_file() : a.claims;
  report::load_claims(claims);  // a bad claims file is refused before the stores are read
  const engine::StoreView view(a.dbs);
  // A baseline asked for by name must be there: without it the report's
  // reductions and speed-ups would be blank, not wrong, and easy to miss.
  if (!a.baseline.empty()) {
    const auto variants = engine::ResultsReader(view.db()).variants();
    if (std::find(variants.begin(), variants.end(), a.baseline) == variants.end())
      throw UserError("--baseline: " + view.label() + " holds no run of variant '" + a.baseline + "'" +
                      engine::did_you_mean(a.baseline, variants));
  }
  PluginRegistry registry;  // operators' names, colours and roles
  registry.load_default(g.plugin_dirs);
  const auto files = report::write_report(view.db(), out, a.baseline.empty() ? "baseline" : a.baseline, claims,
                                          registry, view.label(), a.allow_mixed_code);
  std::cout << "wrote " << files.markdown << ", " << files.html << ", " << files.images.size()
            << " charts, and the claims table as " << files.claims_csv << " and " << files.claims_json << "\n";
  return 0;
}

namespace {

// The operators whose FLOPs count as attention, by their traits: what
// show's and export's attn_gflops sum, as the report does.
std::set<std::string> attention_operators(const Global& g) {
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  std::set<std::string> out;
  for (const auto& e : registry.entries())
    if (e.kind == "operator" && registry.operator_traits(e.name).attention_flops) out.insert(e.name);
  return out;
}

}  // namespace

int run_show(const Global& g, const ShowArgs& a) {
  const engine::StoreView view(a.dbs);
  const auto columns = engine::result_columns();
  const auto rows = engine::read_results(view.db(), attention_operators(g));
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    width[c] = columns[c].name.size();
    for (const auto& r : rows) width[c] = std::max(width[c], r.cells[c].size());
  }
  for (size_t c = 0; c < columns.size(); ++c)
    std::cout << std::left << std::setw(static_cast<int>(width[c]) + 2) << columns[c].name;
  std::cout << "\n";
  for (const auto& r : rows) {
    for (size_t c = 0; c < columns.size(); ++c)
      std::cout << std::left << std::setw(static_cast<int>(width[c]) + 2) << r.cells[c];
    std::cout << "\n";
  }
  if (rows.empty()) std::cout << "(no finished runs)\n";
  return 0;
}

int run_export(const Global& g, const ShowArgs& a) {
  if (a.csv == a.json) throw UserError("export: give exactly one of --csv and --json");
  const engine::StoreView view(a.dbs);
  const auto columns = engine::result_columns();
  const auto rows = engine::read_results(view.db(), attention_operators(g));
  if (!a.out.empty()) check_output_file(a.out);
  std::ostringstream out;
  if (a.csv) {
    for (size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c].name;
    out << "\n";
    for (const auto& r : rows) {
      for (size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << report::csv_cell(r.cells[c]);
      out << "\n";
    }
  } else {
    out << "[";
    for (size_t i = 0; i < rows.size(); ++i) {
      out << (i ? ",\n " : "\n ") << "{";
      for (size_t c = 0; c < columns.size(); ++c) {
        const std::string& v = rows[i].cells[c];
        out << (c ? ", " : "") << report::json_string(columns[c].name) << ": "
            << (v.empty()           ? "null"
                : columns[c].number ? v
                                    : report::json_string(v));
      }
      out << "}";
    }
    out << "\n]\n";
  }
  if (a.out.empty())
    std::cout << out.str();
  else
    write_output_file(a.out, out.str());
  return 0;
}

}  // namespace chiar::cli
