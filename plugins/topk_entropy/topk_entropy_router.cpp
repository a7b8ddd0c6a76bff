// A fixed compute budget instead of a threshold: in each sequence the share
// s_attn of tokens with the highest spectral entropy goes to the last operator
// (attention), for three operators the next s_rbf to the middle one, the rest
// to the first. Option shares = [s_first, (s_middle,) s_last] (default
// [0.75, 0.25]).
//
// Classification (non-causal): an exact top-k over each sequence's real
// tokens. Language modelling (causal): a decision at t may not depend on the
// future, so a token's rank is taken among the entropies at positions <= t:
// t goes to attention when fewer than s_attn * t earlier tokens had a higher
// entropy. Over a sequence this approaches the configured shares.
#include <ATen/ATen.h>

#include <cmath>

#include "chiar/error.h"
#include "chiar/plugin.h"

namespace {

using namespace chiar;

class TopkEntropyRouter final : public Router {
 public:
  explicit TopkEntropyRouter(const RouterSpec& spec) : k_(static_cast<int64_t>(spec.operators.size())) {
    if (k_ < 2 || k_ > 3) throw UserError("topk_entropy: needs 2 or 3 operators, found " + std::to_string(k_));
    shares_ = spec.params.get_doubles("shares",
                                      k_ == 2 ? std::vector<double>{0.75, 0.25} : std::vector<double>{0.5, 0.25, 0.25});
    if (static_cast<int64_t>(shares_.size()) != k_)
      throw UserError("topk_entropy: shares needs " + std::to_string(k_) + " values, found " +
                      std::to_string(shares_.size()));
    double sum = 0;
    for (double s : shares_) {
      if (!(s >= 0 && s <= 1)) throw UserError("topk_entropy: every share must lie in [0, 1]");
      sum += s;
    }
    if (std::abs(sum - 1) > 1e-6) throw UserError("topk_entropy: shares must sum to 1");
  }

  RouteResult route(const at::Tensor& x, const at::Tensor& entropy, const OpContext& ctx) override {
    const auto h = entropy.detach().to(at::kDouble);  // (B, T)
    const int64_t T = h.size(1);
    auto valid = ctx.valid.defined() ? ctx.valid : at::ones_like(h, at::kBool);
    // higher[b, t]: how many tokens rank above t (higher H; ties broken by
    // position), among the real tokens (non-causal) or among positions <= t.
    auto above = h.unsqueeze(1) > h.unsqueeze(2);  // [b, t, s]: H_s > H_t
    auto pos = at::arange(T, h.options().dtype(at::kLong));
    auto tie = (h.unsqueeze(1) == h.unsqueeze(2)).logical_and(pos.view({1, 1, T}) < pos.view({1, T, 1}));
    auto considered = valid.unsqueeze(1).expand({h.size(0), T, T});
    if (ctx.causal) considered = considered.logical_and(pos.view({1, 1, T}) <= pos.view({1, T, 1}));
    auto higher = above.logical_or(tie).logical_and(considered).sum(-1).to(at::kDouble);  // (B, T)
    auto count = ctx.causal ? considered.sum(-1).to(at::kDouble)                          // tokens <= t
                            : valid.sum(1, true).to(at::kDouble).expand_as(h);
    // Rank fraction in [0, 1): 0 for the highest entropy.
    auto rank = higher / count.clamp_min(1.0);
    const double s_last = shares_.back(), s_mid = k_ == 3 ? shares_[1] : 0.0;
    auto choice = at::zeros_like(rank, at::kLong);
    if (k_ == 3) choice.masked_fill_(rank < s_last + s_mid, 1);
    choice.masked_fill_(rank < s_last, k_ - 1);
    RouteResult r;
    r.choice = choice;
    r.weights = at::one_hot(choice, k_).to(x.scalar_type());
    r.mode = RouteMode::Hard;
    return r;
  }

  std::string describe() const override {
    std::string s = "topk_entropy(shares [";
    for (size_t i = 0; i < shares_.size(); ++i) s += (i ? ", " : "") + std::to_string(shares_[i]).substr(0, 4);
    return s + "])";
  }

 private:
  int64_t k_;
  std::vector<double> shares_;
};

void register_plugin(Registrar& r) {
  r.add_router("topk_entropy", "a fixed share of the highest-entropy tokens per sequence to attention (budgeted)",
               [](const RouterSpec& spec) { return std::make_unique<TopkEntropyRouter>(spec); });
  r.declare_options("router", "topk_entropy",
                    {{"shares", ParamKind::Numbers, "[0.75, 0.25]; 3 operators [0.5, 0.25, 0.25]",
                      "share of each sequence's tokens per operator, first to last; the highest entropies go last"}});
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
