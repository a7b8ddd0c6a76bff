#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/layer_norm.h"
#include "chiar/params.h"
#include "chiar/task.h"
#include "mixing_layer.h"

namespace chiar {
class PluginRegistry;
}

// The model the harness assembles from plugins: application code, not part
// of the plugin SDK (harness/include/chiar).
namespace chiar::model {

// "language-model" or "classifier", as descriptions print it.
const char* to_string(TaskHead h);

// The paper's v2 task-level gate on layer 1: y = g * mix(x) + (1 - g) * x with
// g = sigmoid(Linear(mean x)). "causal" averages positions <= t (no look-ahead);
// "batch_mean" is the reference's form: one gate from the mean over the batch.
enum class MetaRouterKind { None, Causal, BatchMean };
const char* to_string(MetaRouterKind m);
MetaRouterKind meta_router_from_string(const std::string& name);

// Where every sub-layer's LayerNorm sits (chiar::SublayerNorm): "post"
// y = LN(x + f(x)), the paper's blocks; "pre" y = x + f(LN(x)) and one more
// LN before the head; "auto" (the default) pre for a classifier, post for a
// language model: at the harness's budgets post-norm stalls classification
// and pre-norm slows language modelling (docs/method.md, "Training recipe").
enum class NormPlacement { Auto, Post, Pre };
const char* to_string(NormPlacement n);
NormPlacement norm_placement_from_string(const std::string& name);

using OperatorParams = std::map<std::string, Params>;  // operator name -> its options

// A chained setter, a getter and the member (NAME_) for one option.
#define CHIAR_OPTION(type, name)               \
  ModelOptions& name(type value) {             \
    name##_ = std::move(value);                \
    return *this;                              \
  }                                            \
  const type& name() const { return name##_; } \
  type name##_

// Everything that defines a model. Setters chain: ModelOptions().d_model(128).
// `layers` has no default: which operators exist is the plugins' business.
struct ModelOptions {
  CHIAR_OPTION(int64_t, vocab_size) = 8192;
  CHIAR_OPTION(int64_t, d_model) = 256;
  CHIAR_OPTION(int64_t, n_heads) = 4;
  CHIAR_OPTION(int64_t, ffn_mult) = 4;
  CHIAR_OPTION(int64_t, n_classes) = 2;
  CHIAR_OPTION(double, dropout) = 0.0;
  CHIAR_OPTION(TaskHead, head) = TaskHead::LanguageModel;
  // Required. One entry per block: a registered operator name, or names joined
  // by '|' for a routed layer, cheapest first (configs/variants.toml has the
  // paper's plans). Nothing in the harness branches on these names.
  CHIAR_OPTION(std::vector<std::string>, layers) = {};
  // Required when a layer is routed: the router plugin of every routed layer
  // (configs/variants.toml names the paper's in its [model] table).
  CHIAR_OPTION(std::string, router) = {};
  CHIAR_OPTION(Params, router_params) = {};
  CHIAR_OPTION(OperatorParams, operator_params) = {};  // applied to every instance
  CHIAR_OPTION(MetaRouterKind, meta_router) = MetaRouterKind::None;
  CHIAR_OPTION(Execution, execution) = Execution::Auto;
  CHIAR_OPTION(NormPlacement, norm) = NormPlacement::Auto;
  // The token embedding starts as N(0, embed_std^2); a language model's head
  // is the same matrix (tied), so this also sets its first logits' size.
  CHIAR_OPTION(double, embed_std) = 0.02;
  CHIAR_OPTION(uint64_t, seed) = 0;  // parameter init and fixed random state
};
#undef CHIAR_OPTION

// The block's second half: y = LN(x + W2 GELU(W1 x)) (pre-norm:
// x + W2 GELU(W1 LN(x))), d -> ffn_mult*d -> d. Identical whichever operator
// a token took, so variants match in size.
class FeedForward : public torch::nn::Module {
 public:
  FeedForward(int64_t d, int64_t mult, double dropout, bool pre_norm);
  at::Tensor forward(const at::Tensor& x);  // (B, T, d) -> (B, T, d)

 private:
  torch::nn::Linear up_{nullptr}, down_{nullptr};  // (d -> m d), (m d -> d)
  SublayerNorm norm_;
  torch::nn::Dropout drop_{nullptr};
};

struct ModelOutput {
  at::Tensor logits;                  // (B, T, V) language model, (B, C) classifier; undefined when not asked for
  at::Tensor hidden;                  // (B, T, d) language model: the final hidden states the tied head reads
  at::Tensor aux_loss;                // () routers' regularisers, or undefined
  at::Tensor meta_gate;               // (B, T, 1) or (1, 1, 1) MetaRouter gate, or undefined
  std::vector<LayerRouting> routing;  // one per routed layer, in order
};

class ChiarModel : public torch::nn::Module {
 public:
  // Builds every operator and router through the registry. Seeds libtorch's
  // generator with options.seed first, so the same options give the same model.
  ChiarModel(const PluginRegistry& registry, ModelOptions options);

  // tokens: (B, T) int64; valid: (B, T) bool, true for real tokens (undefined =
  // all real). Padding never enters pooling or attention. logits = false
  // leaves a language model's logits out (training takes its loss from
  // `hidden` through lm_loss); a classifier always has them.
  ModelOutput forward(const at::Tensor& tokens, const at::Tensor& valid = {}, bool logits = true);

  // A language model's token cross-entropy through its tied head, fused
  // (chiar/cross_entropy.h): sum_i w_i nll_i over out.hidden's B*T tokens.
  //   targets (B, T) int64; weights (B, T), e.g. valid / valid.sum(), or
  //   undefined for the mean. Returns ().
  at::Tensor lm_loss(const ModelOutput& out, const at::Tensor& targets, const at::Tensor& weights = {}) const;

  // Feeds a sample through the model and lets each routed layer's router set
  // its data-derived thresholds, layer by layer (a later layer sees the input
  // produced under the earlier layers' calibrated routing).
  void calibrate_routers(const at::Tensor& tokens, const at::Tensor& valid = {});

  void set_execution(Execution e);
  const ModelOptions& options() const { return options_; }
  const std::vector<std::shared_ptr<MixingLayer>>& mixing_layers() const { return mixing_; }
  int64_t parameter_count() const;
  std::string describe() const;  // one line
  // (V, d) the token embedding, which is also a language model's head.
  const at::Tensor& embedding_weight() const { return embed_->weight; }

 private:
  at::Tensor pool(const at::Tensor& h, const at::Tensor& valid) const;  // (B,T,d) -> (B,d)
  at::Tensor meta_gate(const at::Tensor& x);                            // (B,T,d) -> (B,T,1) or (1,1,1)

  ModelOptions options_;
  torch::nn::Embedding embed_{nullptr};  // (V, d), tied with the LM head
  torch::nn::Dropout embed_drop_{nullptr};
  std::vector<std::shared_ptr<MixingLayer>> mixing_;
  std::vector<std::shared_ptr<FeedForward>> ffn_;
  torch::nn::LayerNorm final_norm_{nullptr};                  // pre-norm only: the residual stream's LN before the head
  torch::nn::Linear meta_{nullptr};                           // (d -> 1) MetaRouter gate
  torch::nn::Linear cls_hidden_{nullptr}, cls_out_{nullptr};  // (d -> d), (d -> C)
};

// Whether the model's sub-layers are pre-norm: model.norm, with "auto"
// resolved by the head.
bool uses_pre_norm(const ModelOptions& o);

// "a|b" -> {"a", "b"}; whitespace trimmed; empty parts are an error.
std::vector<std::string> split_layer_spec(const std::string& spec);

// The refusal of a model without `layers`; `operators_hint` says where the
// operator names come from (the loaded plugins, or `chiar plugins`).
std::string missing_layers_message(const std::string& operators_hint);

// The refusal of a plan that routes a layer but names no `router`, or ""
// when it routes none or names one; `routers_hint` says where the router
// names come from.
std::string missing_router_message(const ModelOptions& options, const std::string& routers_hint);

// The operators of layer `layer` (0-based) of the plan, as the model makes
// them: canonical names in plan order, each with its options from
// `operator_params` and the layer's seeds. Throws the registry's UserError
// for an unknown name or option.
struct LayerOperators {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<Operator>> operators;
};
LayerOperators make_layer_operators(const PluginRegistry& registry, const ModelOptions& options, size_t layer);

// The router over a routed layer's operators (`names`, canonical), as the
// model makes it. Throws the registry's UserError.
std::shared_ptr<Router> make_layer_router(const PluginRegistry& registry, const ModelOptions& options, size_t layer,
                                          const std::vector<std::string>& names);

// The refusal of a width that the heads do not divide, or "":
//   model: d_model (64) must be a positive multiple of n_heads (5)
std::string model_shape_problem(const ModelOptions& options);

}  // namespace chiar::model
