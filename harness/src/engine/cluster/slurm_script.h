#pragma once
// The sbatch script that runs a matrix as a Slurm job array: array task i of
// N runs `chiar run MATRIX --shard i/N` into its own store, dir/shard-i.db
// (SQLite must not be shared over a network file system; `chiar merge`
// combines the shards). Slurm schedules; chiar writes no scheduler.
#include <string>
#include <vector>

namespace chiar::engine {

// The job's #SBATCH settings; empty or 0 leaves a setting to the cluster's defaults.
struct SlurmOptions {
  int tasks = 0;  // array tasks (shards), >= 1
  std::string partition, time, mem, account;
  int cpus_per_task = 0;  // also the threads each `chiar run` uses
  int gpus_per_task = 0;
  std::vector<std::string> extra;  // further "#SBATCH ..." lines, verbatim
};

struct SlurmJob {
  std::string name;                    // the matrix's name: the job is chiar-<name>
  std::string chiar;                   // the chiar binary, absolute
  std::string matrix;                  // the matrix file, absolute
  std::string dir;                     // shard stores and logs/, absolute
  std::string workdir;                 // where each task starts, absolute
  std::string data_root, cache_dir;    // absolute
  std::vector<std::string> set;        // --set key=value passed to every task
  std::string only;                    // --only glob passed to every task
  std::vector<std::string> task_args;  // further arguments of every task's `chiar run`, each quoted
  SlurmOptions options;
};

// 'text' for a POSIX shell: single-quoted, any ' inside closed, escaped and reopened.
std::string shell_quoted(const std::string& text);

// Checks the options a user typed (UserError naming the option: values Slurm
// would reject, or that would break the script's lines) and returns the
// script's text. Every path and value is shell-quoted.
std::string sbatch_script(const SlurmJob& job);

}  // namespace chiar::engine
