// RBF kernel mixing with random Fourier features, in linear form.
//
//   phi(u) = [cos(u W), sin(u W)] / sqrt(R),  W (d, R) ~ N(0, 2 gamma), fixed per seed,
//   so phi(q) . phi(k) estimates exp(-gamma |q - k|^2).
//   q_t = W_q x_t, k_s = W_k x_s, v_s = W_v x_s; a_ts = phi(q_t) . phi(k_s)
//   num_t = sum_{s in S(t)} a_ts v_s = phi(q_t)^T (sum_s phi(k_s) v_s^T)
//   den_t = sum_{s in S(t)} a_ts     = phi(q_t) . (sum_s phi(k_s))
//   mix_t = num_t / max(den_t, eps * max(n_t, 1)),   y = LN(x + W_o mix)
//   (pre-norm: q, k, v read LN(x) and y = x + W_o mix)
// S(t): the real (unpadded) positions, and for causal models only s <= t;
// n_t = |S(t)|. The random-feature estimate of a kernel sum can be near zero or
// negative even though the kernel is positive; flooring the normaliser at eps
// times the number of keys (the kernel mean is floored at eps) keeps the
// division bounded. Causal sums run chunk by chunk: quadratic inside a chunk of
// C positions, a running (F, d) state across chunks: O(T (C + d) F) overall.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/layer_norm.h"
#include "chiar/linear.h"
#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

// Exclusive running sums along dim 1 of s (B, n, ...): out[:, c] is the sum
// of s[:, c'] over c' < c (forward) or c' > c (reverse), zero at the end it
// starts from. One pass each way on the CPU; the cat of a zero slice, cumsum
// and narrow took four, and cumsum's backward flips twice more. Backward is
// the other direction's scan, so it stays differentiable.
struct ExclusiveScan : public torch::autograd::Function<ExclusiveScan> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& s, bool reverse) {
    ctx->saved_data["reverse"] = reverse;
    return scan(s, reverse);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {ExclusiveScan::apply(grads[0], !ctx->saved_data["reverse"].toBool()), at::Tensor()};
  }

  static at::Tensor scan(const at::Tensor& s, bool reverse) {
    if (!chiar::host_kernels_enabled() || !s.device().is_cpu() ||
        (s.scalar_type() != at::kFloat && s.scalar_type() != at::kDouble)) {
      const auto ordered = reverse ? s.flip(1) : s;
      const int64_t n = s.size(1);
      auto out = at::cat({at::zeros_like(ordered.narrow(1, 0, 1)), ordered.cumsum(1).narrow(1, 0, n - 1)}, 1);
      return reverse ? out.flip(1) : out;
    }
    chiar::count_host_kernel();
    const auto in = s.contiguous();
    auto out = at::empty_like(in);
    const int64_t B = in.size(0), n = in.size(1), inner = n > 0 ? in.numel() / (B * n) : 0;
    AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "exclusive_scan", [&] {
      const scalar_t* src = in.data_ptr<scalar_t>();
      scalar_t* dst = out.data_ptr<scalar_t>();
      // Work items: (sequence, stretch of 1024 inner elements), each
      // scanned along the n slices.
      const int64_t stretch = 1024, per_b = (inner + stretch - 1) / stretch;
      at::parallel_for(0, B * per_b, 1, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t b = item / per_b, j0 = item % per_b * stretch, j1 = std::min(inner, j0 + stretch);
          const scalar_t* from = src + b * n * inner;
          scalar_t* to = dst + b * n * inner;
          const int64_t first = reverse ? n - 1 : 0, step = reverse ? -1 : 1;
          for (int64_t j = j0; j < j1; ++j) to[first * inner + j] = 0;
          for (int64_t c = first + step; c >= 0 && c < n; c += step) {
            const scalar_t* prev_in = from + (c - step) * inner;
            const scalar_t* prev_out = to + (c - step) * inner;
            scalar_t* cur = to + c * inner;
            for (int64_t j = j0; j < j1; ++j) cur[j] = prev_out[j] + prev_in[j];
          }
        }
      });
    });
    return out;
  }
};

