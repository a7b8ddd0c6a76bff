#include "chiar/adamw.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "chiar/kernels.h"
#include "chiar/row_kernels.h"  // CHIAR_ROW_KERNEL

namespace chiar {

namespace {

// Per-call constants of one parameter's update, in the order the update uses
// them (libtorch's AdamW: decay first, then the moments, then the step).
struct UpdateScalars {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float step_size;  // lr / (1 - beta1^t)
};

// p, g, m, v: (n,) fp32, distinct.
CHIAR_ROW_KERNEL void adamw_update(float* __restrict p, const float* __restrict g, float* __restrict m,
                                   float* __restrict v, int64_t n, UpdateScalars s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * s.beta1 + gi * s.one_minus_beta1;
    const float vi = v[i] * s.beta2 + gi * gi * s.one_minus_beta2;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * s.inv_sqrt_bc2 + s.eps;
    p[i] = p[i] * s.decay - s.step_size * (mi / denom);
  }
}

// The optimiser state's key for a parameter: libtorch 1.13 keys by the
// printed TensorImpl address, later releases by the address itself.
template <class Key>
Key state_key(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << impl;
    return os.str();
  } else {
    return static_cast<Key>(impl);
  }
}

using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state().begin()->first)>;

bool fusable(const at::Tensor& p, const torch::optim::AdamWOptions& options) {
  const auto& g = p.grad();
  return host_kernels_enabled() && !options.amsgrad() && p.device().is_cpu() && p.scalar_type() == at::kFloat &&
         p.is_contiguous() && g.layout() == at::kStrided && g.device().is_cpu() && g.scalar_type() == at::kFloat &&
         g.is_contiguous() && g.sizes() == p.sizes();
}

// The loop writes p.numel() floats through each moment: state loaded from a
// checkpoint must hold exactly that, on the host, or libtorch's step runs
// (and says what is wrong) instead.
bool state_fits(const torch::optim::OptimizerParamState* state, const at::Tensor& p) {
  if (!state) return true;  // created below, shaped like p
  const auto& st = static_cast<const torch::optim::AdamWParamState&>(*state);
  for (const at::Tensor* m : {&st.exp_avg(), &st.exp_avg_sq()})
    if (!m->defined() || !m->device().is_cpu() || m->scalar_type() != at::kFloat || m->sizes() != p.sizes())
      return false;
  return true;
}

// Whether libtorch's foreach ops can update p: a dense gradient and moments
// (if any yet) of p's type, device and shape, outside amsgrad.
bool foreachable(const at::Tensor& p, const torch::optim::AdamWOptions& options,
                 const torch::optim::OptimizerParamState* state) {
  const auto& g = p.grad();
  if (options.amsgrad() || !at::isFloatingType(p.scalar_type()) || g.layout() != at::kStrided ||
      g.device() != p.device() || g.scalar_type() != p.scalar_type() || g.sizes() != p.sizes())
    return false;
  if (!state) return true;
  const auto& st = static_cast<const torch::optim::AdamWParamState&>(*state);
  for (const at::Tensor* m : {&st.exp_avg(), &st.exp_avg_sq()})
    if (!m->defined() || m->device() != p.device() || m->scalar_type() != p.scalar_type() || m->sizes() != p.sizes())
      return false;
  return true;
}

// p's state: `found`, or where p has none yet a fresh one (step 0, zero
// moments laid out by `format`), inserted into the optimiser's.
torch::optim::AdamWParamState& state_of(torch::optim::Optimizer& optimizer, const at::Tensor& p,
                                        torch::optim::OptimizerParamState* found, at::MemoryFormat format) {
  if (!found) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(at::zeros_like(p, format));
    fresh->exp_avg_sq(at::zeros_like(p, format));
    found = fresh.get();
    optimizer.state().insert_or_assign(state_key<StateKey>(p.unsafeGetTensorImpl()), std::move(fresh));
  }
  return static_cast<torch::optim::AdamWParamState&>(*found);
}

// The tensors of the parameters one foreach pass updates: one group's, at
// one step count.
struct ForeachLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

// Each parameter's state (null: none yet), looked up once, and whether
// every update can be fused (host) or else made by foreach ops.
struct StatePlan {
  std::vector<torch::optim::OptimizerParamState*> states;  // per parameter with a gradient, in group order
  bool host = true, foreach = true;
};

StatePlan plan_states(torch::optim::Optimizer& optimizer) {
  StatePlan plan;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params())
      if (p.grad().defined()) {
        const auto found = optimizer.state().find(state_key<StateKey>(p.unsafeGetTensorImpl()));
        plan.states.push_back(found == optimizer.state().end() ? nullptr : found->second.get());
        plan.host = plan.host && fusable(p, options) && state_fits(plan.states.back(), p);
        plan.foreach = plan.foreach && foreachable(p, options, plan.states.back());
      }
  }
  return plan;
}

