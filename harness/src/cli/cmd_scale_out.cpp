// chiar slurm (a matrix as a Slurm job array) and chiar merge (its shard
// stores combined into one).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "chiar/registry.h"
#include "engine/cluster/slurm_script.h"
#include "engine/config/matrix.h"
#include "engine/runner.h"
#include "engine/store/merge.h"
#include "engine/store/store.h"
#include "engine/training/durable_file.h"
#include "commands.h"
#include "cmd_decide.h"
#include "sequential_rounds.h"
#include "matrix_checks.h"

namespace chiar::cli {
namespace {
namespace fs = boost::filesystem;

std::string absolute(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

// Runs `sbatch --parsable script` and returns the job id it prints.
std::string submit(const std::string& script) {
  const std::string command = "sbatch --parsable " + engine::shell_quoted(script) + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  if (!p) throw EnvironmentError("sbatch: cannot start it: " + std::string(std::strerror(errno)));
  std::string output;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), p)) output += buf.data();
  const int status = pclose(p);
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code == 127)
    throw EnvironmentError("sbatch: not found on PATH (is this a Slurm submit host?); the script is " + script);
  if (code != 0) {
    // Slurm unreachable or unconfigured (no slurm.conf and no DNS SRV record
    // naming a controller) is the environment; anything else sbatch refused
    // is the request.
    const bool unreachable = output.find("Unable to contact") != std::string::npos ||
                             output.find("Socket timed out") != std::string::npos ||
                             output.find("Connection refused") != std::string::npos ||
                             output.find("Could not establish a configuration source") != std::string::npos;
    const std::string message = script + ": sbatch refused the job: " + output;
    if (unreachable) throw EnvironmentError(message);
    throw UserError(message);
  }
  // --parsable prints "<job id>[;<cluster>]" as its last line (warnings may come first).
  const std::string last =
      output.substr(output.find_last_of('\n') == std::string::npos ? 0 : output.find_last_of('\n') + 1);
  const std::string id = last.substr(0, last.find(';'));
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos)
    throw EnvironmentError(script + ": sbatch printed no job id: " + output);
  return id;
}

// The shard stores of a job folder: every shard-K.db in it, whatever task
// count wrote them (an earlier submission may have had more tasks).
std::vector<std::string> shard_stores(const std::string& dir) {
  std::vector<std::string> shards;
  boost::system::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // shard-K.db: "shard-", digits, ".db".
    const std::string name = it->path().filename().string();
    const bool shaped = name.size() > 9 && name.rfind("shard-", 0) == 0 && name.compare(name.size() - 3, 3, ".db") == 0;
    if (shaped && name.substr(6, name.size() - 9).find_first_not_of("0123456789") == std::string::npos)
      shards.push_back(it->path().string());
  }
  if (ec && ec != boost::system::errc::no_such_file_or_directory)
    throw EnvironmentError(dir + ": cannot list the folder: " + ec.message());
  std::sort(shards.begin(), shards.end());
  return shards;
}

// Starts the failed runs recorded in `shards` again as new
// (engine::retry_failed_runs).
void retry_failed_in_shards(const engine::Matrix& matrix, const std::vector<std::string>& shards,
                            const std::string& dir) {
  size_t retried = 0;
  // On stderr: stdout is the script, for review or redirection.
  for (const auto& shard : shards) retried += engine::retry_failed_runs(matrix, shard, std::cerr);
  if (retried == 0) std::cerr << "--retry-failed: no run of the matrix is recorded failed in " << dir << "\n";
}

// How many of `runs` are in each status in the store `db` ("missing": not there).
std::map<std::string, int> statuses(const std::vector<engine::RunSpec>& runs, const std::string& db) {
  const auto status = engine::read_stored_runs(db).status;
  std::map<std::string, int> out;
  for (const auto& r : runs) {
    const auto it = status.find(r.hash);
    ++out[it == status.end() ? "missing" : engine::to_string(it->second)];
  }
  return out;
}

