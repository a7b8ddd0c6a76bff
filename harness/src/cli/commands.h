#pragma once
// The bodies of the chiar subcommands. main.cpp owns argument parsing; each
// function gets plain values and returns the process exit status. Errors are
// thrown as chiar::UserError (bad input, exit status 2) or
// chiar::EnvironmentError (the system failed, exit status 3) and reported by main.
#include <cstdint>
#include <string>
#include <vector>

namespace chiar::cli {

struct Global {
  std::vector<std::string> argv;  // the command line as given (--nproc relaunches it)
  int threads = 0;                // 0 = all cores
  std::string gemm = "auto";      // the library behind the model's products: auto, blas, onednn
  std::vector<std::string> plugin_dirs;
};

// Sets the threads and checks the BLAS once (a 512^3 GEMM, a small one-off
// cost: docs/performance.md, 'GEMM libraries'); warns on stderr when the BLAS
// is slow or OpenBLAS runs kernels older than the processor (blas_warning in
// engine/runtime/runtime.h). Commands that compute call it.
void start_compute(const Global& g);

int run_info(const Global& g);
int run_plugins(const Global& g);
// Prints the options reference that docs/options.md holds.
int run_options(const Global& g);
int run_entropy(const Global& g, const std::string& input, const std::string& dct_impl);

struct ModelArgs {
  std::vector<std::string> layers;
  std::string router;                     // required when a layer is routed
  std::vector<std::string> router_set;    // key=value
  std::vector<std::string> operator_set;  // op.key=value
  std::string head = "lm";
  std::string meta_router = "none";
  int64_t vocab = 8192, d_model = 256, heads = 4, classes = 2;
  int64_t batch = 0, seq = 0;  // > 0: run one forward pass and print routing shares
  uint64_t seed = 0;
};
int run_model(const Global& g, const ModelArgs& a);

struct DataArgs {
  std::string config_file, table, task;
  std::vector<std::string> set;  // key=value
  std::string data_root, cache_dir;
};
int run_data_stats(const Global& g, const DataArgs& a);

struct ListOpsArgs {
  int64_t n = 0;
  uint64_t seed = 0;
  int64_t min_len = 500, max_len = 2000, max_depth = 10, max_args = 10, min_args = 4;
  bool flat = false;
  std::string out;
};
int run_data_listops(const Global& g, const ListOpsArgs& a);

struct SotuArgs {
  std::string from, out;
  int valid_from = 1981, test_from = 2001;
};
int run_data_sotu(const Global& g, const SotuArgs& a);

struct RunArgs {
  std::string config, db, only, shard, data_root, cache_dir;
  std::vector<std::string> set;
  bool dry_run = false;
  bool sole_writer = false;   // no other process writes the store (RunnerOptions::sole_writer)
  bool retry_failed = false;  // failed runs start again (RunnerOptions::retry_failed)
  int nproc = 1;              // > 1: data-parallel over this many local processes (engine/cluster/launcher.h)
  std::string device;         // overrides train.device (engine/runtime/device.h); empty: the matrix's
  // --decide CLAIMS: rounds of seeds by a group-sequential design (report/sequential.h)
  std::string decide, baseline;
  int max_seeds = 0;  // 0: every seed the matrix lists
  int rounds = 3;
  std::string round_from;  // a Slurm array task: the design store `chiar slurm --decide` keeps
  int round = 0;           // with round_from: the round (1-based) the task was written for
};
int run_run(const Global& g, const RunArgs& a);

// A matrix as a Slurm job array (engine/cluster/slurm_script.h).
struct SlurmArgs {
  std::string config, dir, chiar, only, data_root, cache_dir;
  std::vector<std::string> set;
  int tasks = 0, cpus_per_task = 0, gpus_per_task = 0;
  std::string partition, time, mem, account;
  std::vector<std::string> extra;
  bool submit = false;
  bool retry_failed = false;  // failed runs in the shard stores start again, once, before the job
  // --decide CLAIMS: one array per round of a group-sequential design (as RunArgs)
  std::string decide, baseline;
  int max_seeds = 0, rounds = 3;
};
int run_slurm(const Global& g, const SlurmArgs& a);

// The chiar binary this process runs (what Slurm array tasks and --nproc
// ranks start). EnvironmentError when /proc/self/exe cannot be read.
std::string own_binary();

struct MergeArgs {
  std::string out;
  std::vector<std::string> inputs;  // stores, or folders of them
};
int run_merge(const Global& g, const MergeArgs& a);

// show, export and report read one store, several, or folders of them
// (several are merged into a temporary store first: engine/store/merge.h).
struct ShowArgs {
  std::vector<std::string> dbs;
  std::string out;
  bool csv = false, json = false;
};
int run_show(const Global& g, const ShowArgs& a);
int run_export(const Global& g, const ShowArgs& a);

struct ReportArgs {
  std::vector<std::string> dbs;
  std::string out;
  std::string baseline;           // empty: "baseline", where the stores have it; given: must name a variant they hold
  std::string claims;             // empty: report::default_claims_file()
  bool allow_mixed_code = false;  // judge claim rows whose runs come from several code states
};
int run_report(const Global& g, const ReportArgs& a);

// Seeds by design: from a pilot store, the seeds each comparison of the
// claims needs (report/seed_plan.h), as a table and as TOML for the matrix.
struct PlanArgs {
  std::string config;              // the matrix the main run will use
  std::vector<std::string> pilot;  // the pilot store(s)
  std::string claims, baseline, out;
  double power = 0.8;
  int max_seeds = 50;
};
int run_plan(const Global& g, const PlanArgs& a);

struct InspectArgs {
  std::string db, run, checkpoint = "best", text, file, html, corpus, color = "auto", data_root, cache_dir;
  bool tsv = false;
  int64_t top = 15, min_count = 5, max_tokens = 20000;
};
int run_inspect(const Global& g, const InspectArgs& a);

struct BenchTrainArgs {
  std::vector<std::string> variants;
  std::string variants_file = "configs/variants.toml", json;
  int64_t vocab = 8192, batch = 8, seq = 256, d_model = 256, layers = 4, heads = 4, steps = 10, warmup = 3;
  int64_t classes = 0;
  std::string device = "auto";             // engine/runtime/device.h
  std::string precision = "auto";          // auto: bf16 on a GPU, fp32 on the CPU
  std::vector<std::string> gemm_backends;  // compare these libraries (blas, onednn); empty: --gemm's choice
  std::vector<std::string> precisions;     // compare these (fp32, bf16); empty: --precision's one
  int64_t op_time_steps = 0;               // --op-times: steps recorded operator by operator
};
int run_bench_train(const Global& g, const BenchTrainArgs& a);

struct NewPluginArgs {
  std::string kind, name, dir = ".";
};
int run_new_plugin(const Global& g, const NewPluginArgs& a);

}  // namespace chiar::cli
