#include "model.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>
#include <torch/utils.h>

#include <cmath>
#include <sstream>

#include "chiar/cross_entropy.h"
#include "chiar/error.h"
#include "chiar/layer_norm.h"
#include "chiar/linear.h"
#include "chiar/registry.h"

namespace chiar::model {

const char* to_string(TaskHead h) { return h == TaskHead::LanguageModel ? "language-model" : "classifier"; }

const char* to_string(MetaRouterKind m) {
  switch (m) {
    case MetaRouterKind::None: return "none";
    case MetaRouterKind::Causal: return "causal";
    case MetaRouterKind::BatchMean: return "batch_mean";
  }
  return "?";
}

MetaRouterKind meta_router_from_string(const std::string& name) {
  if (name == "none") return MetaRouterKind::None;
  if (name == "causal") return MetaRouterKind::Causal;
  if (name == "batch_mean") return MetaRouterKind::BatchMean;
  throw UserError("unknown meta_router '" + name + "' (known: none, causal, batch_mean)");
}

const char* to_string(NormPlacement n) {
  switch (n) {
    case NormPlacement::Auto: return "auto";
    case NormPlacement::Post: return "post";
    case NormPlacement::Pre: return "pre";
  }
  return "?";
}

NormPlacement norm_placement_from_string(const std::string& name) {
  if (name == "auto") return NormPlacement::Auto;
  if (name == "pre") return NormPlacement::Pre;
  if (name == "post") return NormPlacement::Post;
  throw UserError("unknown norm '" + name + "' (known: auto, pre, post)");
}

bool uses_pre_norm(const ModelOptions& o) {
  if (o.norm() == NormPlacement::Auto) return o.head() == TaskHead::Classifier;
  return o.norm() == NormPlacement::Pre;
}

std::vector<std::string> split_layer_spec(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream in(spec);
  std::string part;
  while (std::getline(in, part, '|')) {
    const auto b = part.find_first_not_of(" \t");
    const auto e = part.find_last_not_of(" \t");
    if (b == std::string::npos) throw UserError("layer '" + spec + "': empty operator name");
    parts.push_back(part.substr(b, e - b + 1));
  }
  if (parts.empty() || spec.back() == '|') throw UserError("layer '" + spec + "': empty operator name");
  return parts;
}

namespace {

// The loaded plugins of one kind ("operator", "router"), with their aliases:
// what a plan may name, for the message when a model lacks one.
std::string loaded(const PluginRegistry& registry, const std::string& kind) {
  std::string names;
  for (const auto& e : registry.entries()) {
    if (e.kind != kind) continue;
    names += (names.empty() ? "" : ", ") + e.name;
    for (const auto& alias : e.aliases) names += " (" + alias + ")";
  }
  return names.empty() ? "none; no plugins loaded" : names;
}

}  // namespace

std::string missing_layers_message(const std::string& operators_hint) {
  return "model.layers is required: one operator per block, or operators joined by '|' for a routed layer (" +
         operators_hint + ")";
}

std::string missing_router_message(const ModelOptions& options, const std::string& routers_hint) {
  if (!options.router().empty()) return "";
  const auto& layers = options.layers();
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].find('|') != std::string::npos)
      return "model.router is required: layer " + std::to_string(i + 1) + " ('" + layers[i] + "') is routed (" +
             routers_hint + ")";
  return "";
}

LayerOperators make_layer_operators(const PluginRegistry& registry, const ModelOptions& o, size_t layer) {
  LayerOperators made;
  for (const auto& requested : split_layer_spec(o.layers().at(layer))) {
    const std::string name = registry.canonical("operator", requested);
    OperatorSpec spec;
    spec.d_model = o.d_model();
    spec.n_heads = o.n_heads();
    spec.seed = o.seed() * 1000003ULL + layer * 101ULL + made.names.size();
    spec.pre_norm = uses_pre_norm(o);
    auto params = o.operator_params().find(name);
    if (params == o.operator_params().end()) params = o.operator_params().find(requested);
    if (params != o.operator_params().end()) spec.params = params->second;
    made.operators.push_back(registry.make_operator(name, spec));
    made.names.push_back(name);
  }
  return made;
}

std::shared_ptr<Router> make_layer_router(const PluginRegistry& registry, const ModelOptions& o, size_t layer,
                                          const std::vector<std::string>& names) {
  RouterSpec spec;
  spec.d_model = o.d_model();
  spec.operators = names;
  spec.seed = o.seed() * 1000003ULL + layer * 101ULL + 77ULL;
  spec.params = o.router_params();
  return registry.make_router(o.router(), spec);
}

std::string model_shape_problem(const ModelOptions& o) {
  if (o.d_model() >= 1 && o.n_heads() >= 1 && o.d_model() % o.n_heads() == 0) return "";
  return "model: d_model (" + std::to_string(o.d_model()) + ") must be a positive multiple of n_heads (" +
         std::to_string(o.n_heads()) + ")";
}

