#include "runner.h"

#include <unistd.h>

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <boost/filesystem.hpp>

#include "model/model.h"
#include "engine/cluster/data_parallel.h"
#include "engine/cluster/process_group.h"
#include "engine/config/option_table.h"
#include "engine/runtime/build_commit.h"
#include "engine/runtime/device.h"
#include "engine/runtime/gpu_memory.h"
#include "engine/runtime/runtime.h"
#include "engine/runtime/stop_signals.h"
#include "chiar/error.h"
#include "chiar/linear.h"
#include "engine/training/trainer.h"

namespace chiar::engine {
namespace {

std::string task_key(const TaskConfig& c) { return c.plugin + "|" + c.params.describe(); }

// Rank 0's word to the other ranks of a data-parallel matrix, per run.
const char* const kTrain = "train";
const char* const kSkip = "skip";
const char* const kEnd = "end";  // rank 0 stops here (every run seen, or interrupted)

// A run failed on rank 0 of a process group: the matrix cannot go on.
struct RankAbort : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string format_eta(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return buf;
}

using Tasks = std::map<std::string, std::shared_ptr<Task>>;  // by task_key

// Whether a run of this status is skipped: finished for good, unless it
// failed and failed runs are retried.
bool skipped_as_finished(RunStatus status, bool retry_failed) {
  return is_final(status) && !(retry_failed && status == RunStatus::Failed);
}

// Prints the runs, their hashes and whether each would run or be skipped.
int list_runs(const Matrix& matrix, const std::string& db, bool retry_failed) {
  // Read-only: a dry run neither creates nor migrates the store.
  const std::map<std::string, RunStatus> status = read_stored_runs(db).status;
  std::cout << matrix.runs.size() << " runs in matrix '" << matrix.name << "' (" << matrix.file << "), store " << db
            << "\n";
  for (const auto& r : matrix.runs) {
    auto it = status.find(r.hash);
    const std::string s = it == status.end() ? "new" : to_string(it->second);
    const bool skip = it != status.end() && skipped_as_finished(it->second, retry_failed);
    std::cout << "  " << r.hash << "  " << std::left << std::setw(10) << (skip ? "skip" : "run") << std::setw(12) << s
              << r.name() << "\n";
  }
  return 0;
}

// A matrix whose every run is finished has nothing to do: no data is loaded.
// Read-only, and before anything else: a database that is not a store is
// refused untouched.
bool all_finished(const Matrix& matrix, const std::string& db, bool retry_failed) {
  const StoredRuns stored = read_stored_runs(db);
  size_t finished = 0;
  for (const auto& r : matrix.runs) {
    const auto it = stored.status.find(r.hash);
    finished += it != stored.status.end() && skipped_as_finished(it->second, retry_failed);
  }
  if (finished != matrix.runs.size()) return false;
  // The other commands read only the current schema: migrate an older store.
  if (!stored.current) Store(db, StoreAccess::ReadWrite);
  std::cout << "matrix '" << matrix.name << "': all " << finished << " runs finished before; results in " << db << "\n";
  return true;
}

// A run's model options as JSON: with its task, what its model is built
// from (the seed, which no check depends on, is not among them; sweep
// points and a task's model overrides are).
std::string model_key(const RunSpec& r) {
  toml::table t;
  for (const auto& f : model_option_fields()) f.write(r.model, t);
  std::ostringstream json;
  json << toml::json_formatter{t};
  return json.str();
}

// Validate everything before anything runs: each task once, each model once.
Tasks load_tasks_and_check_models(const Matrix& matrix, const PluginRegistry& registry, const RunnerOptions& options) {
  Tasks tasks;
  std::set<std::pair<std::string, std::string>> probed;  // (task key, model key)
  for (const auto& r : matrix.runs) {
    const std::string key = task_key(r.task_config);
    if (!tasks.count(key)) {
      TaskSpec spec;
      spec.params = r.task_config.params;
      spec.data_root = options.data_root;
      spec.cache_dir = options.cache_dir;
      try {
        tasks[key] = registry.make_task(r.task_config.plugin, spec);
      } catch (const UserError& e) {
        throw UserError(matrix.where.at("tasks." + r.task) + ": task '" + r.task + "': " + e.what());
      }
    }
    if (!probed.emplace(key, model_key(r)).second) continue;
    const std::string at =
        matrix.where.at("variants." + r.variant) + ": variant '" + r.variant + "' on task '" + r.task + "'";
    try {
      model::ChiarModel probe(registry, model_options_for(r, *tasks[key]));
    } catch (const UserError& e) {
      throw UserError(at + ": " + e.what());
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      throw EnvironmentError(
          at + ": out of memory building the model on the CPU, before any run: " + out_of_memory_message(e));
    }
  }
  return tasks;
}

// Starts the failed runs among `runs` again and names them (retry_failed_runs).
size_t restart_failed(Store& store, const std::vector<RunSpec>& runs, const std::string& db, std::ostream& report) {
  const std::vector<std::string> names = store.restart_failed(runs);
  if (names.empty()) return 0;
  report << "retrying " << names.size() << " failed " << (names.size() == 1 ? "run" : "runs")
         << " from the start (their records in " << db << " are replaced):";
  for (const auto& name : names) report << " " << name;
  report << "\n";
  return names.size();
}

Provenance provenance_of(const RuntimeInfo& runtime) {
  Provenance prov;
  const BuildCommit built = build_commit();
  prov.git_commit = built.commit;
  prov.git_dirty = built.dirty;
  prov.torch_version = runtime.torch_version;
  prov.blas = runtime.blas;
  prov.gemm_gflops = runtime.gemm_gflops;
  prov.gemm = runtime.gemm;
  prov.host = runtime.host;
  prov.cpu = runtime.cpu;
  prov.build_type = runtime.build_type;
  prov.allocator = runtime.allocator;
  prov.device = "cpu";
  prov.pid = getpid();
  return prov;
}

// What the runs of one matrix share.
struct Session {
  const PluginRegistry& registry;
  const Tasks& tasks;
  Store& store;
  Provenance prov;             // threads, allocator and gemm set per run
  const RuntimeInfo& runtime;  // this process's threads (when a run sets none) and product library
  int threads;                 // RunnerOptions::threads
  bool sole_writer;            // RunnerOptions::sole_writer
  ProcessGroup* group;         // a data-parallel run's ranks (this is rank 0); null for one process
  std::string device;          // RunnerOptions::device
  std::string checkpoints;     // <db>.checkpoints
  bool tty;
  size_t total;  // runs in the matrix

