// chiar: the harness command line. Parsing lives here; commands.h has the bodies.
#include <CLI/CLI.hpp>

#include <iostream>

#include "chiar/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  using namespace chiar::cli;
  CLI::App app{"chiar: benchmark and ablation harness for spectral-entropy routed transformers"};
  app.require_subcommand(1);
  Global g;
  app.add_option("--threads", g.threads, "intra-op threads (0 = all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--plugin-dir", g.plugin_dirs, "extra plugin folder (repeatable)");

  auto* info = app.add_subcommand("info", "libtorch, threads, BLAS and the measured GEMM rate");
  auto* plugins = app.add_subcommand("plugins", "list every plugin: name, kind, description, file, API");

  std::string input = "-", dct_impl = "auto";
  auto* entropy = app.add_subcommand(
      "entropy", "spectral entropy of each line's vector (float64, 12 significant digits)");
  entropy->add_option("file", input, "input file, or - for stdin");
  entropy->add_option("--dct", dct_impl, "DCT implementation: auto, gemm, fft");

  ModelArgs m;
  auto* model = app.add_subcommand("model", "build a model from a layer plan; print it and its size");
  model->add_option("--layers", m.layers, "layer plan, e.g. dct 'dct|attn' 'dct|attn' attn")
      ->delimiter(',');
  model->add_option("--router", m.router, "router plugin for routed layers");
  model->add_option("--router-set", m.router_set, "router option key=value (repeatable)");
  model->add_option("--op-set", m.operator_set, "operator option op.key=value (repeatable)");
  model->add_option("--head", m.head, "lm or classifier");
  model->add_option("--meta-router", m.meta_router, "none, causal or batch_mean");
  model->add_option("--vocab", m.vocab, "vocabulary size");
  model->add_option("--d-model", m.d_model, "model width");
  model->add_option("--heads", m.heads, "attention heads");
  model->add_option("--classes", m.classes, "classes (classifier head)");
  model->add_option("--seed", m.seed, "seed");
  model->add_option("--batch", m.batch, "with --seq: run one forward pass and print routing shares");
  model->add_option("--seq", m.seq, "sequence length of that forward pass");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "chiar: " << e.what() << "\n";
    return 2;
  }

  try {
    if (*info) return run_info(g);
    if (*plugins) return run_plugins(g);
    if (*entropy) return run_entropy(g, input, dct_impl);
    if (*model) return run_model(g, m);
  } catch (const chiar::UserError& e) {
    std::cerr << "chiar: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
