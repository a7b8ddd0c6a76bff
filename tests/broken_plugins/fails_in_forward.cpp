// An operator that builds and describes itself like any other but throws
// when it runs: a run using it fails at its first training step, after the
// matrix has been checked.
#include <ATen/ATen.h>

#include <stdexcept>

#include "chiar/plugin.h"

namespace {

using namespace chiar;

class FailsInForward final : public Operator {
 public:
  explicit FailsInForward(const OperatorSpec&) {}
  at::Tensor forward(const at::Tensor&, const OpContext&) override {
    throw std::runtime_error("fails_in_forward: out of luck");
  }
  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor&, const OpContext& ctx) override {
    return forward(x, ctx);
  }
  FlopCount flops(int64_t, int64_t, int64_t) const override { return {}; }
  OperatorTraits traits() const override { return {true, true, true}; }
  std::string describe() const override { return "fails_in_forward"; }
};

void register_plugin(Registrar& r) {
  r.add_operator("fails_in_forward", "throws whenever it runs",
                 [](const OperatorSpec& spec) { return std::make_unique<FailsInForward>(spec); });
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