  const Task& task_of(const RunSpec& spec) const { return *tasks.at(task_key(spec.task_config)); }
};

// The run's spec with the command line's thread count, and the provenance
// (threads, allocator) it is claimed with.
RunSpec prepare_run(Session& s, const RunSpec& run) {
  RunSpec spec = run;
  if (s.threads > 0) spec.train.threads = s.threads;
  if (!s.device.empty()) spec.train.device = s.device;
  // The spec keeps the device it trains on; the store, its description.
  spec.train.device = resolve_device(spec.train.device, "train.device", s.group != nullptr);
  s.prov.device = describe_device(spec.train.device);
  s.prov.threads = spec.train.threads > 0 ? static_cast<int>(spec.train.threads) : s.runtime.threads;
  const Task& task = s.task_of(spec);
  const model::ModelOptions mo = model_options_for(spec, task);
  s.prov.allocator = configure_allocator(estimate_activation_bytes(
      spec.train.batch_size, task.seq_len(), mo.d_model(), static_cast<int64_t>(mo.layers().size()),
      mo.ffn_mult() * mo.d_model(), mo.head() == TaskHead::LanguageModel ? mo.vocab_size() : 0));
  return spec;
}

// A checkpoint of a run this database never started belongs to an
// earlier database of the same name (deleted or replaced): resuming
// from it would record a run without its training (a final-step
// checkpoint "finishes" at once, at 0 tokens/s).
// Every checkpoint file goes (state-<step>.pt, best-<step>.pt, temporary
// files, a schema-4 store's state.pt and best.pt); spec.toml is rewritten.
void discard_stale_checkpoints(const std::string& run_checkpoints, const std::string& tag) {
  namespace fs = boost::filesystem;
  boost::system::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(run_checkpoints, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if (ext == ".pt" || ext == ".tmp") stale.push_back(it->path());
  }
  for (const auto& file : stale)
    if (!fs::remove(file, ec) && ec)
      throw EnvironmentError(file.string() + ": cannot remove a stale checkpoint: " + ec.message());
  if (!stale.empty())
    std::cout << tag << ": discarded checkpoints in " << run_checkpoints << " that this database has no record of\n"
              << std::flush;
}

// Step, loss, tokens/s and ETA: one line rewritten in place on a terminal,
// otherwise a line per log interval.
std::function<void(int64_t, double, double)> progress_printer(const std::string& tag, const TrainOptions& train,
                                                              bool tty) {
  return [tag, steps = train.steps, log_every = train.log_every, tty, t0 = std::chrono::steady_clock::now(),
          last_print = int64_t{0}, first = int64_t{-1}](int64_t step, double loss, double tps) mutable {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A resumed run's pace counts from the step this process began at.
    if (first < 0) first = step - 1;
    const double eta = elapsed / static_cast<double>(step - first) * static_cast<double>(steps - step);
    std::ostringstream line;
    line << tag << "  step " << step << "/" << steps << "  loss " << std::fixed << std::setprecision(4) << loss << "  "
         << std::setprecision(0) << tps << " tok/s  ETA " << format_eta(eta);
    if (tty) {
      std::cout << "\r" << line.str() << "\033[K" << std::flush;
    } else if (step - last_print >= log_every || step == steps) {
      std::cout << line.str() << "\n" << std::flush;
      last_print = step;
    }
  };
}

// How a run the matrix reached ended, for the tallies and the exit status.
enum class RunEnd { Skipped, Finished, Failed, Interrupted, OutOfMemory };

// Records a finished training's outcome in the store and on the console.
RunEnd record_outcome(Store& store, const RunSpec& spec, const TrainResult& result, const std::string& tag) {
  switch (result.outcome) {
    case RunStatus::Done:
      store.finish(spec.hash, RunStatus::Done, "", -1, result.summary);
      std::cout << tag << ": done in " << std::fixed << std::setprecision(1) << result.summary.train_seconds << " s\n";
      return RunEnd::Finished;
    case RunStatus::Diverged:
      store.finish(spec.hash, RunStatus::Diverged, result.error, result.diverged_step, result.summary);
      std::cout << tag << ": diverged (" << result.error << ")\n";
      return RunEnd::Finished;
    case RunStatus::Interrupted:
      store.finish(spec.hash, RunStatus::Interrupted, "interrupted by a signal", -1, result.summary);
      std::cout << tag << ": interrupted; " << result.resumption << "\n";
      return RunEnd::Interrupted;
    case RunStatus::Pending:
    case RunStatus::Running:
    case RunStatus::Failed:  // train_run throws instead
      break;
  }
  throw std::logic_error(std::string("train_run ended a run as ") + to_string(result.outcome));
}

// A run stopped by its environment (a checkpoint or store write failed) is
// not at fault: it is marked interrupted, with the cause, so that the next
// `chiar run` resumes it. The store may be what failed; a second failure to
// record it leaves the run 'running' under a dead process, which resumes too.
void mark_interrupted_by_environment(Store& store, const RunSpec& spec, const EnvironmentError& e) {
  try {
    store.finish(spec.hash, RunStatus::Interrupted, e.what(), -1, {});
  } catch (const std::exception&) {
  }
}

// A run that ran out of memory is recorded interrupted, not failed: on a
// device with more memory (the device is not part of the hash) the next
// `chiar run` resumes it from its last checkpoint, and with a smaller
// train.batch it is another run. One process goes on with the matrix's other
// runs, which may fit; a process group cannot (see train_and_record), so it
// stops as for a failing environment.
RunEnd record_out_of_memory(Session& s, const RunSpec& spec, const std::string& tag, const std::exception& e) {
  const std::string message = "out of memory on " + spec.train.device + ": " + out_of_memory_message(e);
  if (s.tty) std::cout << "\n";
  std::cout << tag << ": " << message << "\n"
            << tag << ": recorded interrupted, to resume on a device with more memory\n";
  s.store.finish(spec.hash, RunStatus::Interrupted, message, -1, {});
  if (s.group) throw EnvironmentError(tag + ": " + message + "; the process group stops (rerun to resume)");
  // The next run starts from an empty cache, not one fragmented by this one.
  release_gpu_cache(torch_device(spec.train.device));
  return RunEnd::OutOfMemory;
}

// Trains a claimed run; a run that throws is recorded as failed, except for
// a failing environment, which is recorded as interrupted and rethrown for
// the CLI to report (exit status 3), and memory running out, recorded as
// interrupted too (record_out_of_memory).
RunEnd train_and_record(Session& s, const RunSpec& spec, const std::string& tag, const std::string& run_checkpoints) {
  TrainContext ctx{s.registry,
                   s.task_of(spec),
                   &s.store,
                   run_checkpoints,
                   &stop_requested(),
                   progress_printer(tag, spec.train, s.tty),
                   tag,
                   s.group};
  ctx.device = spec.train.device;
  TrainResult result;
  try {
    result = train_run(spec, ctx);
  } catch (const EnvironmentError& e) {
    if (s.tty) std::cout << "\n" << std::flush;
    mark_interrupted_by_environment(s.store, spec, e);
    throw;
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) return record_out_of_memory(s, spec, tag, e);
    const std::string message = message_of(e);
    if (s.tty) std::cout << "\n";
    std::cout << tag << ": failed: " << message << "\n";
    s.store.finish(spec.hash, RunStatus::Failed, message, -1, {});
    // The other ranks may still be inside this run's collectives: the
    // group cannot go on to the next run in step, so the matrix stops here
    // (rerunning skips the failed run).
    if (s.group) throw RankAbort(tag + ": failed on rank 0; the process group stops (rerun to go on)");
    return RunEnd::Failed;
  }
  if (s.tty) std::cout << "\n";
  return record_outcome(s.store, spec, result, tag);
}

// Claims the index-th run (1-based), then trains it unless it is finished or
// another process holds it.
RunEnd claim_and_train(Session& s, const RunSpec& run, int64_t index) {
  const RunSpec spec = prepare_run(s, run);
  const RunGemm gemm = gemm_for_run(s.runtime, s.store.recorded_gemm(spec.hash));
  set_gemm_backend(gemm_backend_from_string(gemm.library));
  s.prov.gemm = gemm.record;
  s.prov.gemm_gflops = gemm.library == "blas" ? s.runtime.blas_gflops : s.runtime.onednn_gflops;
  bool resumed = false;
  const ClaimOutcome claim = s.store.claim(spec, s.prov, &resumed, s.sole_writer);
  const std::string tag = "[" + std::to_string(index) + "/" + std::to_string(s.total) + "] " + spec.name();
  // The other ranks train exactly the runs rank 0 claims, on its library.
  if (s.group) s.group->broadcast_string(claim == ClaimOutcome::Claimed ? kTrain : kSkip);
  if (claim != ClaimOutcome::Claimed) {
    std::cout << tag << ": "
              << (claim == ClaimOutcome::Done ? "finished before, skipped" : "running in another process, skipped")
              << "\n";
    return RunEnd::Skipped;
  }
  if (s.group) s.group->broadcast_string(gemm.library);
  std::cout << tag << (resumed ? ": resuming" : ": starting") << " (" << spec.hash << ")"
            << (gemm.note.empty() ? "" : "; " + gemm.note) << "\n"
            << std::flush;
  const std::string run_checkpoints = s.checkpoints + "/" + spec.hash;
  if (!resumed) discard_stale_checkpoints(run_checkpoints, tag);
  return train_and_record(s, spec, tag, run_checkpoints);
}

// Trains every run this process claims, then prints the tallies. Runs that
// ran out of memory end the command as a failing environment (exit status 3)
// once the others have run; failed ones with status 1.
int run_claimed(Session& session, const Matrix& matrix, const std::string& db) {
  int64_t index = 0, ran = 0, skipped = 0, failed = 0, out_of_memory = 0;
  for (const auto& run : matrix.runs) {
    const RunEnd end = claim_and_train(session, run, ++index);
    if (end == RunEnd::Skipped) {
      ++skipped;
      continue;
    }
    ++ran;
    if (end == RunEnd::Failed || end == RunEnd::OutOfMemory) {
      ++(end == RunEnd::Failed ? failed : out_of_memory);
      if (stop_requested().load()) return 130;
      continue;
    }
    if (end == RunEnd::Interrupted || stop_requested().load()) return 130;
  }
  std::cout << "matrix '" << matrix.name << "': " << ran << " run, " << skipped << " skipped";
  if (failed > 0) std::cout << ", " << failed << " failed (the error of each is above and in runs.error)";
  if (out_of_memory > 0) std::cout << ", " << out_of_memory << " out of memory";
  std::cout << "; results in " << db << "\n";
  if (out_of_memory > 0)
    throw EnvironmentError(db + ": " + std::to_string(out_of_memory) + (out_of_memory == 1 ? " run" : " runs") +
                           " ran out of memory and " + (out_of_memory == 1 ? "is" : "are") +
                           " recorded interrupted: rerun on a device with more memory to resume " +
                           (out_of_memory == 1 ? "it" : "them") + ", or lower train.batch (a new run)");
  // The matrix goes on past a failed run, but scripts and CI must see it.
  return failed > 0 ? 1 : 0;
}

// The ranks other than 0 of a data-parallel matrix: for each run rank 0
// claims, the same training over this rank's slices, with no store, no
// checkpoint and no console output of their own.
int follow_rank_zero(const Matrix& matrix, const PluginRegistry& registry, const Tasks& tasks,
                     const RunnerOptions& options, ProcessGroup& group) {
  configure_threads(options.threads);
  StopSignals signals;
  bool ended = false;
  for (const auto& run : matrix.runs) {
    const std::string word = group.broadcast_string("");
    if (word == kEnd) {
      ended = true;
      break;
    }
    if (word != kTrain) continue;
    // The same library behind the products as rank 0's, so every rank computes alike.
    set_gemm_backend(gemm_backend_from_string(group.broadcast_string("")));
    RunSpec spec = run;
    if (options.threads > 0) spec.train.threads = options.threads;
    const Task& task = *tasks.at(task_key(spec.task_config));
    train_run(spec, TrainContext{registry, task, nullptr, "", &stop_requested(), {}, "", &group});
  }
  if (!ended) group.broadcast_string("");  // rank 0's kEnd after the last run
  group.barrier();
  return 0;
}

}  // namespace

