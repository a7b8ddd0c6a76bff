#include "fixtures.h"

#include "chiar/error.h"

#include <cmath>
#include <stdexcept>

namespace chiar::test {

const PluginRegistry& plugins() {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();  // lives to process exit, like the plugins
    r->load_default();
    return r;
  }();
  return *registry;
}

std::vector<GemmBackend> gemm_backends() {
  std::vector<GemmBackend> out{GemmBackend::Blas};
  if (onednn_available()) out.push_back(GemmBackend::OneDnn);
  return out;
}

bool attention_has_sdpa() {
  static const bool has = [] {
    OperatorSpec spec;
    spec.d_model = 8;
    spec.n_heads = 2;
    spec.params.set("core", std::string("sdpa"));
    try {
      plugins().make_operator("attention", spec);
      return true;
    } catch (const UserError&) {
      return false;  // "core \"sdpa\" needs libtorch 2.1 or newer", checked in [operator]
    }
  }();
  return has;
}

double rel_error(const at::Tensor& a, const at::Tensor& b) {
  auto da = a.detach().to(at::kDouble), db = b.detach().to(at::kDouble);
  const double num = (da - db).norm().item<double>();
  return num / std::max(db.norm().item<double>(), 1e-30);
}

double gradcheck(const std::function<at::Tensor()>& loss, const std::vector<at::Tensor>& inputs, double step) {
  for (auto t : inputs) t.mutable_grad() = at::Tensor();
  loss().backward();
  double worst = 0;
  for (auto t : inputs) {
    auto grad = t.grad().detach().clone().reshape({-1});
    auto flat = t.detach().view({-1});  // shares storage with t
    for (int64_t i = 0; i < flat.numel(); ++i) {
      at::NoGradGuard no_grad;
      const double orig = flat[i].item<double>();
      flat[i] = orig + step;
      const double up = loss().item<double>();
      flat[i] = orig - step;
      const double down = loss().item<double>();
      flat[i] = orig;
      const double numeric = (up - down) / (2 * step);
      const double err = std::abs(grad[i].item<double>() - numeric) / std::max(1.0, std::abs(numeric));
      worst = std::max(worst, err);
    }
  }
  return worst;
}

std::shared_ptr<Operator> make_op(const std::string& name, int64_t d, int64_t heads, const Params& params, bool float64,
                                  uint64_t seed, bool pre_norm) {
  OperatorSpec spec;
  spec.pre_norm = pre_norm;
  spec.d_model = d;
  spec.n_heads = heads;
  spec.seed = seed;
  spec.params = params;
  at::manual_seed(seed);
  auto op = plugins().make_operator(name, spec);
  if (float64) op->to(at::kDouble);
  // Non-trivial LayerNorm affine and biases, so references check them too.
  at::NoGradGuard no_grad;
  for (auto& p : op->named_parameters()) {
    if (p.key().find("norm") != std::string::npos || p.key().find("bias") != std::string::npos || p.key() == "filter")
      p.value().add_(at::randn_like(p.value()) * 0.3);
  }
  return op;
}

at::Tensor padding_mask(int64_t T, const std::vector<int64_t>& pad) {
  auto valid = at::ones({static_cast<int64_t>(pad.size()), T}, at::TensorOptions().dtype(at::kBool));
  for (size_t b = 0; b < pad.size(); ++b)
    if (pad[b] > 0) valid[b].narrow(0, T - pad[b], pad[b]).fill_(false);
  return valid;
}

at::Tensor rows_where(const at::Tensor& mask) { return mask.reshape({-1}).nonzero().squeeze(1); }

at::Tensor named(const torch::nn::Module& m, const std::string& name) {
  for (const auto& p : m.named_parameters())
    if (p.key() == name) return p.value().detach().to(at::kDouble);
  for (const auto& b : m.named_buffers())
    if (b.key() == name) return b.value().detach().to(at::kDouble);
  throw std::runtime_error("no parameter or buffer named " + name);
}

}  // namespace chiar::test
