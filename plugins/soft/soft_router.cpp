// Learned soft routing: every operator runs on every token and the outputs are
// blended with softmax(Linear([x, H])) weights. Option collapse_lambda adds the
// v2 collapse regulariser.
#include <ATen/ATen.h>

#include "chiar/gate.h"
#include "chiar/plugin.h"

namespace {

using namespace chiar;

class SoftRouter final : public Router {
 public:
  explicit SoftRouter(const RouterSpec& spec)
      : lambda_(spec.params.get_double("collapse_lambda", 0.0)) {
    gate_ = register_module(
        "gate", std::make_shared<EntropyGate>(spec.d_model, static_cast<int64_t>(spec.operators.size())));
  }

  RouteResult route(const at::Tensor& x, const at::Tensor& entropy) override {
    RouteResult r;
    r.weights = at::softmax(gate_->forward(x, entropy), -1);  // (B, T, K)
    r.choice = r.weights.argmax(-1);                          // (B, T), for statistics
    r.mode = RouteMode::Soft;
    if (lambda_ > 0) r.aux_loss = collapse_penalty(r.weights, lambda_);
    return r;
  }

  std::string describe() const override {
    return lambda_ > 0 ? "soft(collapse_lambda " + std::to_string(lambda_) + ")" : "soft";
  }

 private:
  double lambda_;
  std::shared_ptr<EntropyGate> gate_;
};

void register_plugin(Registrar& r) {
  r.add_router("soft", "learned gate Linear([x, H]); softmax-weighted blend of all operators",
               [](const RouterSpec& spec) { return std::make_unique<SoftRouter>(spec); });
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
