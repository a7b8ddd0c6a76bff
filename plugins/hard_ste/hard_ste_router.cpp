// Learned hard routing with a straight-through estimator: logits =
// Linear([x, H]); forward takes the argmax operator (one-hot), backward passes
// the softmax gradient. Option collapse_lambda adds the v2 collapse regulariser.
#include "chiar/gate.h"
#include "chiar/plugin.h"

namespace {

void register_plugin(chiar::Registrar& r) {
  r.add_router("hard_ste", "learned gate Linear([x, H]); one-hot forward, softmax gradient (STE)",
               [](const chiar::RouterSpec& spec) {
                 return std::make_unique<chiar::GatedRouter>(spec, chiar::RouteMode::HardSTE, "hard_ste");
               });
  r.declare_options("router", "hard_ste", chiar::gated_router_options());
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