FeedForward::FeedForward(int64_t d, int64_t mult, double dropout, bool pre_norm) {
  up_ = register_module("up", torch::nn::Linear(d, mult * d));
  down_ = register_module("down", torch::nn::Linear(mult * d, d));
  norm_ = SublayerNorm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}))), pre_norm);
  drop_ = register_module("drop", torch::nn::Dropout(dropout));
}

at::Tensor FeedForward::forward(const at::Tensor& x) {
  // The up projection's bias joins the GELU (linear_bias_gelu, chiar/gelu.h):
  // its product then writes a fresh output instead of accumulating onto a
  // pre-filled bias, and backward sums the bias gradient in the GELU's own
  // pass. Under bf16 products the pre-activation, the activation and their
  // gradients are bf16: only the GELU and the down projection's product read
  // them. Without grad mode nothing keeps the pre-activation for backward,
  // and under bf16 products the up projection's kernels apply the GELU.
  const auto h = chiar::linear_bias_gelu(norm_.input(x), up_->weight, up_->bias);  // (B, T, m d)
  if (is_training() && drop_->options.p() > 0) return norm_.output(x + drop_(project(down_, h)));
  // The residual as the product's addend: one pass over (B, T, d) fewer than
  // adding it afterwards (docs/performance.md, 'FFN').
  return norm_.output(project(down_, h, x));
}

ChiarModel::ChiarModel(const PluginRegistry& registry, ModelOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (o.layers().empty()) throw UserError(missing_layers_message("operators loaded: " + loaded(registry, "operator")));
  if (const std::string m = missing_router_message(o, "routers loaded: " + loaded(registry, "router")); !m.empty())
    throw UserError(m);
  if (const std::string m = model_shape_problem(o); !m.empty()) throw UserError(m);
  if (o.vocab_size() < 1) throw UserError("model: vocab_size must be positive");
  // The matrix loader refuses it at its key first; this covers C++ callers.
  if (!(o.embed_std() > 0)) throw UserError("model: embed_std must be positive");
  if (o.head() == TaskHead::Classifier && o.n_classes() < 2)
    throw UserError("model: a classifier needs n_classes >= 2");
  if (o.ffn_mult() < 1) throw UserError("model: ffn_mult must be positive");
  if (!(o.dropout() >= 0 && o.dropout() < 1)) throw UserError("model: dropout must lie in [0, 1)");
  // Options for an operator no plugin provides would apply to nothing.
  for (const auto& [name, params] : o.operator_params()) {
    try {
      registry.canonical("operator", name);
    } catch (const UserError& e) {
      throw UserError("model.operators: " + std::string(e.what()));
    }
  }
  torch::manual_seed(o.seed());

  const bool causal = o.head() == TaskHead::LanguageModel;
  const bool pre_norm = uses_pre_norm(o);
  embed_ = register_module("embed", torch::nn::Embedding(o.vocab_size(), o.d_model()));
  torch::NoGradGuard no_grad;
  embed_->weight.normal_(0.0, o.embed_std());
  embed_drop_ = register_module("embed_drop", torch::nn::Dropout(o.dropout()));

  for (size_t i = 0; i < o.layers().size(); ++i) {
    auto [names, ops] = make_layer_operators(registry, o, i);
    for (size_t k = 0; k < ops.size(); ++k) {
      const auto traits = ops[k]->traits();
      if (causal && !traits.causal)
        throw UserError("layer " + std::to_string(i + 1) + ": operator '" + names[k] +
                        "' does not support causal language modelling (it reads future tokens)");
      if (!causal && !traits.padded)
        throw UserError("layer " + std::to_string(i + 1) + ": operator '" + names[k] +
                        "' does not support padded classification inputs");
      if (pre_norm && !traits.pre_norm)
        throw UserError("layer " + std::to_string(i + 1) + ": operator '" + names[k] +
                        "' does not support pre-norm sub-layers (its traits do not declare pre_norm), which "
                        "model.norm = \"" +
                        to_string(o.norm()) + "\" asks for here; set model.norm = \"post\"");
    }
    std::shared_ptr<Router> router = ops.size() > 1 ? make_layer_router(registry, o, i, names) : nullptr;
    auto layer = std::make_shared<MixingLayer>(static_cast<int64_t>(i), names, ops, router);
    layer->set_execution(o.execution());
    mixing_.push_back(register_module("mix" + std::to_string(i), layer));
    ffn_.push_back(register_module("ffn" + std::to_string(i),
                                   std::make_shared<FeedForward>(o.d_model(), o.ffn_mult(), o.dropout(), pre_norm)));
  }
  // Post-norm ends every block normalised; pre-norm's residual stream is not.
  if (pre_norm)
    final_norm_ = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()})));

  if (o.meta_router() != MetaRouterKind::None) {
    meta_ = register_module("meta", torch::nn::Linear(o.d_model(), 1));
    // Start with the gate near 0.88: layer 1's mixing mostly on, as v2 intends.
    meta_->weight.zero_();
    meta_->bias.fill_(std::log(0.88 / 0.12));
  }
  if (o.head() == TaskHead::Classifier) {
    cls_hidden_ = register_module("cls_hidden", torch::nn::Linear(o.d_model(), o.d_model()));
    cls_out_ = register_module("cls_out", torch::nn::Linear(o.d_model(), o.n_classes()));
  }
}

