// Threshold routing on spectral entropy, no learned parameters. With K
// operators (cheapest first) and K-1 increasing thresholds tau, a token with
// entropy H takes operator #{j : H > tau_j}: for two operators H > tau ->
// the second (attention); for three, H < tau_low -> first, H > tau_high -> last.
//
// Options: tau = number or [tau_1, ..., tau_{K-1}] fixes the thresholds;
// tau = "auto" or no tau: shares = [s_1, ..., s_K] (default equal) are the target operator
// shares, reached by calibrate() from percentiles of H on a data sample. Until
// calibrated, the thresholds are the shares' quantiles of U[0, 1].
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>
#include <sstream>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/plugin.h"
#include "chiar/spectral.h"

namespace {

using namespace chiar;

class ThresholdRouter final : public Router {
 public:
  explicit ThresholdRouter(const RouterSpec& spec) : k_(static_cast<int64_t>(spec.operators.size())) {
    if (k_ < 2) throw UserError("threshold: needs at least 2 operators");
    std::vector<double> tau;
    // tau = "auto" names calibration explicitly; it is the same as leaving tau out.
    const auto& values = spec.params.values();
    const bool tau_auto = values.count("tau") && std::holds_alternative<std::string>(values.at("tau")) &&
                          spec.params.get_string("tau", "") == "auto";
    if (spec.params.has("tau") && !tau_auto) {
      if (spec.params.has("shares")) throw UserError("threshold: give either tau or shares, not both");
      tau = spec.params.get_doubles("tau", {});
      fixed_ = true;
    } else {
      shares_ = spec.params.get_doubles("shares", std::vector<double>(k_, 1.0 / k_));
      if (static_cast<int64_t>(shares_.size()) != k_)
        throw UserError("threshold: 'shares' needs " + std::to_string(k_) + " values, found " +
                        std::to_string(shares_.size()));
      // Checked here as calibration checks them, so that a dry run refuses
      // them before a run is recorded; the key quoted, so that the refusal is
      // named where it was set.
      double sum = 0;
      for (double s : shares_) {
        if (!(s >= 0.0 && s <= 1.0))
          throw UserError("threshold: every value of 'shares' must lie in [0, 1], found " + std::to_string(s));
        sum += s;
      }
      if (std::abs(sum - 1.0) > 1e-6)
        throw UserError("threshold: 'shares' must sum to 1, found " + std::to_string(sum));
      double cumulative = 0;
      for (int64_t j = 0; j + 1 < k_; ++j) tau.push_back(cumulative += shares_[j]);
    }
    if (static_cast<int64_t>(tau.size()) != k_ - 1)
      throw UserError("threshold: " + std::to_string(k_) + " operators need " + std::to_string(k_ - 1) +
                      " thresholds, found " + std::to_string(tau.size()));
    for (size_t j = 1; j < tau.size(); ++j)
      if (!(tau[j] >= tau[j - 1])) throw UserError("threshold: tau must be increasing");
    tau_ = register_buffer("tau", at::tensor(tau, at::TensorOptions().dtype(at::kDouble)));
  }

  RouteResult route(const at::Tensor& x, const at::Tensor& entropy, const OpContext&) override {
    RouteResult r;
    r.mode = RouteMode::Hard;
    if (on_host(x, entropy)) {
      chiar::count_host_kernel();
      route_on_host(x, entropy, r);
      return r;
    }
    auto h = entropy.detach().to(at::kDouble).unsqueeze(-1);        // (B, T, 1)
    r.choice = (h > tau_.to(h.device()).view({1, 1, -1})).sum(-1);  // (B, T) int64
    // one_hot's range checks read two values back to the host; every
    // choice here is in 0..K-1 by construction.
    r.weights =
        at::zeros({h.size(0), h.size(1), k_}, x.options()).scatter_(-1, r.choice.unsqueeze(-1), 1.0);  // (B, T, K)
    return r;
  }

  void calibrate(const at::Tensor& entropy_sample) override {
    if (fixed_) return;
    const auto tau = calibrate_thresholds(entropy_sample, shares_);
    tau_.copy_(at::tensor(tau, at::TensorOptions().dtype(at::kDouble)));
    calibrated_ = true;
  }

  std::vector<double> thresholds() const override {
    auto t = tau_.to(at::kCPU).contiguous();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "threshold(tau [";
    const auto tau = thresholds();
    for (size_t j = 0; j < tau.size(); ++j) out << (j ? ", " : "") << tau[j];
    out << "], " << (fixed_ ? "fixed" : calibrated_ ? "calibrated" : "uncalibrated") << ")";
    return out.str();
  }

 private:
  // fp32 or float64 entropy and weights on the CPU: one pass over the tokens
  // rather than six tensor ops, which took 25 ns per token here (1% of a
  // routed layer at T 512).
  static bool on_host(const at::Tensor& x, const at::Tensor& entropy) {
    const auto float_like = [](const at::Tensor& t) {
      return t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble;
    };
    return chiar::host_kernels_enabled() && x.device().is_cpu() && entropy.device().is_cpu() && float_like(x) &&
           float_like(entropy);
  }

  // Same decisions as the tensor path: H compared in float64 with each tau.
  void route_on_host(const at::Tensor& x, const at::Tensor& entropy, RouteResult& r) const {
    const auto h = entropy.detach().to(at::kDouble).contiguous();  // (B, T)
    const auto tau = tau_.to(at::kCPU).contiguous();
    const int64_t n = h.numel();
    r.choice = at::empty(h.sizes(), h.options().dtype(at::kLong));   // (B, T)
    r.weights = at::zeros({h.size(0), h.size(1), k_}, x.options());  // (B, T, K)
    const double* in = h.data_ptr<double>();
    const double* t = tau.data_ptr<double>();
    int64_t* choice = r.choice.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t c = 0;
      for (int64_t j = 0; j + 1 < k_; ++j) c += in[i] > t[j];
      choice[i] = c;
    }
    AT_DISPATCH_FLOATING_TYPES(r.weights.scalar_type(), "threshold_route", [&] {
      scalar_t* w = r.weights.data_ptr<scalar_t>();
      for (int64_t i = 0; i < n; ++i) w[i * k_ + choice[i]] = scalar_t(1);
    });
  }

  int64_t k_;
  bool fixed_ = false, calibrated_ = false;
  std::vector<double> shares_;
  at::Tensor tau_;  // (K-1,) float64 thresholds, a buffer so checkpoints keep it
};

void register_plugin(Registrar& r) {
  r.add_router("threshold", "spectral-entropy thresholds, fixed or calibrated to target shares",
               [](const RouterSpec& spec) { return std::make_unique<ThresholdRouter>(spec); });
  r.declare_options("router", "threshold",
                    {{"tau",
                      ParamKind::Numbers,
                      "auto",
                      "fixed thresholds: one number for 2 operators, K-1 increasing for K; \"auto\" calibrates them "
                      "to `shares`",
                      {"auto"}},
                     {"shares", ParamKind::Numbers, "equal shares",
                      "target share of tokens per operator, cheapest first, for the calibration"}});
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
