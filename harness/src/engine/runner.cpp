#include "runner.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include <boost/filesystem.hpp>

#include <c10/util/Exception.h>

#include "../core/model.h"
#include "../core/runtime.h"
#include "chiar/error.h"
#include "trainer.h"

namespace chiar::engine {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) { g_stop.store(true); }

struct SignalScope {
  SignalScope() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  struct sigaction old_int_ {}, old_term_ {};
};

std::string task_key(const TaskConfig& c) { return c.plugin + "|" + c.params.describe(); }

std::string format_eta(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return buf;
}

}  // namespace

int run_matrix(const Matrix& matrix, const PluginRegistry& registry, const RunnerOptions& options) {
  const std::string db = options.db.empty() ? "results/" + matrix.name + ".db" : options.db;
  if (options.dry_run) {
    std::map<std::string, std::string> status;
    if (boost::filesystem::exists(db)) {
      Store store(db);
      auto q = store.db().prepare("SELECT hash, status FROM runs");
      while (q.step()) status[q.text(0)] = q.text(1);
    }
    std::cout << matrix.runs.size() << " runs in matrix '" << matrix.name << "' (" << matrix.file << "), store " << db << "\n";
    for (const auto& r : matrix.runs) {
      auto it = status.find(r.hash);
      const std::string s = it == status.end() ? "new" : it->second;
      const bool skip = s == "done" || s == "failed" || s == "diverged";
      std::cout << "  " << r.hash << "  " << std::left << std::setw(10) << (skip ? "skip" : "run") << std::setw(12) << s
                << r.name() << "\n";
    }
    return 0;
  }

  // A matrix whose every run is finished has nothing to do: no data is loaded.
  if (boost::filesystem::exists(db)) {
    Store store(db);
    size_t finished = 0;
    for (const auto& r : matrix.runs) {
      const std::string s = store.status(r.hash);
      finished += s == "done" || s == "failed" || s == "diverged";
    }
    if (finished == matrix.runs.size()) {
      std::cout << "matrix '" << matrix.name << "': all " << finished << " runs finished before; results in " << db << "\n";
      return 0;
    }
  }

  // Validate everything before anything runs: each task once, each model once.
  std::map<std::string, std::shared_ptr<Task>> tasks;
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
    try {
      ChiarModel probe(registry, model_options_for(r, *tasks[key]));
    } catch (const UserError& e) {
      throw UserError(matrix.where.at("variants." + r.variant) + ": variant '" + r.variant + "' on task '" + r.task +
                      "': " + e.what());
    }
  }

  boost::filesystem::create_directories(boost::filesystem::absolute(db).parent_path());
  Store store(db);
  store.register_runs(matrix.runs);
  const RuntimeInfo runtime = probe_runtime(options.threads, options.gemm);
  std::cerr << describe(runtime) << "\n";
  Provenance prov;
  std::tie(prov.git_commit, prov.git_dirty) = git_state(".");
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

  SignalScope signals;
  g_stop.store(false);
  const bool tty = isatty(STDOUT_FILENO);
  // Checkpoints belong to their database: <db>.checkpoints/<run hash>/.
  const std::string checkpoints = boost::filesystem::absolute(db).string() + ".checkpoints";
  int64_t index = 0, ran = 0, skipped = 0, failed = 0;
  for (const auto& run : matrix.runs) {
    ++index;
    RunSpec spec = run;
    if (options.threads > 0) spec.train.threads = options.threads;
    prov.threads = spec.train.threads > 0 ? static_cast<int>(spec.train.threads) : runtime.threads;
    {
      const Task& task = *tasks.at(task_key(spec.task_config));
      const ModelOptions mo = model_options_for(spec, task);
      prov.allocator = configure_allocator(estimate_activation_bytes(
          spec.train.batch_size, task.seq_len(), mo.d_model_, static_cast<int64_t>(mo.layers_.size()),
          mo.ffn_mult_ * mo.d_model_, mo.head_ == HeadKind::LanguageModel ? mo.vocab_size_ : 0));
    }
    bool resumed = false;
    const Claim claim = store.claim(spec, prov, &resumed);
    const std::string tag = "[" + std::to_string(index) + "/" + std::to_string(matrix.runs.size()) + "] " + spec.name();
    if (claim != Claim::Claimed) {
      ++skipped;
      std::cout << tag << ": " << (claim == Claim::Done ? "finished before, skipped" : "running in another process, skipped") << "\n";
      continue;
    }
    ++ran;
    std::cout << tag << (resumed ? ": resuming" : ": starting") << " (" << spec.hash << ")\n" << std::flush;
    const std::string run_checkpoints = checkpoints + "/" + spec.hash;
    if (!resumed) {
      // A checkpoint of a run this database never started belongs to an
      // earlier database of the same name (deleted or replaced): resuming
      // from it would record a run without its training (a final-step
      // checkpoint "finishes" at once, at 0 tokens/s).
      bool stale = false;
      for (const char* file : {"state.pt", "best.pt"})
        stale |= boost::filesystem::remove(run_checkpoints + "/" + file);
      if (stale)
        std::cout << tag << ": discarded checkpoints in " << run_checkpoints
                  << " that this database has no record of\n" << std::flush;
    }
    const auto t0 = std::chrono::steady_clock::now();
    int64_t last_print = 0;
    TrainContext ctx{registry, *tasks.at(task_key(spec.task_config)), store,
                     run_checkpoints, &g_stop,
                     [&](int64_t step, double loss, double tps) {
                       const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                       const double eta = elapsed / static_cast<double>(step) * static_cast<double>(spec.train.steps - step);
                       std::ostringstream line;
                       line << tag << "  step " << step << "/" << spec.train.steps << "  loss " << std::fixed
                            << std::setprecision(4) << loss << "  " << std::setprecision(0) << tps << " tok/s  ETA "
                            << format_eta(eta);
                       if (tty) {
                         std::cout << "\r" << line.str() << "\033[K" << std::flush;
                       } else if (step - last_print >= spec.train.log_every || step == spec.train.steps) {
                         std::cout << line.str() << "\n" << std::flush;
                         last_print = step;
                       }
                     }};
    TrainResult result;
    try {
      result = train_run(spec, ctx);
    } catch (const std::exception& e) {
      // libtorch errors carry a backtrace; the record keeps the message.
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
      if (tty) std::cout << "\n";
      std::cout << tag << ": failed: " << message << "\n";
      store.finish(spec.hash, "failed", message, -1, {});
      ++failed;
      continue;
    }
    if (tty) std::cout << "\n";
    switch (result.outcome) {
      case Outcome::Done:
        store.finish(spec.hash, "done", "", -1, result.summary);
        std::cout << tag << ": done in " << std::fixed << std::setprecision(1) << result.summary.train_seconds << " s\n";
        break;
      case Outcome::Diverged:
        store.finish(spec.hash, "diverged", result.error, result.diverged_step, result.summary);
        std::cout << tag << ": diverged (" << result.error << ")\n";
        break;
      case Outcome::Interrupted:
        store.finish(spec.hash, "interrupted", "interrupted by a signal", -1, result.summary);
        std::cout << tag << ": interrupted; checkpoint saved, rerun to resume\n";
        return 130;
    }
    if (g_stop.load()) return 130;
  }
  std::cout << "matrix '" << matrix.name << "': " << ran << " run, " << skipped << " skipped";
  if (failed > 0) std::cout << ", " << failed << " failed (the error of each is above and in runs.error)";
  std::cout << "; results in " << db << "\n";
  // The matrix goes on past a failed run, but scripts and CI must see it.
  return failed > 0 ? 1 : 0;
}

std::vector<std::string> result_columns() {
  return {"run", "status", "metric", "value", "attn_gflops", "total_gflops", "train_tok_s", "eval_tok_s", "params",
          "overhead_%"};
}

std::vector<ResultRow> read_results(const std::string& db) {
  if (!boost::filesystem::exists(db)) throw UserError(db + ": no such database");
  Store store(db);
  auto q = store.db().prepare(
      "SELECT name, status, COALESCE(metric_name, ''), main_metric, attention_gflops, total_gflops, "
      "train_tokens_per_s, eval_tokens_per_s, params, 100 * overhead_fraction FROM results "
      "ORDER BY task, variant, seed");
  std::vector<ResultRow> rows;
  while (q.step()) {
    ResultRow row;
    for (int c = 0; c < q.columns(); ++c) {
      if (q.is_null(c)) {
        row.cells.push_back("");
        continue;
      }
      std::ostringstream s;
      if (c >= 3 && c <= 5) s << std::setprecision(5) << q.real(c);
      else if (c == 6 || c == 7) s << std::fixed << std::setprecision(0) << q.real(c);
      else if (c == 9) s << std::fixed << std::setprecision(2) << q.real(c);
      else s << q.text(c);
      row.cells.push_back(s.str());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace chiar::engine