// With --decide: the design kept in DIR/design/sequential.db. When the
// current round's runs have all ended in the shard stores, its looks are
// taken and recorded. Returns the round the next array runs (-1: the design
// is done) and sets the tasks' arguments for it.
int sequential_step(const SlurmArgs& a, const engine::Matrix& matrix, const PluginRegistry& registry,
                    engine::SlurmJob& job) {
  SequentialRounds rounds({absolute(a.decide), a.baseline, a.max_seeds, a.rounds}, matrix);
  const std::string design_db = job.dir + "/design/sequential.db";
  const auto shards = shard_stores(job.dir);
  if (!shards.empty() && !fs::exists(design_db))
    throw UserError(job.dir +
                    ": holds shard stores made without a sequential design; a design starts in a new "
                    "folder (--dir)");
  open_design(design_db, rounds);
  std::cerr << rounds.describe() << "\n";
  int k = rounds.current_round();
  if (k >= 0 && !shards.empty()) {
    const engine::StoreView view(shards);
    const auto round_runs = rounds.runs_of(static_cast<size_t>(k));
    auto counts = statuses(round_runs, view.db());
    // Two arrays on the same shard stores would train the same runs at once.
    if (counts["running"] > 0)
      throw UserError("round " + std::to_string(k + 1) + " has " + std::to_string(counts["running"]) +
                      " runs still running in " + job.dir +
                      ": run this again when its array has ended (if its "
                      "tasks died, submit " +
                      job.dir + "/slurm.sbatch again as it is)");
    if (counts["done"] + counts["failed"] + counts["diverged"] == static_cast<int>(round_runs.size())) {
      std::cerr << "round " << k + 1 << " has ended in " << view.label() << ":\n";
      engine::Store design(design_db);
      rounds.look(static_cast<size_t>(k), view.db(), report::OperatorCatalog(registry), design, std::cerr);
      k = rounds.current_round();
    }
  }
  if (k < 0) {
    std::cerr << rounds.summary() << "; merge the runs and the design, and report: chiar merge " << job.dir
              << "/merged.db " << job.dir << " " << design_db << " && chiar report " << job.dir
              << "/merged.db --claims " << a.decide << "\n";
    return -1;
  }
  job.task_args = {"--decide",     absolute(a.decide),
                   "--round-from", design_db,
                   "--round",      std::to_string(k + 1),
                   "--rounds",     std::to_string(a.rounds),
                   "--max-seeds",  std::to_string(rounds.record().max_seeds)};
  if (!a.baseline.empty()) job.task_args.insert(job.task_args.end(), {"--baseline", a.baseline});
  std::cerr << "round " << k + 1 << " of " << rounds.rounds() << ": " << rounds.runs_of(static_cast<size_t>(k)).size()
            << " runs; run this command again when its array has ended\n";
  return k;
}

}  // namespace

std::string own_binary() {
  std::array<char, 4096> buf{};
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw EnvironmentError("/proc/self/exe: cannot find the chiar binary");
  return std::string(buf.data(), static_cast<size_t>(n));
}

