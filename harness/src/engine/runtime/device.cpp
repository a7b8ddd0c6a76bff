#include "device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <cctype>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <vector>

#include "chiar/conformance.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar_build_info.h"

namespace chiar::engine {
bool built_with_cuda() {
  // The stub hooks of a CPU-only build throw on any version query.
  try {
    at::detail::getCUDAHooks().versionCUDART();
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

namespace {

bool is_cuda_index(const std::string& name) {
  if (name.rfind("cuda:", 0) != 0 || name.size() == 5 || name.size() > 8) return false;
  for (size_t i = 5; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  return true;
}

}  // namespace

bool cuda_training_enabled() { return CHIAR_CUDA_TRAINING != 0; }

std::string device_name_problem(const std::string& name) {
  if (name == "auto" || name == "cpu" || name == "cuda" || is_cuda_index(name)) return "";
  return "must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"";
}

std::string auto_device(bool host_only) {
  if (!CHIAR_CUDA_TRAINING || host_only || !built_with_cuda()) return "cpu";
  return at::detail::getCUDAHooks().getNumGPUs() > 0 ? "cuda:0" : "cpu";
}

std::string resolve_device(const std::string& name, const std::string& origin, bool host_only) {
  if (const std::string problem = device_name_problem(name); !problem.empty())
    throw UserError(origin + ": \"" + name + "\" " + problem);
  if (name == "auto") return auto_device(host_only);
  if (name == "cpu") return "cpu";
  const std::string quoted = "\"" + name + "\"";
  if (!built_with_cuda())
    throw UserError(origin + ": " + quoted + " needs a libtorch built with CUDA; this build has none");
  const int64_t visible = at::detail::getCUDAHooks().getNumGPUs();
  const int64_t index = name == "cuda" ? 0 : std::stoll(name.substr(5));
  if (index >= visible)
    throw UserError(origin + ": " + quoted + ": this machine shows " +
                    (visible == 0 ? std::string("no CUDA device (check CUDA_VISIBLE_DEVICES and the driver)")
                                  : std::to_string(visible) + " CUDA device" + (visible == 1 ? "" : "s") + " (cuda:0" +
                                        (visible > 1 ? "..cuda:" + std::to_string(visible - 1) : "") + ")"));
  if (CHIAR_CUDA_TRAINING) return "cuda:" + std::to_string(index);
  // Refused rather than trained unchecked: every path of a step is
  // device-generic, but no GPU has run the whole of it yet.
  throw UserError(origin + ": " + quoted +
                  ": this build trains on the CPU only (CUDA training is not yet checked on a GPU: configure with "
                  "-DCHIAR_CUDA_TRAINING=ON to try it); use \"cpu\"");
}

std::string resolve_precision(const std::string& precision, const std::string& device, bool host_only) {
  if (precision != "auto") return precision;
  const bool gpu = device == "auto" ? auto_device(host_only) != "cpu"
                                    : device_name_problem(device).empty() && device.rfind("cuda", 0) == 0;
  return gpu ? "bf16" : "fp32";
}

namespace {

// nvidia-smi's name for CUDA device `index`: nvidia-smi ignores
// CUDA_VISIBLE_DEVICES, so a visible device's entry there (an index or a
// UUID) names it; without the variable the indices agree when the GPUs are
// of one kind (CUDA orders the fastest first, nvidia-smi by PCI bus).
std::string nvidia_smi_id(int64_t index) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible || !*visible) return std::to_string(index);
  std::stringstream list(visible);
  std::string entry;
  for (int64_t i = 0; std::getline(list, entry, ','); ++i)
    if (i == index) return entry;
  return std::to_string(index);
}

}  // namespace

std::string nvidia_smi_description(int64_t index) {
  const std::string id = nvidia_smi_id(index);
  if (id.find_first_not_of("0123456789abcdefABCDEF-:.GPUMI") != std::string::npos)
    return "nvidia-smi: not found or failed";
  // Bounded: a hung driver must not hold up every run's claim.
  const std::string command =
      "timeout 20 nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version "
      "--format=csv,noheader,nounits -i " +
      id + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return "nvidia-smi: not found or failed";
  std::string out;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = ::pclose(pipe);
  // name, memory (MiB), compute capability, driver
  std::vector<std::string> fields;
  std::stringstream line(out.substr(0, out.find('\n')));
  for (std::string field; std::getline(line, field, ',');) {
    const auto first = field.find_first_not_of(' '), last = field.find_last_not_of(" \r");
    fields.push_back(first == std::string::npos ? "" : field.substr(first, last - first + 1));
  }
  char* end = nullptr;
  const double mib = fields.size() == 4 ? std::strtod(fields[1].c_str(), &end) : 0;
  if (status != 0 || fields.size() != 4 || end == fields[1].c_str() || *end != '\0')
    return "nvidia-smi: not found or failed";
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB", mib / 1024.0);
  return fields[0] + ", " + memory + ", compute capability " + fields[2] + ", driver " + fields[3];
}

std::string describe_device(const std::string& resolved) {
  if (resolved.rfind("cuda:", 0) != 0) return resolved;
  // Asked once per device and process: every run of a matrix records it.
  static std::map<std::string, std::string> described;
  auto& text = described[resolved];
  if (text.empty()) {
    const int64_t index = std::stoll(resolved.substr(5));
    const auto& hooks = at::detail::getCUDAHooks();
    // The versions libtorch was built against. The cuDNN query throws in a
    // libtorch built without cuDNN: provenance says so, the run goes on.
    std::string cudnn = "none";
    try {
      cudnn = std::to_string(hooks.versionCuDNN());
    } catch (const c10::Error&) {
    }
    // The kernels' first check asks the current device whether it can load
    // them: let that be this run's.
    const c10::DeviceGuard on_device{at::Device(resolved)};
    text = resolved + " (" + nvidia_smi_description(index) + "; libtorch CUDA " +
           std::to_string(hooks.versionCUDART()) + ", cuDNN " + cudnn + "; harness CUDA kernels " +
           cuda_kernels_state() + ")";
  }
  return text;
}

at::Device torch_device(const std::string& resolved) { return at::Device(resolved); }

void check_batch_targets(const Batch& host, int64_t top, bool vocabulary, const std::string& where) {
  const at::Tensor& targets = host.targets;
  if (targets.scalar_type() != at::kLong || !targets.device().is_cpu())
    throw UserError(where + ": targets must be int64 in host memory, found " + c10::str(targets.scalar_type()) +
                    " on " + targets.device().str());
  const auto flat = targets.contiguous();
  const int64_t* t = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (t[i] >= 0 && t[i] < top) continue;
    std::vector<int64_t> index(static_cast<size_t>(flat.dim()));  // i as [b, t] (or [b])
    for (int64_t dim = flat.dim() - 1, rest = i; dim >= 0; --dim) {
      index[static_cast<size_t>(dim)] = rest % flat.size(dim);
      rest /= flat.size(dim);
    }
    throw UserError(where + ": target " + std::to_string(t[i]) + " at " + c10::str(at::IntArrayRef(index)) +
                    " is outside the " + (vocabulary ? "vocabulary" : "classes") + " [0, " + std::to_string(top) + ")");
  }
}

void configure_device(const at::Device& device) {
  if (device.is_cuda()) at::globalContext().setAllowTF32CuBLAS(false);
}

std::string cpu_bf16_instructions() {
  static const std::string found = [] {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, flags;
    while (std::getline(cpuinfo, line))
      if (line.rfind("flags", 0) == 0) {
        flags = " " + line.substr(line.find(':') + 1) + " ";
        break;
      }
    std::string out;
    for (const char* name : {"avx512_bf16", "amx_bf16"})
      if (flags.find(std::string(" ") + name + " ") != std::string::npos)
        out += (out.empty() ? "" : ", ") + std::string(name);
    return out;
  }();
  return found;
}

void warn_about_cpu_bf16(const at::Device& device, bool bf16) {
  if (!bf16 || !device.is_cpu()) return;
  static std::once_flag once;
  std::call_once(once, [] {
    if (cpu_bf16_instructions().empty())
      std::cerr << "warning: precision \"bf16\" on this CPU: it has no bf16 instructions (avx512_bf16, amx_bf16), so "
                   "libtorch converts to fp32 around every product and the run trains slower than in \"fp32\"; it "
                   "goes on"
                << std::endl;
    if (!cpu_bf16_sums_in_fp32())
      std::cerr << "warning: precision \"bf16\" on this CPU: libtorch's bf16 matrix products here sum in bf16 "
                   "(512 products of ones give 256), so every long sum loses most of its precision; use \"fp32\" "
                   "on this machine"
                << std::endl;
  });
}

void synchronize_device(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

Batch batch_on(const Batch& batch, const at::Device& device) {
  if (device.is_cpu()) return batch;
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.pin_memory().to(device, /*non_blocking=*/true) : t; };
  return {move(batch.tokens), move(batch.targets), move(batch.valid), move(batch.scored)};
}

}  // namespace chiar::engine
