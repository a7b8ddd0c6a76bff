#include "device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#include <cctype>

#include "chiar/error.h"

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

std::string device_name_problem(const std::string& name) {
  if (name == "auto" || name == "cpu" || name == "cuda" || is_cuda_index(name)) return "";
  return "must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"";
}

std::string resolve_device(const std::string& name, const std::string& origin) {
  if (const std::string problem = device_name_problem(name); !problem.empty())
    throw UserError(origin + ": \"" + name + "\" " + problem);
  if (name == "auto" || name == "cpu") return "cpu";
  const std::string quoted = "\"" + name + "\"";
  if (!built_with_cuda())
    throw UserError(origin + ": " + quoted + " needs a libtorch built with CUDA; this build has none");
  const int64_t visible = at::detail::getCUDAHooks().getNumGPUs();
  const int64_t index = name == "cuda" ? 0 : std::stoll(name.substr(5));
  if (index >= visible)
    throw UserError(origin + ": " + quoted + ": this machine shows " +
                    (visible == 0 ? std::string("no CUDA device (check CUDA_VISIBLE_DEVICES and the driver)")
                                  : std::to_string(visible) + " CUDA device" + (visible == 1 ? "" : "s") +
                                        " (cuda:0" + (visible > 1 ? "..cuda:" + std::to_string(visible - 1) : "") +
                                        ")"));
  // Refused rather than silently trained on the CPU: the fused CPU kernels
  // (attention core, row kernels, LayerNorm, GELU, LM head, AdamW, route
  // mixing) have no CUDA paths yet.
  throw UserError(origin + ": " + quoted +
                  ": this version of chiar trains on the CPU only (its fused kernels have no CUDA paths yet); use "
                  "\"cpu\"");
}

}  // namespace chiar::engine