at::Tensor ChiarModel::meta_gate(const at::Tensor& x) {
  if (options_.meta_router() == MetaRouterKind::BatchMean)
    return at::sigmoid(meta_->forward(x.mean(at::IntArrayRef{0, 1}, /*keepdim=*/true)));  // (1, 1, 1)
  // Prefix mean over positions <= t: no information from the future.
  auto counts = at::arange(1, x.size(1) + 1, x.options()).view({1, -1, 1});
  return at::sigmoid(meta_->forward(x.cumsum(1) / counts));  // (B, T, 1)
}

at::Tensor ChiarModel::pool(const at::Tensor& h, const at::Tensor& valid) const {
  if (!valid.defined()) return h.mean(1);
  auto w = valid.to(h.scalar_type()).unsqueeze(-1);  // (B, T, 1)
  return (h * w).sum(1) / w.sum(1).clamp_min(1.0);
}

ModelOutput ChiarModel::forward(const at::Tensor& tokens, const at::Tensor& valid, bool logits) {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be (B, T)");
  ModelOutput out;
  OpContext ctx;
  ctx.causal = options_.head() == TaskHead::LanguageModel;
  ctx.valid = valid;
  auto h = embed_drop_(embed_(tokens));  // (B, T, d)
  for (size_t i = 0; i < mixing_.size(); ++i) {
    LayerRouting routing;
    auto mixed = mixing_[i]->forward(h, ctx, &routing, &out.aux_loss);
    if (i == 0 && meta_) {
      out.meta_gate = meta_gate(h);
      mixed = out.meta_gate * mixed + (1.0 - out.meta_gate) * h;
    }
    if (mixing_[i]->routed()) out.routing.push_back(routing);
    h = ffn_[i]->forward(mixed);
  }
  if (final_norm_) h = chiar::apply_layer_norm(final_norm_, h);
  if (options_.head() == TaskHead::LanguageModel) {
    out.hidden = h;
    if (logits) out.logits = chiar::linear(h, embed_->weight);  // tied head: (B, T, V)
  } else {
    out.logits = cls_out_->forward(at::gelu(cls_hidden_->forward(pool(h, valid))));  // (B, C)
  }
  return out;
}

at::Tensor ChiarModel::lm_loss(const ModelOutput& out, const at::Tensor& targets, const at::Tensor& weights) const {
  if (options_.head() != TaskHead::LanguageModel || !out.hidden.defined())
    throw UserError("lm_loss: needs a language model's output");
  const int64_t d = out.hidden.size(-1);
  return linear_cross_entropy(out.hidden.reshape({-1, d}), embed_->weight, targets.reshape({-1}),
                              weights.defined() ? weights.reshape({-1}) : weights);
}

void ChiarModel::calibrate_routers(const at::Tensor& tokens, const at::Tensor& valid) {
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  size_t routed_index = 0;
  for (const auto& layer : mixing_) {
    if (!layer->routed()) continue;
    auto out = forward(tokens, valid);
    auto h = out.routing.at(routed_index).entropy;
    if (valid.defined()) h = h.masked_select(valid);
    layer->router()->calibrate(h);
    ++routed_index;
  }
  train(was_training);
}

void ChiarModel::set_execution(Execution e) {
  options_.execution(e);
  for (auto& layer : mixing_) layer->set_execution(e);
}

int64_t ChiarModel::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

std::string ChiarModel::describe() const {
  std::ostringstream out;
  out << "ChiarModel(" << to_string(options_.head()) << ", vocab " << options_.vocab_size() << ", d "
      << options_.d_model() << ", heads " << options_.n_heads() << ", ffn x" << options_.ffn_mult() << ", "
      << (uses_pre_norm(options_) ? "pre" : "post") << "-norm";
  if (options_.head() == TaskHead::Classifier) out << ", classes " << options_.n_classes();
  if (options_.meta_router() != MetaRouterKind::None) out << ", meta_router " << to_string(options_.meta_router());
  out << ", layers [";
  for (size_t i = 0; i < mixing_.size(); ++i) out << (i ? "; " : "") << mixing_[i]->describe();
  out << "], " << parameter_count() << " parameters)";
  return out.str();
}

}  // namespace chiar::model
