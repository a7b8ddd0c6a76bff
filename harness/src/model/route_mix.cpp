#include "route_mix.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/autograd.h>

#include "chiar/kernels.h"
#include "core/row_passes.h"

namespace chiar::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether the one-pass kernels take these tensors.
bool on_host(const std::vector<at::Tensor>& outputs, const at::Tensor& weights) {
  const auto dtype = outputs.front().scalar_type();
  if (!host_kernels_enabled() || (dtype != at::kFloat && dtype != at::kDouble)) return false;
  for (const auto& o : outputs)
    if (!o.device().is_cpu() || o.scalar_type() != dtype || o.sizes() != outputs.front().sizes()) return false;
  return !weights.defined() || (weights.device().is_cpu() && weights.scalar_type() == dtype);
}

// out (R, d) rows: the chosen output's row (choice defined) or the blend.
//   outs   K pointers to (R, d) contiguous rows
//   w      (R, K) contiguous, or null with choice
//   choice (R,) or null with w
template <class T>
void mix_forward(T* out, const std::vector<const T*>& outs, const T* w, const int64_t* choice, int64_t rows,
                 int64_t d) {
  const auto K = static_cast<int64_t>(outs.size());
  for_each_row(rows, d, [&](int64_t r) {
    T* y = out + r * d;
    if (choice) {
      const T* from = outs[static_cast<size_t>(choice[r])] + r * d;
      std::copy(from, from + d, y);
      return;
    }
    const T* wr = w + r * K;
    const T* first = outs[0] + r * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) y[j] = wr[0] * first[j];
    for (int64_t k = 1; k < K; ++k) {
      const T* o = outs[static_cast<size_t>(k)] + r * d;
      const T wk = wr[k];
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) y[j] += wk * o[j];
    }
  });
}

// Gradients of mix_forward for upstream g (R, d): each output's (null:
// not needed) and the weights' (gw null: not needed), <g, out_k> per row.
template <class T>
void mix_backward(const T* g, const std::vector<const T*>& outs, const T* w, const int64_t* choice,
                  const std::vector<T*>& gouts, T* gw, int64_t rows, int64_t d) {
  const auto K = static_cast<int64_t>(outs.size());
  for_each_row(rows, d, [&](int64_t r) {
    const T* gr = g + r * d;
    for (int64_t k = 0; k < K; ++k) {
      if (T* go = gouts[static_cast<size_t>(k)]) {
        go += r * d;
        if (choice) {
          if (choice[r] == k)
            std::copy(gr, gr + d, go);
          else
            std::fill(go, go + d, T(0));
        } else {
          const T wk = w[r * K + k];
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) go[j] = wk * gr[j];
        }
      }
      if (gw) {
        const T* o = outs[static_cast<size_t>(k)] + r * d;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < d; ++j) dot += gr[j] * o[j];
        gw[r * K + k] = dot;
      }
    }
  });
}

// The same gradients from tensor ops, differentiable again (create_graph).
variable_list mix_backward_ops(const at::Tensor& g, const variable_list& outs, const at::Tensor& w,
                               const at::Tensor& choice, const std::vector<bool>& need_out, bool need_w) {
  const auto K = static_cast<int64_t>(outs.size());
  variable_list grads(outs.size() + 1);
  std::vector<at::Tensor> gw;
  for (int64_t k = 0; k < K; ++k) {
    const auto& o = outs[static_cast<size_t>(k)];
    if (need_out[static_cast<size_t>(k)]) {
      at::Tensor scale;  // (B, T): d y / d out_k per token
      if (!choice.defined()) {
        scale = w.select(-1, k);
      } else {
        scale = choice.eq(k).to(g.scalar_type());
        // Straight-through: y = out_c + sum_k (w_k - sg(w_k)) out_k, whose
        // derivative in out_k adds (w_k - sg(w_k)), zero in value but not in
        // its own derivative.
        if (w.defined()) scale = scale + (w.select(-1, k) - w.select(-1, k).detach());
      }
      grads[static_cast<size_t>(k)] = g * scale.unsqueeze(-1);
    }
    if (need_w) gw.push_back((g * o).sum(-1));
  }
  if (need_w) grads.back() = at::stack(gw, -1);
  return grads;
}

