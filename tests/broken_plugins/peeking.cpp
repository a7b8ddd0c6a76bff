// Conformance counter-examples: an operator that claims to be causal but reads
// the next token, one whose forward_rows disagrees with its forward, and one
// whose forward_rows is right until a routed layer hands it the rows in host
// memory (OpContext::host_rows), which it then reads wrongly; and one whose
// fp32 path is off by 1e-3 of its value, like a faulty low-precision kernel,
// while its float64 path is right (the operator test matrix catches it).
#include <ATen/ATen.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

enum class Fault { Peeks, RowsMismatch, MisreadsHostRows, OffInFp32 };

class Faulty final : public Operator {
 public:
  Faulty(const OperatorSpec& s, Fault fault) : d_(s.d_model), fault_(fault) {}
  at::Tensor forward(const at::Tensor& x, const OpContext&) override {
    if (fault_ == Fault::OffInFp32) return x.scalar_type() == at::kDouble ? x * 2 : x * 2.002;
    if (fault_ != Fault::Peeks) return x * 2;
    return x + at::roll(x, -1, 1);  // position t reads t + 1
  }
  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) override {
    const bool misread = fault_ == Fault::MisreadsHostRows && ctx.host_rows.defined();
    const auto used = misread ? ctx.host_rows.flip(0) : rows;  // (N,) the second: rows in the wrong order
    auto out = forward(x, ctx).reshape({-1, d_}).index_select(0, used);
    return fault_ == Fault::RowsMismatch ? out + 1 : out;
  }
  FlopCount flops(int64_t T, int64_t n, int64_t d) const override { return elementwise_flops(T + n, d); }
  OperatorTraits traits() const override { return {true, true, fault_ == Fault::Peeks}; }
  std::string describe() const override {
    switch (fault_) {
      case Fault::Peeks: return "peeking";
      case Fault::RowsMismatch: return "rows_mismatch";
      case Fault::MisreadsHostRows: return "host_rows_misread";
      case Fault::OffInFp32: break;
    }
    return "off_in_fp32";
  }

 private:
  int64_t d_;
  Fault fault_;
};

void register_plugin(Registrar& r) {
  r.add_operator("peeking", "reads the next token while claiming causality",
                 [](const OperatorSpec& s) { return std::make_unique<Faulty>(s, Fault::Peeks); });
  r.add_operator("rows_mismatch", "forward_rows disagrees with forward",
                 [](const OperatorSpec& s) { return std::make_unique<Faulty>(s, Fault::RowsMismatch); });
  r.add_operator("host_rows_misread", "forward_rows misreads OpContext::host_rows",
                 [](const OperatorSpec& s) { return std::make_unique<Faulty>(s, Fault::MisreadsHostRows); });
  r.add_operator("off_in_fp32", "its fp32 path is off by 1e-3 of the value",
                 [](const OperatorSpec& s) { return std::make_unique<Faulty>(s, Fault::OffInFp32); });
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
