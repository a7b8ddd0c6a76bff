// Learned soft routing: every operator runs on every token and the outputs are
// blended with softmax(Linear([x, H])) weights. Option collapse_lambda adds the
// v2 collapse regulariser.
#include "chiar/gate.h"
#include "chiar/plugin.h"

namespace {

void register_plugin(chiar::Registrar& r) {
  r.add_router("soft", "learned gate Linear([x, H]); softmax-weighted blend of all operators",
               [](const chiar::RouterSpec& spec) {
                 return std::make_unique<chiar::GatedRouter>(spec, chiar::RouteMode::Soft, "soft");
               });
  r.declare_options("router", "soft", chiar::gated_router_options());
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