// Function inputs: the K outputs, the weights (an empty tensor when absent)
// and the choice (an empty tensor for the blend); libtorch 1.13's
// Function::apply cannot take undefined tensors.
struct MixFunction : public torch::autograd::Function<MixFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList outputs, const at::Tensor& weights_or_empty,
                            const at::Tensor& choice_or_empty) {
    const auto& first = outputs.front();
    const int64_t d = first.size(-1), rows = first.numel() / d;
    const bool chosen = choice_or_empty.numel() > 0;
    variable_list outs;
    for (const auto& o : outputs) outs.push_back(o.contiguous());
    const auto w = weights_or_empty.numel() > 0 ? weights_or_empty.contiguous() : at::Tensor();
    const auto choice = chosen ? choice_or_empty.contiguous() : at::Tensor();
    auto y = at::empty(first.sizes(), first.options());
    AT_DISPATCH_FLOATING_TYPES(first.scalar_type(), "mix_outputs", [&] {
      std::vector<const scalar_t*> in;
      for (const auto& o : outs) in.push_back(o.data_ptr<scalar_t>());
      mix_forward<scalar_t>(y.data_ptr<scalar_t>(), in, w.defined() ? w.data_ptr<scalar_t>() : nullptr,
                            chosen ? choice.data_ptr<int64_t>() : nullptr, rows, d);
    });
    // The inputs themselves, not contiguous copies: a create_graph backward
    // differentiates through them.
    variable_list saved(outputs.begin(), outputs.end());
    saved.push_back(weights_or_empty);
    ctx->save_for_backward(saved);
    ctx->saved_data["choice"] = choice_or_empty;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto weights = saved.back();
    saved.pop_back();
    const auto K = static_cast<int64_t>(saved.size());
    const auto choice_saved = ctx->saved_data["choice"].toTensor();
    const auto choice = choice_saved.numel() > 0 ? choice_saved.contiguous() : at::Tensor();
    const auto w = weights.numel() > 0 ? weights.contiguous() : at::Tensor();
    std::vector<bool> need_out;
    for (int64_t k = 0; k < K; ++k) need_out.push_back(ctx->needs_input_grad(static_cast<size_t>(k)));
    const bool need_w = w.defined() && ctx->needs_input_grad(static_cast<size_t>(K));
    variable_list result;
    if (torch::autograd::GradMode::is_enabled()) {  // create_graph: keep the gradients differentiable
      result = mix_backward_ops(grads[0], saved, w, choice, need_out, need_w);
    } else {
      const auto g = grads[0].contiguous();
      const int64_t d = g.size(-1), rows = g.numel() / d;
      result.resize(static_cast<size_t>(K) + 1);
      for (int64_t k = 0; k < K; ++k)
        if (need_out[static_cast<size_t>(k)]) result[static_cast<size_t>(k)] = at::empty_like(g);
      if (need_w) result.back() = at::empty_like(w);
      variable_list dense;  // the saved outputs, contiguous, alive while the kernel reads them
      for (const auto& o : saved) dense.push_back(o.contiguous());
      AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "mix_outputs_backward", [&] {
        std::vector<const scalar_t*> outs;
        std::vector<scalar_t*> gouts;
        for (int64_t k = 0; k < K; ++k) {
          outs.push_back(dense[static_cast<size_t>(k)].data_ptr<scalar_t>());
          const auto& go = result[static_cast<size_t>(k)];
          gouts.push_back(go.defined() ? go.data_ptr<scalar_t>() : nullptr);
        }
        mix_backward<scalar_t>(g.data_ptr<scalar_t>(), outs, w.defined() ? w.data_ptr<scalar_t>() : nullptr,
                               choice.defined() ? choice.data_ptr<int64_t>() : nullptr, gouts,
                               need_w ? result.back().data_ptr<scalar_t>() : nullptr, rows, d);
      });
    }
    result.push_back(at::Tensor());  // choice
    return result;
  }
};

}  // namespace

at::Tensor blend_outputs(const std::vector<at::Tensor>& outputs, const at::Tensor& weights) {
  if (!on_host(outputs, weights)) {
    auto y = outputs[0] * weights.select(-1, 0).unsqueeze(-1);
    for (size_t k = 1; k < outputs.size(); ++k)
      y = y + outputs[k] * weights.select(-1, static_cast<int64_t>(k)).unsqueeze(-1);
    return y;
  }
  count_host_kernel();
  return MixFunction::apply(at::TensorList(outputs), weights, at::empty({0}, weights.options().dtype(at::kLong)));
}

at::Tensor choose_outputs(const std::vector<at::Tensor>& outputs, const at::Tensor& choice, const at::Tensor& weights) {
  if (!on_host(outputs, weights) || !choice.device().is_cpu() || choice.scalar_type() != at::kLong) {
    const auto& first = outputs.front();
    auto stacked = at::stack(outputs, -1);  // (B, T, d, K)
    auto index = choice.unsqueeze(-1).unsqueeze(-1).expand({first.size(0), first.size(1), first.size(2), 1});
    auto y = stacked.gather(-1, index).squeeze(-1);
    if (!weights.defined()) return y;
    // (w - w.detach()) is exactly 0 forward; backward, the weights get the
    // soft blend's gradient.
    auto delta = weights - weights.detach();  // (B, T, K)
    return y + (stacked * delta.unsqueeze(2)).sum(-1);
  }
  const auto none = at::empty({0}, outputs.front().options());
  count_host_kernel();
  return MixFunction::apply(at::TensorList(outputs), weights.defined() ? weights : none, choice);
}

}  // namespace chiar::model