namespace {

// The matrix, checked against the loaded plugins and the array's size here
// rather than by every array task once Slurm starts it.
engine::Matrix checked_matrix(const Global& g, const SlurmArgs& a, PluginRegistry& registry) {
  engine::MatrixOptions m;
  m.set = a.set;
  m.only = a.only;
  engine::Matrix matrix = engine::load_matrix(a.config, m);
  registry.load_default(g.plugin_dirs);
  check_against_plugins(matrix, registry);
  const int runs = static_cast<int>(matrix.runs.size());
  if (a.tasks > runs)
    throw UserError("--tasks " + std::to_string(a.tasks) + ": the matrix has " + std::to_string(runs) +
                    " runs; more array tasks than runs would leave some with nothing to do");
  if (!a.decide.empty() && a.retry_failed)
    throw UserError(
        "--retry-failed: not with --decide, whose looks count a failed run as ended; retry the "
        "shards first, then look");
  return matrix;
}

// The array job the script describes, every path absolute.
engine::SlurmJob job_for(const SlurmArgs& a, const engine::Matrix& matrix) {
  engine::SlurmJob job;
  job.name = matrix.name;
  job.chiar = a.chiar.empty() ? own_binary() : absolute(a.chiar);
  job.matrix = absolute(a.config);
  job.dir = absolute(a.dir.empty() ? "results/" + matrix.name : a.dir);
  job.workdir = fs::current_path().string();
  job.data_root = absolute(a.data_root);
  job.cache_dir = absolute(a.cache_dir);
  job.set = a.set;
  job.only = a.only;
  job.options.tasks = a.tasks;
  job.options.partition = a.partition;
  job.options.time = a.time;
  job.options.mem = a.mem;
  job.options.account = a.account;
  job.options.cpus_per_task = a.cpus_per_task;
  job.options.gpus_per_task = a.gpus_per_task;
  job.options.extra = a.extra;
  return job;
}

// The script in JOB/slurm.sbatch and its logs folder (Slurm opens each
// task's log before the task runs: the folder must exist); with
// --retry-failed, every shard store checked writable before anything is
// written, and their failed runs reset once here, not in the tasks (a task
// Slurm requeues after preemption must not retry a deterministic failure).
std::string write_job(const SlurmArgs& a, const engine::Matrix& matrix, const engine::SlurmJob& job,
                      const std::string& script_text) {
  std::vector<std::string> shards;
  if (a.retry_failed) {
    shards = shard_stores(job.dir);
    for (const auto& shard : shards) engine::Store::check_writable(shard);
  }
  boost::system::error_code ec;
  fs::create_directories(job.dir + "/logs", ec);
  if (ec) throw EnvironmentError(job.dir + "/logs: cannot create the folder: " + ec.message());
  const std::string script = job.dir + "/slurm.sbatch";
  engine::write_file_durably(script, script_text);
  if (a.retry_failed) retry_failed_in_shards(matrix, shards, job.dir);
  return script;
}

}  // namespace

int run_slurm(const Global& g, const SlurmArgs& a) {
  PluginRegistry registry;
  const engine::Matrix matrix = checked_matrix(g, a, registry);
  engine::SlurmJob job = job_for(a, matrix);
  std::string script_text = engine::sbatch_script(job);  // the options checked before anything is written
  // The design's looks go to its store, not to the shard stores the
  // script's tasks write: the same store is written by one process at a time.
  std::string covers = std::to_string(matrix.runs.size()) + " runs";  // what the array runs, for the messages
  std::string after = "when it ends: chiar merge " + job.dir + "/merged.db " + job.dir;
  if (!a.decide.empty()) {
    const int round = sequential_step(a, matrix, registry, job);
    if (round < 0) return 0;
    script_text = engine::sbatch_script(job);
    covers = "round " + std::to_string(round + 1) + " of a sequential design";
    after = "when it ends: this command again, to look at the round and submit the next";
  }
  const std::string script = write_job(a, matrix, job, script_text);
  if (!a.submit) {
    std::cout << script_text;
    std::cerr << "wrote " << script << " (" << a.tasks << " array tasks over " << covers
              << "); submit it with sbatch, or again with --submit\n";
    return 0;
  }
  const std::string id = submit(script);
  std::cout << "submitted job " << id << ": " << a.tasks << " tasks, script " << script << "\n"
            << "logs " << job.dir << "/logs/" << id << "_<task>.out; " << after << "\n";
  return 0;
}

int run_merge(const Global&, const MergeArgs& a) {
  // A folder of shards may hold the output of an earlier merge: skipped.
  const std::vector<std::string> inputs = engine::expand_store_paths(a.inputs, a.out);
  const engine::MergeResult r = engine::merge_stores(a.out, inputs);
  std::cout << "merged " << r.inputs << (r.inputs == 1 ? " store" : " stores") << " into " << a.out << ": " << r.added
            << " runs added, " << r.updated << " updated, " << r.unchanged << " unchanged\n";
  return 0;
}

}  // namespace chiar::cli
