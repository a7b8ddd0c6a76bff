#include <ATen/ATen.h>
#include <torch/utils.h>

#include <iomanip>
#include <iostream>

#include "model/model.h"
#include "chiar/registry.h"
#include "chiar/error.h"
#include "commands.h"

namespace chiar::cli {
namespace {

model::OperatorParams parse_operator_set(const std::vector<std::string>& assignments) {
  model::OperatorParams out;
  for (const auto& a : assignments) {
    const auto dot = a.find('.');
    const auto eq = a.find('=');
    if (dot == std::string::npos || eq == std::string::npos || dot > eq)
      throw UserError("--op-set: expected operator.key=value, found '" + a + "'");
    const std::string op = a.substr(0, dot);
    const Params one = Params::from_assignments({a.substr(dot + 1)});
    for (const auto& kv : one.values()) out[op].set(kv.first, kv.second);
  }
  return out;
}

}  // namespace

int run_model(const Global& g, const ModelArgs& a) {
  start_compute(g);
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  if (a.head != "lm" && a.head != "classifier")
    throw UserError("--head: expected 'lm' or 'classifier', found '" + a.head + "'");
  model::ModelOptions options;
  options.vocab_size(a.vocab)
      .d_model(a.d_model)
      .n_heads(a.heads)
      .n_classes(a.classes)
      .head(a.head == "lm" ? TaskHead::LanguageModel : TaskHead::Classifier)
      .router(a.router)
      .router_params(Params::from_assignments(a.router_set))
      .operator_params(parse_operator_set(a.operator_set))
      .meta_router(model::meta_router_from_string(a.meta_router))
      .layers(a.layers)
      .seed(a.seed);
  model::ChiarModel model(registry, options);
  std::cout << model.describe() << "\n";
  std::cout << "parameters: " << model.parameter_count() << "\n";
  if (a.batch <= 0 || a.seq <= 0) return 0;

  torch::NoGradGuard no_grad;
  model.eval();
  auto tokens = at::randint(a.vocab, {a.batch, a.seq}, at::TensorOptions().dtype(at::kLong));
  auto out = model.forward(tokens);
  std::cout << "forward on random tokens (" << a.batch << " x " << a.seq << "): logits " << out.logits.sizes() << "\n";
  for (const auto& r : out.routing) {
    const auto& names = model.mixing_layers()[r.layer]->operator_names();
    std::cout << "  layer " << r.layer + 1 << (r.sparse ? " (sparse)" : " (dense)") << ":";
    for (size_t k = 0; k < names.size(); ++k) {
      const double share = (r.choice == static_cast<int64_t>(k)).to(at::kDouble).mean().item<double>();
      std::cout << " " << names[k] << " " << std::fixed << std::setprecision(1) << 100 * share << "%";
    }
    std::cout << ", mean H " << std::setprecision(4) << r.entropy.mean().item<double>() << "\n";
  }
  return 0;
}

}  // namespace chiar::cli
