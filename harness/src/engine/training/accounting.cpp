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

namespace {

FlopRow uniform_row(int64_t layer, const std::string& name, int64_t T, const FlopCount& f) {
  return {layer,
          name,
          static_cast<double>(T),
          static_cast<double>(f.forward),
          static_cast<double>(f.forward),
          static_cast<double>(f.total()),
          static_cast<double>(f.total())};
}

// An unrouted layer: its one operator on every position.
void account_plain_layer(Accounting& a, int64_t li, const Operator& op, const std::string& name, int64_t T, int64_t d,
                         bool causal) {
  const FlopCount f = op.flops_at(T, every_position(T), d, {causal, false});
  FlopRow row = uniform_row(li, name, T, f);
  row.attention = op.traits().attention_flops;
  a.flops.push_back(row);
  // The reference counts full T x T attention whatever the mask.
  if (op.traits().attention_flops) a.reference_attention_fwd += static_cast<double>(op.flops(T, T, d).forward);
}

// A routed layer: each operator's FLOPs on the positions routed to it (as
// routed, and as executed: dense where the layer ran dense), its shares of
// the real tokens, the router's own cost and the entropies' histogram.
void account_routed_layer(Accounting& a, int64_t li, const model::MixingLayer& layer, const model::LayerRouting& r,
                          const at::Tensor& valid, int64_t T, int64_t d, bool causal) {
  const auto& ops = layer.operators();
  const auto& names = layer.operator_names();
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
    const FlopCount dense = ops[k]->flops_at(T, every_position(T), d, fc);
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
  a.flops.push_back(uniform_row(li, "router", T, router));
  auto h = r.entropy.masked_select(mask).to(at::kDouble);
  auto hist = at::histc(h, 20, 0.0, 1.0).to(at::kLong).cpu().contiguous();  // host read: the histogram
  stats.histogram.assign(hist.data_ptr<int64_t>(), hist.data_ptr<int64_t>() + 20);
  a.routing.push_back(std::move(stats));
}

}  // namespace

Accounting account(const model::ChiarModel& model, const model::ModelOutput& out, const at::Tensor& valid, int64_t T) {
  Accounting a;
  const auto& o = model.options();
  const int64_t d = o.d_model();
  const bool causal = o.head() == TaskHead::LanguageModel;
  size_t routed = 0;
  for (const auto& layer : model.mixing_layers()) {
    const int64_t li = static_cast<int64_t>(&layer - &model.mixing_layers()[0]);
    if (!layer->routed())
      account_plain_layer(a, li, *layer->operators()[0], layer->operator_names()[0], T, d, causal);
    else
      account_routed_layer(a, li, *layer, out.routing.at(routed++), valid, T, d, causal);
    const int64_t m = o.ffn_mult() * d;
    const FlopCount ffn = matmul_flops(T, d, m) + matmul_flops(T, m, d) + elementwise_flops(T, m, 8) +
                          elementwise_flops(T, d) + layernorm_flops(T, d);
    a.flops.push_back(uniform_row(li, "ffn", T, ffn));
  }
  const FlopCount head = o.head() == TaskHead::LanguageModel
                             ? matmul_flops(T, d, o.vocab_size())
                             : matmul_flops(1, d, d) + matmul_flops(1, d, o.n_classes()) + elementwise_flops(T, d);
  a.flops.push_back(uniform_row(-1, "head", T, head));
  return a;
}

}  // namespace chiar::engine