class RbfOperator final : public Operator {
 public:
  explicit RbfOperator(const OperatorSpec& spec)
      : d_(spec.d_model),
        features_(spec.params.get_int("features")),
        gamma_(spec.params.get_double("gamma", 1.0 / static_cast<double>(spec.d_model))),
        eps_(spec.params.get_double("eps")),
        chunk_(spec.params.get_int("chunk")) {
    if (features_ < 1) throw UserError("rbf: features must be positive");
    if (!(gamma_ > 0)) throw UserError("rbf: gamma must be positive");
    if (!(eps_ > 0)) throw UserError("rbf: eps must be positive");
    if (chunk_ < 1) throw UserError("rbf: chunk must be positive");
    q_ = register_module("q", torch::nn::Linear(d_, d_));
    kv_ = register_module("kv", torch::nn::Linear(d_, 2 * d_));
    out_ = register_module("out", torch::nn::Linear(d_, d_));
    norm_ =
        SublayerNorm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_}))), spec.pre_norm);
    auto gen = at::detail::createCPUGenerator(spec.seed);
    omega_ = register_buffer("omega", at::normal(0.0, std::sqrt(2.0 * gamma_), {d_, features_}, gen));
  }

  at::Tensor forward(const at::Tensor& x, const OpContext& ctx) override {
    const int64_t B = x.size(0), T = x.size(1);
    const auto in = norm_.input(x);                  // (B, T, d)
    auto q = phi(project(q_, in));                   // (B, T, F)
    auto [k, v, mask] = keys_values(in, ctx.valid);  // (B, T, F), (B, T, d), (B, T, 1)
    at::Tensor num, den, count;
    if (!ctx.causal) {
      auto state = chiar::batch_matmul(k.transpose(1, 2), v);  // (B, F, d)
      num = chiar::batch_matmul(q, state);                     // (B, T, d)
      den = (q * k.sum(1, true)).sum(-1);                      // (B, T)
      count = mask.sum(1).expand({B, T});                      // (B, T)
    } else {
      const int64_t C = std::min(chunk_, T), n_chunks = (T + C - 1) / C, Tp = n_chunks * C;
      auto qc = chunks(q, Tp, C), kc = chunks(k, Tp, C), vc = chunks(v, Tp, C);  // (B, nC, C, .)
      auto [s_prev, z_prev] = prefix_states(kc, vc);                             // (B, nC, F, d), (B, nC, F)
      auto a = chiar::batch_matmul(qc, kc.transpose(-1, -2)).tril();             // (B, nC, C, C): s <= t in chunk
      num = (chiar::batch_matmul(qc, s_prev) + chiar::batch_matmul(a, vc)).reshape({B, Tp, d_}).narrow(1, 0, T);
      den = ((qc * z_prev.unsqueeze(2)).sum(-1) + a.sum(-1)).reshape({B, Tp}).narrow(1, 0, T);
      count = mask.squeeze(-1).cumsum(1);  // (B, T)
    }
    return norm_.output(project(out_, kernel_average(num, den, count), x));
  }

  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    const int64_t T = x.size(1);
    auto xr = gather_rows(x.reshape({-1, d_}), rows);  // (N, d): the residual
    // Rows are grouped by a key of each row on the host, from the routed
    // layer's host copy of them (OpContext::host_rows) or one copy of our
    // own: grouping a GPU's keys would copy them back, and wait, per call.
    const auto host_rows = rows_in_host_memory(rows, ctx.host_rows);  // (N,) int64
    const auto groups_of = [&](const at::Tensor& key) {               // key: (N,) int64 on the host
      return groups_on_device(group_rows(key), x.device());
    };
    // Keys and values only for the sequences that have rows; b indexes them.
    const RowGroups host_seqs = group_rows(at::div(host_rows, T, "floor"));
    const RowGroups seqs = groups_on_device(host_seqs, x.device());
    const int64_t B = seqs.count;
    auto valid = ctx.valid.defined() ? ctx.valid.index_select(0, seqs.keys) : at::Tensor();
    auto xs = seqs.count == x.size(0) ? x : x.index_select(0, seqs.keys);  // every sequence has rows: no gather
    auto b = seqs.group, t = at::remainder(rows, T);
    const auto in_s = norm_.input(xs);  // (B, T, d): what keys, values and (pre-norm) queries read
    auto q = phi(project(q_, norm_.pre() ? in_s.reshape({-1, d_}).index_select(0, b * T + t) : xr));  // (N, F)
    auto [k, v, mask] = keys_values(in_s, valid);  // (B, T, F), (B, T, d), (B, T, 1)
    at::Tensor num, den, count;
    if (!ctx.causal) {
      const RowGroups g = groups_of(host_seqs.group);
      auto kg = k.index_select(0, g.keys), vg = v.index_select(0, g.keys);                         // (G, T, .)
      auto qp = pack_rows(q, g);                                                                   // (G, m, F)
      num = unpack_rows(chiar::batch_matmul(qp, chiar::batch_matmul(kg.transpose(1, 2), vg)), g);  // (N, d)
      den = unpack_rows((qp * kg.sum(1, true)).sum(-1), g);                                        // (N,)
      count = mask.sum(1).squeeze(-1).index_select(0, b);                                          // (N,)
    } else {
      const int64_t C = std::min(chunk_, T), n_chunks = (T + C - 1) / C, Tp = n_chunks * C;
      auto kc = chunks(k, Tp, C), vc = chunks(v, Tp, C);  // (B, nC, C, .)
      auto [s_prev, z_prev] = prefix_states(kc, vc);
      const RowGroups g =  // one group per chunk
          groups_of(host_seqs.group * n_chunks + at::div(at::remainder(host_rows, T), C, "floor"));
      const int64_t F = 2 * features_;
      // Every chunk has rows (g.keys = 0 .. B nC - 1): no gathers.
      const auto of_groups = [&](const at::Tensor& u) {
        return g.count == B * n_chunks ? u : u.index_select(0, g.keys);
      };
      auto sg = of_groups(s_prev.reshape({B * n_chunks, F, d_}));     // (G, F, d)
      auto zg = of_groups(z_prev.reshape({B * n_chunks, F}));         // (G, F)
      auto kg = of_groups(kc.reshape({B * n_chunks, C, F}));          // (G, C, F)
      auto vg = of_groups(vc.reshape({B * n_chunks, C, d_}));         // (G, C, d)
      auto qp = pack_rows(q, g);                                      // (G, m, F)
      auto within = pack_rows(at::remainder(t, C), g).unsqueeze(-1);  // (G, m, 1)
      auto a = chiar::batch_matmul(qp, kg.transpose(1, 2)) *
               (at::arange(C, within.options()).view({1, 1, C}) <= within).to(q.scalar_type());
      num = unpack_rows(chiar::batch_matmul(qp, sg) + chiar::batch_matmul(a, vg), g);  // (N, d)
      den = unpack_rows((qp * zg.unsqueeze(1)).sum(-1) + a.sum(-1), g);                // (N,)
      count = mask.squeeze(-1).cumsum(1).reshape({-1}).index_select(0, b * T + t);     // (N,)
    }
    return norm_.output(project(out_, kernel_average(num, den, count), xr));
  }

  FlopCount flops(int64_t T, int64_t n, int64_t d) const override {
    if (n == 0) return {};  // forward_rows computes nothing for a sequence without rows
    const int64_t F = 2 * features_, C = std::min(chunk_, T);
    FlopCount f = matmul_flops(n, d, d) + matmul_flops(T, d, 2 * d) + matmul_flops(n, d, d);
    // Feature maps of n queries and T keys: projection on W, cos, sin, scale.
    f += matmul_flops(n + T, d, features_, /*weight_grad=*/false) + elementwise_flops(n + T, F, 2);
    f += matmul_flops(T, F, d) + matmul_flops(n, F, d) + elementwise_flops(n, F, 2);  // state, apply
    f += matmul_flops(n, F, C, false) + matmul_flops(n, C, d, false);                 // within-chunk part (causal)
    // Pre-norm normalises every position the keys read, post-norm the rows.
    return f + elementwise_flops(n, d, 2) + layernorm_flops(norm_.pre() ? T : n, d);
  }

  OperatorTraits traits() const override {
    OperatorTraits t;
    t.display_name = "RBF";
    t.colour = "#cdeccf";
    t.role = OperatorRole::IntermediateMixing;
    t.pre_norm = true;
    return t;
  }

  std::string describe() const override {
    return "rbf(features " + std::to_string(features_) + ", gamma " + std::to_string(gamma_) + ", linear)";
  }

 private:
  // The phases u W in at least fp32, also under bf16 autocast: cos and sin
  // of a phase a few radians large, rounded to bf16's 8 bits, put errors of
  // about 1e-2 into every feature, which the normaliser then divides.
  at::Tensor phi(const at::Tensor& u) const {  // (..., d) -> (..., 2R)
    at::Tensor p;                              // (..., R)
    if (u.scalar_type() == at::kDouble) {
      p = chiar::linear(u, omega_.to(at::kDouble).t());
    } else {
      c10::impl::ExcludeDispatchKeyGuard full_precision(c10::autocast_dispatch_keyset);
      p = chiar::linear(u.to(at::kFloat), omega_.to(at::kFloat).t());
    }
    return at::cat({at::cos(p), at::sin(p)}, -1) * (1.0 / std::sqrt(static_cast<double>(features_)));
  }

  // Keys as features and values, zeroed at padding; mask (B, T, 1) of real tokens.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> keys_values(const at::Tensor& x, const at::Tensor& valid) {
    // split, not two narrows: backward concatenates the two gradients once
    // instead of zero-filling a (B, T, 2d) tensor for each and adding them.
    const auto kv = project(kv_, x).split(d_, -1);  // (B, T, d) x 2
    auto mask =
        valid.defined() ? valid.to(x.scalar_type()).unsqueeze(-1) : at::ones({x.size(0), x.size(1), 1}, x.options());
    return {phi(kv[0]) * mask, kv[1] * mask, mask};
  }

  // (B, T, c) -> (B, Tp / C, C, c), zero-padded at the end.
  static at::Tensor chunks(const at::Tensor& u, int64_t Tp, int64_t C) {
    const int64_t B = u.size(0), T = u.size(1), c = u.size(2);
    auto padded = Tp == T ? u : at::cat({u, at::zeros({B, Tp - T, c}, u.options())}, 1);
    return padded.view({B, Tp / C, C, c});
  }

  // Sums over all earlier chunks: state (B, nC, F, d) and normaliser (B, nC, F).
  static std::pair<at::Tensor, at::Tensor> prefix_states(const at::Tensor& kc, const at::Tensor& vc) {
    auto per_chunk = chiar::batch_matmul(kc.transpose(-1, -2), vc);  // (B, nC, F, d)
    auto z = kc.sum(2);                                              // (B, nC, F)
    return {ExclusiveScan::apply(per_chunk, false), ExclusiveScan::apply(z, false)};
  }

  // Kernel attention's weighted average: num / den, with den floored at
  // eps per key read so a row with (almost) no kernel mass stays finite.
  at::Tensor kernel_average(const at::Tensor& num, const at::Tensor& den, const at::Tensor& count) const {
    auto floor = count.clamp_min(1.0) * eps_;
    return num / at::maximum(den, floor).unsqueeze(-1);
  }

  int64_t d_, features_;
  double gamma_, eps_;
  int64_t chunk_;
  torch::nn::Linear q_{nullptr}, kv_{nullptr}, out_{nullptr};  // (d->d), (d->2d), (d->d)
  SublayerNorm norm_;
  at::Tensor omega_;  // (d, R) random frequencies, a buffer (fixed, saved with the model)
};

void register_plugin(Registrar& r) {
  r.add_operator("rbf", "RBF kernel mixing, random Fourier features in linear form, O(T R d)",
                 [](const OperatorSpec& spec) { return std::make_unique<RbfOperator>(spec); });
  r.declare_options("operator", "rbf",
                    {{"features", ParamKind::Int, "64", "random Fourier features R (phi has 2R entries)"},
                     {"gamma", ParamKind::Number, "1 / d_model", "kernel width: exp(-gamma |q - k|^2)"},
                     {"eps", ParamKind::Number, "0.001", "floor of the kernel mean in the normaliser"},
                     {"chunk", ParamKind::Int, "64", "positions per chunk of the causal sums"}});
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
