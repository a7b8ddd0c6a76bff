#include "slurm_script.h"

#include <regex>
#include <sstream>
#include <vector>

#include "chiar/error.h"

namespace chiar::engine {
namespace {

// Seconds in a --time value of a form check_options accepted.
long time_limit_seconds(const std::string& time) {
  long days = 0;
  std::string rest = time;
  const auto dash = rest.find('-');
  if (dash != std::string::npos) {
    days = std::stol(rest.substr(0, dash));
    rest = rest.substr(dash + 1);
  }
  std::vector<long> parts;
  std::stringstream in(rest);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(std::stol(part));
  long seconds = 0;
  if (dash != std::string::npos) {  // D-H[:M[:S]]
    const long units[] = {3600, 60, 1};
    for (size_t i = 0; i < parts.size(); ++i) seconds += parts[i] * units[i];
  } else if (parts.size() == 1) {  // M
    seconds = parts[0] * 60;
  } else if (parts.size() == 2) {  // M:S
    seconds = parts[0] * 60 + parts[1];
  } else {  // H:M:S
    seconds = parts[0] * 3600 + parts[1] * 60 + parts[2];
  }
  return days * 86400 + seconds;
}

void check(const std::string& option, const std::string& value, const std::regex& form, const std::string& expected) {
  if (!value.empty() && !std::regex_match(value, form))
    throw UserError(option + ": expected " + expected + ", found '" + value + "'");
}

void check_options(const SlurmOptions& o) {
  if (o.tasks < 1) throw UserError("--tasks: expected a number of array tasks >= 1, found " + std::to_string(o.tasks));
  // Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
  check("--time", o.time, std::regex(R"((\d+-\d+(:\d+){0,2})|(\d+(:\d+){0,2}))"),
        "minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]");
  if (!o.time.empty() && time_limit_seconds(o.time) < 180)
    throw UserError("--time: at least 3 minutes, found '" + o.time +
                    "' (a task gets SIGTERM 2 minutes before its limit, to checkpoint)");
  check("--mem", o.mem, std::regex(R"(\d+[KMGT]?)"), "a size such as 4000, 16G or 512M");
  const std::regex names(R"([A-Za-z0-9_.,+-]+)");
  check("--partition", o.partition, names, "partition names (letters, digits, '_', '-', '.', ',')");
  check("--account", o.account, names, "an account name (letters, digits, '_', '-', '.')");
  if (o.cpus_per_task < 0) throw UserError("--cpus-per-task: expected >= 0, found " + std::to_string(o.cpus_per_task));
  if (o.gpus_per_task < 0) throw UserError("--gpus-per-task: expected >= 0, found " + std::to_string(o.gpus_per_task));
  for (const auto& line : o.extra)
    if (line.rfind("#SBATCH ", 0) != 0 || line.find('\n') != std::string::npos)
      throw UserError("--extra: expected one line starting with '#SBATCH ', found '" + line + "'");
}

}  // namespace

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string sbatch_script(const SlurmJob& job) {
  const SlurmOptions& o = job.options;
  check_options(o);
  // The name goes into comments, the job name and an echo: plain characters only.
  check("matrix name", job.name, std::regex(R"([A-Za-z0-9_.+-]+)"),
        "letters, digits, '_', '-', '.' or '+' for a Slurm job name (set [matrix] name)");
  const std::string n = std::to_string(o.tasks);
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Written by `chiar slurm`: matrix '" << job.name << "' as a job array of " << n << " tasks.\n"
    << "# Task i runs a deterministic 1/" << n << " of the matrix (--shard i/" << n << ") into its own store,\n"
    << "# shard-i.db beside this script. Once the tasks end, combine the shards:\n"
    << "#   chiar merge " << shell_quoted(job.dir + "/merged.db") << " " << shell_quoted(job.dir) << "\n"
    << "# A preempted, requeued or resubmitted task resumes its runs from their checkpoints\n"
    << "# (--sole-writer: no other process writes its store). Submit with sbatch, or `chiar slurm --submit`.\n"
    << "#SBATCH --job-name=" << shell_quoted("chiar-" + job.name) << "\n"
    << "#SBATCH --array=1-" << n << "\n"
    << "#SBATCH --output=" << shell_quoted(job.dir + "/logs/%A_%a.out") << "\n"
    << "#SBATCH --chdir=" << shell_quoted(job.workdir) << "\n"
    << "#SBATCH --ntasks=1\n"
    << "#SBATCH --requeue\n"
    << "#SBATCH --open-mode=append\n";
  if (!o.partition.empty()) s << "#SBATCH --partition=" << o.partition << "\n";
  if (!o.account.empty()) s << "#SBATCH --account=" << o.account << "\n";
  if (!o.time.empty()) {
    s << "#SBATCH --time=" << o.time << "\n";
    // SIGTERM two minutes before the limit: the running run checkpoints and
    // is recorded interrupted, so a resubmission resumes it.
    s << "#SBATCH --signal=B:TERM@120\n";
  }
  if (o.cpus_per_task > 0) s << "#SBATCH --cpus-per-task=" << o.cpus_per_task << "\n";
  if (o.gpus_per_task > 0) s << "#SBATCH --gpus-per-task=" << o.gpus_per_task << "\n";
  if (!o.mem.empty()) s << "#SBATCH --mem=" << o.mem << "\n";
  for (const auto& line : o.extra) s << line << "\n";
  s << "\nset -euo pipefail\n"
    << "shard=\"${SLURM_ARRAY_TASK_ID:?run this script with sbatch (a job array)}\"\n"
    << "echo \"chiar-" << job.name << ": array task ${shard}/" << n
    << ", job ${SLURM_JOB_ID:-?}, on $(hostname), restart ${SLURM_RESTART_COUNT:-0}\"\n"
    // exec: chiar is the batch step's process, so the SIGTERM of scancel,
    // preemption or the time limit reaches it directly.
    << "exec " << shell_quoted(job.chiar) << " run " << shell_quoted(job.matrix) << " \\\n"
    << "  --shard \"${shard}/" << n << "\" \\\n"
    << "  --db " << shell_quoted(job.dir) << "/shard-\"${shard}\".db \\\n"
    << "  --sole-writer \\\n"
    << "  --data-root " << shell_quoted(job.data_root) << " \\\n"
    << "  --cache-dir " << shell_quoted(job.cache_dir);
  if (o.cpus_per_task > 0) s << " \\\n  --threads " << o.cpus_per_task;
  if (!job.only.empty()) s << " \\\n  --only " << shell_quoted(job.only);
  for (const auto& kv : job.set) s << " \\\n  --set " << shell_quoted(kv);
  for (size_t i = 0; i < job.task_args.size(); ++i)
    s << (i % 2 == 0 ? " \\\n  " : " ") << shell_quoted(job.task_args[i]);
  s << "\n";
  return s.str();
}

}  // namespace chiar::engine
