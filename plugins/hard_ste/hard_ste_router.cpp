// Learned hard routing with a straight-through estimator: logits =
// Linear([x, H]); forward takes the argmax operator (one-hot), backward passes
// the softmax gradient. Option collapse_lambda adds the v2 collapse regulariser.
#include <ATen/ATen.h>

#include "chiar/gate.h"
#include "chiar/plugin.h"

namespace {

using namespace chiar;

class HardSteRouter final : public Router {
 public:
  explicit HardSteRouter(const RouterSpec& spec)
      : lambda_(spec.params.get_double("collapse_lambda", 0.0)) {
    gate_ = register_module(
        "gate", std::make_shared<EntropyGate>(spec.d_model, static_cast<int64_t>(spec.operators.size())));
  }

  RouteResult route(const at::Tensor& x, const at::Tensor& entropy) override {
    RouteResult r;
    r.weights = at::softmax(gate_->forward(x, entropy), -1);  // (B, T, K)
    r.choice = r.weights.argmax(-1);                          // (B, T)
    r.mode = RouteMode::HardSTE;
    if (lambda_ > 0) r.aux_loss = collapse_penalty(r.weights, lambda_);
    return r;
  }

  std::string describe() const override {
    return lambda_ > 0 ? "hard_ste(collapse_lambda " + std::to_string(lambda_) + ")" : "hard_ste";
  }

 private:
  double lambda_;
  std::shared_ptr<EntropyGate> gate_;
};

void register_plugin(Registrar& r) {
  r.add_router("hard_ste", "learned gate Linear([x, H]); one-hot forward, softmax gradient (STE)",
               [](const RouterSpec& spec) { return std::make_unique<HardSteRouter>(spec); });
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
