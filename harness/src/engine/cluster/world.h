#pragma once
// Who this process is in a run of several processes, read from a launcher's
// environment (torchrun-style variables, or Slurm's). A malformed variable is
// a chiar::UserError naming it.
#include <map>
#include <string>

namespace chiar::engine {

// This process's place in a run. world_size == 1 (the default) is a run of
// one process: no process group, no rendezvous.
struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;             // rank among the processes on this machine
  std::string master_addr;        // host of rank 0, which serves the rendezvous store
  int master_port = 0;            // its TCP port
  std::string launcher = "none";  // "none", "env" (RANK/WORLD_SIZE...) or "slurm"

  bool distributed() const { return world_size > 1; }
};

// Reads the world from a launcher's variables, first match wins:
//  1. "env" (torchrun, `chiar run --nproc`, any launcher): RANK and
//     WORLD_SIZE, both required once either is set; MASTER_ADDR and
//     MASTER_PORT, required when WORLD_SIZE > 1; LOCAL_RANK, else
//     SLURM_LOCALID, else RANK (one machine).
//  2. "slurm" (srun): SLURM_PROCID; SLURM_NTASKS, else SLURM_NPROCS, else
//     one task (a batch script without --ntasks; SLURM_PROCID must be 0
//     then); SLURM_LOCALID (else 0). MASTER_ADDR if set, else
//     the first host of SLURM_STEP_NODELIST, SLURM_NODELIST or
//     SLURM_JOB_NODELIST (the first of those set), where srun's block
//     distribution places task 0. MASTER_PORT if set, else
//     20000 + SLURM_JOB_ID % 10000: the same on every task without any
//     exchange, and below Linux's ephemeral ports (32768 and up), so no
//     outgoing connection holds it. Two multi-task steps of one job running
//     at once need MASTER_PORT set apart.
//     Note: inside an sbatch script without srun, SLURM_NTASKS is the job's
//     task count while only one process runs; launch ranks with srun.
//  3. Otherwise a world of one ("none").
// Malformed values throw UserError naming the variable, e.g.
// "RANK=abc: expected an integer", "RANK 3 >= WORLD_SIZE 2".
// Pure: reads only `env`.
WorldInfo world_from_environment(const std::map<std::string, std::string>& env);
// The same over this process's environment.
WorldInfo world_from_environment();

// The first host of a Slurm host list, expanded: "node[01-04,07]" -> "node01",
// "a,b" -> "a", "gpu-[3,5]" -> "gpu-3", "r[1-2]-n[5-6]" -> "r1-n5".
// `variable` names the list's variable in the UserError for a malformed one.
std::string first_slurm_host(const std::string& host_list, const std::string& variable);

}  // namespace chiar::engine
