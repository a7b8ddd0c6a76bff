#include "world.h"

#include <cstdlib>
#include <limits>
#include <map>
#include <string>

#include "chiar/error.h"

extern char** environ;

namespace chiar::engine {
namespace {

// ------------------------------------------------------------ environment

const std::string* lookup(const std::map<std::string, std::string>& env, const std::string& name) {
  const auto it = env.find(name);
  // An empty variable reads as unset: `export RANK=` is how shells clear one.
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// The whole value as a decimal integer in [low, high], or a UserError naming
// the variable and what it holds.
long long parse_integer(const std::string& name, const std::string& value, long long low, long long high) {
  const auto out_of_range = [&] {
    return UserError(name + "=" + value + ": expected an integer " +
                     (high == std::numeric_limits<int>::max() || high == std::numeric_limits<long long>::max()
                          ? ">= " + std::to_string(low)
                          : "in " + std::to_string(low) + ".." + std::to_string(high)));
  };
  const bool negative = !value.empty() && value[0] == '-';
  const std::size_t start = negative ? 1 : 0;
  if (start == value.size() || value.find_first_not_of("0123456789", start) != std::string::npos)
    throw UserError(name + "=" + value + ": expected an integer");
  long long magnitude = 0;
  for (std::size_t i = start; i < value.size(); ++i) {
    const int digit = value[i] - '0';
    if (magnitude > (std::numeric_limits<long long>::max() - digit) / 10) throw out_of_range();
    magnitude = magnitude * 10 + digit;
  }
  const long long number = negative ? -magnitude : magnitude;
  if (number < low || number > high) throw out_of_range();
  return number;
}

int parse_int(const std::string& name, const std::string& value, int low) {
  return static_cast<int>(parse_integer(name, value, low, std::numeric_limits<int>::max()));
}

int parse_port(const std::string& name, const std::string& value) {
  const std::size_t digits = value.find_first_not_of("0123456789");
  if (value.empty() || digits != std::string::npos)
    throw UserError(name + "=" + value + ": expected a port in 1..65535");
  if (value.size() > 5 || std::stoi(value) < 1 || std::stoi(value) > 65535)
    throw UserError(name + "=" + value + ": expected a port in 1..65535");
  return std::stoi(value);
}

WorldInfo from_env_variables(const std::map<std::string, std::string>& env) {
  const std::string* rank = lookup(env, "RANK");
  const std::string* size = lookup(env, "WORLD_SIZE");
  if (!rank) throw UserError("WORLD_SIZE is set but RANK is not");
  if (!size) throw UserError("RANK is set but WORLD_SIZE is not");
  WorldInfo w;
  w.launcher = "env";
  w.rank = parse_int("RANK", *rank, 0);
  w.world_size = parse_int("WORLD_SIZE", *size, 1);
  if (w.rank >= w.world_size)
    throw UserError("RANK " + std::to_string(w.rank) + " >= WORLD_SIZE " + std::to_string(w.world_size));
  if (const std::string* local = lookup(env, "LOCAL_RANK"))
    w.local_rank = parse_int("LOCAL_RANK", *local, 0);
  else if (const std::string* slurm_local = lookup(env, "SLURM_LOCALID"))
    w.local_rank = parse_int("SLURM_LOCALID", *slurm_local, 0);
  else
    w.local_rank = w.rank;
  const std::string* addr = lookup(env, "MASTER_ADDR");
  const std::string* port = lookup(env, "MASTER_PORT");
  if (addr) w.master_addr = *addr;
  if (port) w.master_port = parse_port("MASTER_PORT", *port);
  if (w.world_size > 1) {
    const std::string needs = " (WORLD_SIZE=" + std::to_string(w.world_size) + " needs it)";
    if (!addr) throw UserError("MASTER_ADDR is not set" + needs);
    if (!port) throw UserError("MASTER_PORT is not set" + needs);
  }
  return w;
}

WorldInfo from_slurm(const std::map<std::string, std::string>& env) {
  WorldInfo w;
  w.launcher = "slurm";
  w.rank = parse_int("SLURM_PROCID", *lookup(env, "SLURM_PROCID"), 0);
  // SLURM_NPROCS is the older name. Neither is set in a batch script
  // submitted without --ntasks: one task, unless SLURM_PROCID says otherwise.
  std::string tasks_name = "SLURM_NTASKS";
  const std::string* ntasks = lookup(env, tasks_name);
  if (!ntasks) ntasks = lookup(env, tasks_name = "SLURM_NPROCS");
  if (ntasks) {
    w.world_size = parse_int(tasks_name, *ntasks, 1);
  } else if (w.rank > 0) {
    throw UserError("SLURM_PROCID is " + std::to_string(w.rank) + " but neither SLURM_NTASKS nor SLURM_NPROCS is set");
  }
  if (w.rank >= w.world_size)
    throw UserError("SLURM_PROCID " + std::to_string(w.rank) + " >= " + tasks_name + " " +
                    std::to_string(w.world_size));
  if (const std::string* local = lookup(env, "SLURM_LOCALID")) w.local_rank = parse_int("SLURM_LOCALID", *local, 0);
  if (w.world_size == 1) return w;  // no rendezvous: nothing more is needed

  if (const std::string* addr = lookup(env, "MASTER_ADDR")) {
    w.master_addr = *addr;
  } else {
    const char* lists[] = {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"};
    for (const char* name : lists)
      if (const std::string* list = lookup(env, name)) {
        w.master_addr = first_slurm_host(*list, name);
        break;
      }
    if (w.master_addr.empty())
      throw UserError(
          "none of SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST is set: set MASTER_ADDR to task 0's host");
  }
  if (const std::string* port = lookup(env, "MASTER_PORT")) {
    w.master_port = parse_port("MASTER_PORT", *port);
  } else if (const std::string* job = lookup(env, "SLURM_JOB_ID")) {
    const long long id = parse_integer("SLURM_JOB_ID", *job, 0, std::numeric_limits<long long>::max());
    w.master_port = 20000 + static_cast<int>(id % 10000);
  } else {
    throw UserError("neither MASTER_PORT nor SLURM_JOB_ID is set: set MASTER_PORT");
  }
  return w;
}

}  // namespace

std::string first_slurm_host(const std::string& host_list, const std::string& variable) {
  const auto bad = [&](const std::string& why) {
    return UserError(variable + "=" + host_list + ": cannot read its first host (" + why + ")");
  };
  // The first entry: up to the first comma outside brackets.
  std::size_t end = host_list.size();
  int depth = 0;
  for (std::size_t i = 0; i < host_list.size(); ++i) {
    const char c = host_list[i];
    if (c == '[') {
      if (++depth > 1) throw bad("nested '['");
    } else if (c == ']') {
      if (--depth < 0) throw bad("']' without '['");
    } else if (c == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  if (depth != 0) throw bad("'[' without ']'");
  const std::string entry = host_list.substr(0, end);
  // Each bracket range expands to its first value, digits kept as written.
  std::string host;
  for (std::size_t i = 0; i < entry.size(); ++i) {
    if (entry[i] != '[') {
      host += entry[i];
      continue;
    }
    const std::size_t close = entry.find(']', i);
    const std::string inside = entry.substr(i + 1, close - i - 1);
    const std::string first = inside.substr(0, inside.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      throw bad("expected numbers inside [...], found '" + inside + "'");
    host += first;
    i = close;
  }
  if (host.empty()) throw bad("empty host name");
  return host;
}

WorldInfo world_from_environment(const std::map<std::string, std::string>& env) {
  if (lookup(env, "RANK") || lookup(env, "WORLD_SIZE")) return from_env_variables(env);
  if (lookup(env, "SLURM_PROCID")) return from_slurm(env);
  return WorldInfo{};
}

WorldInfo world_from_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::size_t eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return world_from_environment(env);
}

}  // namespace chiar::engine
