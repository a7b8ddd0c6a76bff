#include "mixing_layer.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"
#include "route_mix.h"

namespace chiar::model {

const char* to_string(Execution e) {
  switch (e) {
    case Execution::Auto: return "auto";
    case Execution::Dense: return "dense";
    case Execution::Sparse: return "sparse";
  }
  return "?";
}

Execution execution_from_string(const std::string& name) {
  if (name == "auto") return Execution::Auto;
  if (name == "dense") return Execution::Dense;
  if (name == "sparse") return Execution::Sparse;
  throw UserError("unknown execution '" + name + "' (known: auto, dense, sparse)");
}

MixingLayer::MixingLayer(int64_t index, std::vector<std::string> names,
                         std::vector<std::shared_ptr<Operator>> operators, std::shared_ptr<Router> router)
    : index_(index), names_(std::move(names)), operators_(std::move(operators)), router_(std::move(router)) {
  for (size_t k = 0; k < operators_.size(); ++k)
    register_module("op" + std::to_string(k) + "_" + names_[k], operators_[k]);
  if (router_) register_module("router", router_);
}

at::Tensor MixingLayer::forward(const at::Tensor& x, const OpContext& ctx, LayerRouting* routing,
                                at::Tensor* aux_loss) {
  if (!router_) return operators_[0]->forward(x, ctx);

  // The router's entropy needs the spectrum; operators that transform x the
  // same way (a post-norm dct) read it from the context instead of
  // transforming again. It is fp32 under bf16 autocast too (dct2_exact), so
  // the entropy is as exact as in an fp32 run, and so are the coefficients a
  // post-norm dct filters.
  OpContext with_spectrum = ctx;
  with_spectrum.spectrum = dct2_exact(x);                                     // (B, T, d)
  const auto entropy = spectral_entropy_from_coeffs(with_spectrum.spectrum);  // (B, T)
  RouteResult r = router_->route(x, entropy, ctx);
  bool use_sparse = false;
  switch (execution_) {
    case Execution::Dense: use_sparse = false; break;
    case Execution::Sparse:
      if (r.mode == RouteMode::Soft)
        throw UserError("layer " + std::to_string(index_ + 1) +
                        ": soft routing blends every operator and cannot execute sparsely");
      use_sparse = true;
      break;
    case Execution::Auto:
      use_sparse = r.mode == RouteMode::Hard ||
                   (r.mode == RouteMode::HardSTE && !(is_training() && torch::autograd::GradMode::is_enabled()));
      break;
  }
  auto y = use_sparse ? sparse(x, with_spectrum, r.choice) : dense(x, with_spectrum, r);
  if (routing) {
    routing->layer = index_;
    routing->choice = r.choice.detach();
    routing->entropy = entropy.detach();
    routing->weights = r.weights.detach();
    routing->sparse = use_sparse;
    routing->mode = r.mode;
  }
  if (aux_loss && r.aux_loss.defined()) *aux_loss = aux_loss->defined() ? *aux_loss + r.aux_loss : r.aux_loss;
  return y;
}

at::Tensor MixingLayer::dense(const at::Tensor& x, const OpContext& ctx, const RouteResult& r) const {
  std::vector<at::Tensor> outputs;  // K x (B, T, d)
  for (const auto& op : operators_) outputs.push_back(op->forward(x, ctx));
  if (r.mode == RouteMode::Soft) return blend_outputs(outputs, r.weights);
  // On a GPU, a host read the routing needs: the choices are checked before
  // a gather reads by them, where one outside 0..K-1 would be a device-side
  // assert that ends the process's CUDA context instead of naming the layer.
  check_choices(r.choice.reshape({-1}));
  // Hard decisions: the chosen output, selected exactly (no 1.0 * y rounding);
  // straight-through, the gate gets the soft blend's gradient.
  const bool straight_through = r.mode == RouteMode::HardSTE && r.weights.requires_grad();
  return choose_outputs(outputs, r.choice, straight_through ? r.weights : at::Tensor());
}

void MixingLayer::check_choices(const at::Tensor& flat_choice) const {
  const auto K = static_cast<int64_t>(operators_.size());
  int64_t outside = 0;
  if (host_kernels_enabled() && flat_choice.device().is_cpu() && flat_choice.scalar_type() == at::kLong) {
    count_host_kernel();
    const auto c = flat_choice.contiguous();
    const int64_t* in = c.data_ptr<int64_t>();
    for (int64_t i = 0; i < c.numel(); ++i) outside += in[i] < 0 || in[i] >= K;
  } else {
    outside = flat_choice.lt(0).logical_or(flat_choice.ge(K)).sum().item<int64_t>();
  }
  if (outside > 0)
    throw UserError("layer " + std::to_string(index_ + 1) + ": the router chose an operator outside 0.." +
                    std::to_string(K - 1) + " for " + std::to_string(outside) + " of " +
                    std::to_string(flat_choice.numel()) + " tokens");
}

at::Tensor MixingLayer::sparse(const at::Tensor& x, const OpContext& ctx, const at::Tensor& choice) const {
  const auto flat_choice = choice.reshape({-1});
  // On a GPU the lists' one copy to the host (their sizes) brings the lists
  // too: an operator that plans on the host reads its own there
  // (OpContext::host_rows) instead of waiting for a copy of its own.
  const RowLists lists = rows_by_choice_and_host(flat_choice, static_cast<int64_t>(operators_.size()));
  int64_t written = 0;
  OpContext op_ctx = ctx;
  std::vector<at::Tensor> parts, taken;  // K' x (N_k, d) and their rows (N_k,)
  for (size_t k = 0; k < operators_.size(); ++k) {
    const auto& rows = lists.rows[k];  // (N_k,)
    if (rows.numel() == 0) continue;
    written += rows.numel();
    op_ctx.host_rows = lists.host_rows[k];                           // (N_k,) on the host
    auto out = operators_[k]->forward_rows(x, rows, op_ctx);         // (N_k, d)
    if (rows.numel() == flat_choice.numel()) return out.view_as(x);  // one operator took every token
    parts.push_back(out);
    taken.push_back(rows);
  }
  if (written != flat_choice.numel()) check_choices(flat_choice);
  if (parts.empty()) return at::empty_like(x);  // no tokens
  return place_rows(parts, taken, flat_choice.numel()).view_as(x);
}

std::string MixingLayer::describe() const {
  std::string out;
  for (size_t k = 0; k < operators_.size(); ++k) out += (k ? " | " : "") + operators_[k]->describe();
  if (router_) out += " routed by " + router_->describe();
  return out;
}

}  // namespace chiar::model
