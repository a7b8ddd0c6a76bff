#include "accounting.h"

#include <ATen/ATen.h>

#include "chiar/rows.h"

namespace chiar::engine {

std::vector<std::vector<std::vector<int64_t>>> positions_by_operator(const at::Tensor& choice, int64_t K) {
  auto c = choice.to(at::kLong).cpu().contiguous();  // (B, T), read on the host
  const int64_t B = c.size(0), T = c.size(1);
  const int64_t* p = c.data_ptr<int64_t>();
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(B),
                                                     std::vector<std::vector<int64_t>>(static_cast<size_t>(K)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) out[b][p[b * T + t]].push_back(t);
  return out;
}

Accounting account(const ChiarModel& model, const ModelOutput& out, const at::Tensor& valid, int64_t T) {
  Accounting a;
  const auto& o = model.options();
  const int64_t d = o.d_model();
  const bool causal = o.head() == TaskHead::LanguageModel;
  const auto every = every_position(T);
  size_t routed = 0;
  for (const auto& layer : model.mixing_layers()) {
    const int64_t li = static_cast<int64_t>(&layer - &model.mixing_layers()[0]);
    const auto& ops = layer->operators();
    const auto& names = layer->operator_names();
    if (!layer->routed()) {
      const FlopCount f = ops[0]->flops_at(T, every, d, {causal, false});
      a.flops.push_back({li, names[0], static_cast<double>(T), static_cast<double>(f.forward),
                         static_cast<double>(f.forward), static_cast<double>(f.total()), static_cast<double>(f.total()),
                         ops[0]->traits().attention_flops});
      // The reference counts full T x T attention whatever the mask.
      if (ops[0]->traits().attention_flops)
        a.reference_attention_fwd += static_cast<double>(ops[0]->flops(T, T, d).forward);
    } else {
      const LayerRouting& r = out.routing.at(routed++);
      const int64_t B = r.choice.size(0), K = static_cast<int64_t>(ops.size());
      const auto positions = positions_by_operator(r.choice, K);
      const FlopContext fc{causal, true};  // a routed layer hands its spectrum on
      LayerRoutingStats stats;
      stats.layer = li;
      auto mask = valid.defined() ? valid : at::ones_like(r.choice, at::kBool);
      const double real = mask.sum().item<double>();
      for (int64_t k = 0; k < K; ++k) {
        double tokens = 0, fwd_sparse = 0, train_sparse = 0;
        for (int64_t b = 0; b < B; ++b) {
          const auto& at_k = positions[b][k];
          const FlopCount f = ops[k]->flops_at(T, at_k, d, fc);
          tokens += static_cast<double>(at_k.size());
          fwd_sparse += static_cast<double>(f.forward);
          train_sparse += static_cast<double>(f.total());
        }
        const FlopCount dense = ops[k]->flops_at(T, every, d, fc);
        FlopRow row{li, names[k], tokens / B, fwd_sparse / B, fwd_sparse / B, train_sparse / B, train_sparse / B};
        if (!r.sparse) row.fwd_executed = static_cast<double>(dense.forward);
        if (r.mode != RouteMode::Hard) row.train_executed = static_cast<double>(dense.total());
        row.attention = ops[k]->traits().attention_flops;
        a.flops.push_back(row);
        if (ops[k]->traits().attention_flops)
          a.reference_attention_fwd += 0.5 * static_cast<double>(ops[k]->flops(T, T, d).forward);
        const double share = (r.choice.eq(k).logical_and(mask)).sum().item<double>() / std::max(real, 1.0);
        stats.shares.emplace_back(names[k], share);
      }
      // The router: the entropy's DCT (one d x d transform per token) and, for
      // learned gates, Linear(d + 1 -> K).
      FlopCount router = matmul_flops(T, d, d, false);
      if (r.mode != RouteMode::Hard) router += matmul_flops(T, d + 1, K);
      a.flops.push_back({li, "router", static_cast<double>(T), static_cast<double>(router.forward),
                         static_cast<double>(router.forward), static_cast<double>(router.total()),
                         static_cast<double>(router.total())});
      auto h = r.entropy.masked_select(mask).to(at::kDouble);
      auto hist = at::histc(h, 20, 0.0, 1.0).to(at::kLong).cpu().contiguous();  // host read: the histogram
      stats.histogram.assign(hist.data_ptr<int64_t>(), hist.data_ptr<int64_t>() + 20);
      a.routing.push_back(std::move(stats));
    }
    const int64_t m = o.ffn_mult() * d;
    const FlopCount ffn = matmul_flops(T, d, m) + matmul_flops(T, m, d) + elementwise_flops(T, m, 8) +
                          elementwise_flops(T, d) + layernorm_flops(T, d);
    a.flops.push_back({li, "ffn", static_cast<double>(T), static_cast<double>(ffn.forward),
                       static_cast<double>(ffn.forward), static_cast<double>(ffn.total()),
                       static_cast<double>(ffn.total())});
  }
  const FlopCount head = o.head() == TaskHead::LanguageModel
                             ? matmul_flops(T, d, o.vocab_size())
                             : matmul_flops(1, d, d) + matmul_flops(1, d, o.n_classes()) + elementwise_flops(T, d);
  a.flops.push_back({-1, "head", static_cast<double>(T), static_cast<double>(head.forward),
                     static_cast<double>(head.forward), static_cast<double>(head.total()),
                     static_cast<double>(head.total())});
  return a;
}

}  // namespace chiar::engine