// The update's constants at this step (bias corrections folded in).
UpdateScalars scalars_at(const torch::optim::AdamWOptions& options, int64_t step) {
  const auto [beta1, beta2] = options.betas();
  const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(beta2, static_cast<double>(step));
  return {static_cast<float>(1 - options.lr() * options.weight_decay()),
          static_cast<float>(beta1),
          static_cast<float>(1 - beta1),
          static_cast<float>(beta2),
          static_cast<float>(1 - beta2),
          static_cast<float>(1 / std::sqrt(bc2)),
          static_cast<float>(options.eps()),
          static_cast<float>(options.lr() / bc1)};
}

// One parameter's fused update, in place, spread over the cores.
void fused_update(const at::Tensor& p, torch::optim::AdamWParamState& st, const UpdateScalars& s) {
  // State loaded from a checkpoint may be strided; the loop needs it dense.
  if (!st.exp_avg().is_contiguous()) st.exp_avg(st.exp_avg().contiguous());
  if (!st.exp_avg_sq().is_contiguous()) st.exp_avg_sq(st.exp_avg_sq().contiguous());
  float* pd = p.data_ptr<float>();
  const float* gd = p.grad().data_ptr<float>();
  float* md = st.exp_avg().data_ptr<float>();
  float* vd = st.exp_avg_sq().data_ptr<float>();
  // Chunks of 16 K elements: a parameter below that (biases, norms) runs
  // on the calling thread.
  at::parallel_for(0, p.numel(), 16384, [&](int64_t begin, int64_t end) {
    adamw_update(pd + begin, gd + begin, md + begin, vd + begin, end - begin, s);
  });
  // Written through raw pointers: bump the version counters as an in-place
  // op would, since caches keyed on them (linear's transposed weights) must
  // see the change.
  p.unsafeGetTensorImpl()->bump_version();
  st.exp_avg().unsafeGetTensorImpl()->bump_version();
  st.exp_avg_sq().unsafeGetTensorImpl()->bump_version();
}

}  // namespace

void FusedAdamW::clear_gradients() {
  for (auto& group : param_groups())
    for (auto& p : group.params()) p.mutable_grad() = torch::Tensor();
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  last_step_fused_ = false;
  last_step_foreach_ = false;
  if (closure) return torch::optim::AdamW::step(std::move(closure));
  // The first pass decides how every update is made, the second makes them.
  const StatePlan plan = plan_states(*this);
  if (!plan.host) return plan.foreach ? foreach_step(plan.states) : torch::optim::AdamW::step();
  at::NoGradGuard no_grad;
  size_t next = 0;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(*this, p, plan.states[next++], at::MemoryFormat::Contiguous);
      st.step(st.step() + 1);
      fused_update(p, st, scalars_at(options, st.step()));
    }
  }
  last_step_fused_ = true;
  count_host_kernel();
  return {};
}

// libtorch's AdamW update, op for op, over lists: a handful of launches per
// group on a GPU instead of seven per parameter (multi-tensor kernels), and
// on the CPU the same ops tensor by tensor.
torch::Tensor FusedAdamW::foreach_step(const std::vector<torch::optim::OptimizerParamState*>& states) {
  at::NoGradGuard no_grad;
  size_t next = 0;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // A parameter that missed a gradient has a lower step count, and so
    // other bias corrections: one pass per count.
    std::map<int64_t, ForeachLists> by_step;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(*this, p, states[next++], at::MemoryFormat::Preserve);
      st.step(st.step() + 1);
      ForeachLists& l = by_step[st.step()];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(st.exp_avg());
      l.exp_avg_sqs.push_back(st.exp_avg_sq());
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [step, l] : by_step) {
      const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bc2 = 1 - std::pow(beta2, static_cast<double>(step));
      if (options.weight_decay() != 0) at::_foreach_mul_(l.params, 1 - options.lr() * options.weight_decay());
      at::_foreach_mul_(l.exp_avgs, beta1);
      at::_foreach_add_(l.exp_avgs, l.grads, 1 - beta1);
      at::_foreach_mul_(l.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(l.exp_avg_sqs, l.grads, l.grads, 1 - beta2);
      auto denom = at::_foreach_sqrt(l.exp_avg_sqs);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, options.eps());
      at::_foreach_addcdiv_(l.params, l.exp_avgs, denom, -options.lr() / bc1);
    }
  }
  last_step_foreach_ = true;
  return {};
}

}  // namespace chiar
