// Conformance counter-examples: an operator that claims to be causal but reads
// the next token, and one whose forward_rows disagrees with its forward.
#include <ATen/ATen.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

class Peeking final : public Operator {
 public:
  explicit Peeking(const OperatorSpec& s, bool peek) : d_(s.d_model), peek_(peek) {}
  at::Tensor forward(const at::Tensor& x, const OpContext&) override {
    if (!peek_) return x * 2;
    return x + at::roll(x, -1, 1);  // position t reads t + 1
  }
  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    auto out = forward(x, ctx).reshape({-1, d_}).index_select(0, rows);
    return peek_ ? out : out + 1;  // the second one disagrees with forward
  }
  FlopCount flops(int64_t T, int64_t n, int64_t d) const override { return elementwise_flops(T + n, d); }
  OperatorTraits traits() const override { return {true, true, peek_}; }
  std::string describe() const override { return peek_ ? "peeking" : "rows_mismatch"; }

 private:
  int64_t d_;
  bool peek_;
};

void register_plugin(Registrar& r) {
  r.add_operator("peeking", "reads the next token while claiming causality",
                 [](const OperatorSpec& s) { return std::make_unique<Peeking>(s, true); });
  r.add_operator("rows_mismatch", "forward_rows disagrees with forward",
                 [](const OperatorSpec& s) { return std::make_unique<Peeking>(s, false); });
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
