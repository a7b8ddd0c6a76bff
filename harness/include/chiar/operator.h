#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "chiar/export.h"
#include "chiar/flops.h"
#include "chiar/params.h"

namespace chiar {

// What an operator call may assume about the sequence.
struct OpContext {
  bool causal = false;  // language modelling: position t may read positions <= t only
  at::Tensor valid;     // (B, T) bool, true for real tokens; undefined = all real
  // (B, T, d) orthonormal DCT-II of x along the features, when the layer has
  // already computed it (a routed layer does, for the router's entropy);
  // undefined otherwise. fp32 (float64 for float64 x) under autocast too.
  // Operators that transform x the same way may read it instead of
  // transforming again.
  at::Tensor spectrum;
  // (N,) int64 in host memory: forward_rows's rows, when the caller has them
  // there; undefined otherwise. A routed layer on a GPU reads its row lists
  // back once anyway (their sizes are shapes) and hands each operator its
  // own, so that an operator planning on the host (grouping rows by
  // sequence, sizing its products) need not copy its rows back, which would
  // wait for the device. On the CPU they are the rows themselves. forward
  // ignores it. Read it through rows_in_host_memory (chiar/rows.h), and only
  // to plan; an operator that calls another's forward_rows with other rows
  // resets it.
  at::Tensor host_rows;
};

// What a FLOP count may assume: the OpContext of the call, as flags.
struct FlopContext {
  bool causal = false;    // OpContext::causal
  bool spectrum = false;  // OpContext::spectrum is supplied
};

// Which part an operator plays among the operators of a routed layer, which
// are ordered cheapest first (RouterSpec::operators). The harness groups and
// presents operators by role (what a chart leaves out as "the rest", what
// `chiar inspect --corpus` counts, which operators the shared router checks
// stand in for); it never computes with it.
enum class OperatorRole {
  // Per-token or linear-time mixing that tokens of low spectral entropy take,
  // e.g. dct. The tokens a routed layer does not spend more on.
  CheapMixing,
  // Mixing across positions at less than quadratic cost that approximates
  // global mixing, e.g. rbf (kernel features) or fourier (FFT); in a 3-operator
  // layer, the tokens between cheap and global.
  IntermediateMixing,
  // Quadratic, attention-like mixing over every position that tokens of high
  // spectral entropy take, e.g. attention.
  GlobalMixing,
};

// What an operator supports, and how the harness presents it. The harness
// refuses variants that need more than the first three allow. The defaults
// here are the only ones: an operator states what differs from them.
struct OperatorTraits {
  bool causal = true;        // usable for causal language modelling
  bool padded = true;        // honours OpContext::valid (classification with padding)
  bool mixes_tokens = true;  // output at t depends on other positions

  // How reports, charts and `chiar inspect` name it, e.g. "Attention"; empty:
  // the name it is registered under.
  std::string display_name = {};
  // "#rrggbb", a light shade that dark text reads on: the background of its
  // tokens in HTML; terminals get the nearest ANSI colour. The default is a
  // neutral lilac.
  std::string colour = "#e7d3ee";
  OperatorRole role = OperatorRole::IntermediateMixing;
  // Its FLOPs are "attention FLOPs": the accounting's reference formula, the
  // reports' attention GFLOPs column and the paper's FLOP claims count them.
  bool attention_flops = false;
  // Honours OperatorSpec::pre_norm. The harness refuses model.norm = "pre"
  // for an operator that does not say so.
  bool pre_norm = false;
};

// Everything a factory needs to build one operator instance.
struct OperatorSpec {
  int64_t d_model = 128;
  int64_t n_heads = 4;
  uint64_t seed = 0;  // fixes any random but non-learned state (e.g. RBF frequencies)
  Params params;      // operator-specific options
  // Where the sub-layer's LayerNorm sits: false y = LN(x + f(x)), true
  // y = x + f(LN(x)) (chiar::SublayerNorm does either).
  bool pre_norm = false;
};

// A token-mixing (or per-token) sub-layer including its residual and LayerNorm:
// y = LN(x + f(x)), or y = x + f(LN(x)) with OperatorSpec::pre_norm.
// Implementations register all parameters in their constructor.
class CHIAR_API Operator : public torch::nn::Module {
 public:
  ~Operator() override;

  // x: (B, T, d) -> (B, T, d).
  virtual at::Tensor forward(const at::Tensor& x, const OpContext& ctx) = 0;

  // Outputs for selected token rows only. x: (B, T, d); rows: (N,) int64,
  // strictly increasing flat indices into B*T. Returns (N, d), equal to
  // forward(x, ctx).view({-1, d}).index_select(0, rows). Operators that mix
  // tokens still read every position of x (keys/values), but compute outputs
  // only for the rows.
  virtual at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext& ctx) = 0;

  // FLOPs of one sequence of length T of which n_rows positions produce outputs,
  // exactly as this implementation executes them (forward, and its backward).
  // forward(x) on B sequences costs B * flops(T, T, d).
  virtual FlopCount flops(int64_t T, int64_t n_rows, int64_t d) const = 0;

  // FLOPs of one sequence of length T whose output rows sit at `positions`
  // (ascending, in [0, T)), in a call described by ctx: what the harness
  // accounts. For operators whose cost depends on where a row is (causal
  // attention reads fewer keys early on) or on the context (a supplied
  // spectrum). The default, flops(T, positions.size(), d), is right for every
  // operator whose cost per row depends on neither.
  virtual FlopCount flops_at(int64_t T, const std::vector<int64_t>& positions, int64_t d, const FlopContext& ctx) const;

  virtual OperatorTraits traits() const = 0;

  // One line: name and the options in force, e.g. "attention(heads=4, rope)".
  virtual std::string describe() const = 0;
};

}  // namespace chiar