int run_matrix(const Matrix& matrix, const PluginRegistry& registry, const RunnerOptions& options) {
  const std::string db = options.db.empty() ? "results/" + matrix.name + ".db" : options.db;
  if (options.dry_run) return list_runs(matrix, db, options.retry_failed);
  const WorldInfo world = world_from_environment();
  check_batches_divide(matrix, world.world_size);
  // Rank 0 goes through every run even when all finished before: the other
  // ranks wait for its word on each.
  if (!world.distributed() && all_finished(matrix, db, options.retry_failed)) return 0;
  const Tasks tasks = load_tasks_and_check_models(matrix, registry, options);
  std::unique_ptr<ProcessGroup> group;
  if (world.distributed()) {
    ProcessGroupOptions po;
    // Rank 0 validates, checkpoints and scores test splits while the others
    // wait in their next collective: the limit covers that. A rank that dies
    // closes its connections and is noticed at once.
    po.timeout = std::chrono::minutes(30);
    group = std::make_unique<ProcessGroup>(world, po);
    if (group->rank() != 0) return follow_rank_zero(matrix, registry, tasks, options, *group);
  }

  boost::filesystem::create_directories(boost::filesystem::absolute(db).parent_path());
  Store store(db);
  if (options.retry_failed) restart_failed(store, matrix.runs, db, std::cout);
  store.register_runs(matrix.runs);
  const RuntimeInfo runtime = probe_runtime(options.threads, options.gemm);
  std::cerr << describe(runtime) << "\n";
  Provenance prov = provenance_of(runtime);
  prov.processes = world.world_size;

  StopSignals signals;
  // Checkpoints belong to their database: <db>.checkpoints/<run hash>/.
  Session session{registry,
                  tasks,
                  store,
                  std::move(prov),
                  runtime,
                  options.threads,
                  options.sole_writer,
                  group.get(),
                  options.device,
                  boost::filesystem::absolute(db).string() + ".checkpoints",
                  isatty(STDOUT_FILENO) != 0,
                  matrix.runs.size()};
  try {
    const int status = run_claimed(session, matrix, db);
    if (group) {
      group->broadcast_string(kEnd);
      group->barrier();
    }
    return status;
  } catch (const RankAbort& e) {
    std::cerr << "chiar: " << e.what() << "\n";
    return 1;
  }
}

size_t retry_failed_runs(const Matrix& matrix, const std::string& db, std::ostream& report) {
  Store store(db);
  return restart_failed(store, matrix.runs, db, report);
}

}  // namespace chiar::engine
