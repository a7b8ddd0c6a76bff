// chiar new-plugin: writes a ready-to-build plugin folder from templates.
#include <iostream>
#include <regex>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "chiar/registry.h"
#include "commands.h"
#include "engine/training/durable_file.h"

namespace chiar::cli {
namespace {

const char* kCMake = R"TPL(cmake_minimum_required(VERSION 3.18)
project(chiar_plugin_@NAME@ LANGUAGES CXX)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release)
endif()

# The installed harness: cmake -S . -B build -DCMAKE_PREFIX_PATH=<where chiar is installed>
find_package(ChiarHarness REQUIRED)

# Builds build/plugins/libchiar_@NAME@.so with the harness's flags.
chiar_add_plugin(@NAME@ SOURCES @NAME@.cpp)

# The shared conformance checks, run by ctest.
find_package(Catch2 2 REQUIRED)
enable_testing()
add_executable(test_@NAME@ test_@NAME@.cpp)
target_link_libraries(test_@NAME@ PRIVATE chiar::core Catch2::Catch2)
target_compile_definitions(test_@NAME@ PRIVATE PLUGIN_FILE="$<TARGET_FILE:chiar_plugin_@NAME@>")
add_dependencies(test_@NAME@ chiar_plugin_@NAME@)
add_test(NAME test_@NAME@ COMMAND test_@NAME@)
)TPL";

const char* kOperator = R"TPL(// @NAME@: an operator plugin. It starts as a per-token linear mixing,
// y = LN(x + W x) (pre-norm: x + W LN(x)); replace mix() with your operator.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/layer_norm.h"
#include "chiar/linear.h"
#include "chiar/plugin.h"
#include "chiar/rows.h"

namespace {

using namespace chiar;

class Op final : public Operator {
 public:
  // Register every parameter here; read options from spec.params (unread
  // options are reported to the user as unknown).
  explicit Op(const OperatorSpec& spec) : d_(spec.d_model) {
    linear_ = register_module("linear", torch::nn::Linear(d_, d_));
    // Where the LayerNorm sits (spec.pre_norm): mix() reads norm_.input(x),
    // the result is norm_.output(x + mix).
    norm_ = SublayerNorm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_}))),
                         spec.pre_norm);
  }

  // x: (B, T, d) -> (B, T, d), residual and LayerNorm included. When
  // ctx.causal, the output at t may read positions <= t only; ctx.valid (B, T)
  // marks real tokens: padding must not change real outputs.
  at::Tensor forward(const at::Tensor& x, const OpContext&) override {
    return norm_.output(x + mix(norm_.input(x)));
  }

  // Outputs for rows only: rows (N,) are increasing flat indices into B*T;
  // returns (N, d) equal to the same rows of forward. Compute only what the
  // rows need (operators that mix tokens still read all of x).
  at::Tensor forward_rows(const at::Tensor& x, const at::Tensor& rows, const OpContext&) override {
    auto xr = chiar::gather_rows(x.reshape({-1, d_}), rows);  // (N, d)
    return norm_.output(xr + mix(norm_.input(xr)));
  }

  // FLOPs of one sequence of length T of which n rows produce outputs, as this
  // code executes them: forward, and the backward of that call.
  FlopCount flops(int64_t, int64_t n, int64_t d) const override {
    return matmul_flops(n, d, d) + elementwise_flops(n, d) + layernorm_flops(n, d);
  }

  // What the harness may ask of it, and how it presents it; every field not
  // set keeps the default in chiar/operator.h.
  OperatorTraits traits() const override {
    OperatorTraits t;
    t.causal = true;         // per token, so causal
    t.padded = true;         // and indifferent to padding
    t.mixes_tokens = false;
    t.display_name = "@NAME@";  // reports, charts and `chiar inspect` show this
    t.colour = "#e7d3ee";    // "#rrggbb": its tokens' background in HTML; terminals get the nearest ANSI colour
    // CheapMixing (per token or linear time, low-entropy tokens),
    // IntermediateMixing (sub-quadratic mixing across positions) or
    // GlobalMixing (quadratic, attention-like).
    t.role = OperatorRole::CheapMixing;
    t.attention_flops = false;  // true: its FLOPs count as attention FLOPs in reports and claims
    t.pre_norm = true;          // it honours spec.pre_norm (model.norm = "pre")
    return t;
  }
  std::string describe() const override { return "@NAME@"; }

 private:
  // project() runs the product on the GEMM library the run chose (--gemm).
  at::Tensor mix(const at::Tensor& x) { return project(linear_, x); }

  int64_t d_;
  torch::nn::Linear linear_{nullptr};  // (d -> d)
  SublayerNorm norm_;
};

void register_plugin(Registrar& r) {
  r.add_operator("@NAME@", "@NAME@: per-token linear mixing (a template)",
                 [](const OperatorSpec& spec) { return std::make_unique<Op>(spec); });
  // Every option the constructor reads, {key, kind, default, meaning}: none
  // yet. `chiar options` lists them, and a matrix setting a key not declared
  // here is refused before anything runs.
  r.declare_options("operator", "@NAME@", {});
}

}  // namespace

CHIAR_PLUGIN("operator", register_plugin)
)TPL";

const char* kRouter = R"TPL(// @NAME@: a router plugin. It starts as a fixed entropy threshold: a token
// with spectral entropy above tau takes the last operator, others the first.
#include <ATen/ATen.h>

#include "chiar/plugin.h"

namespace {

using namespace chiar;

class Rt final : public Router {
 public:
  explicit Rt(const RouterSpec& spec)
      : k_(static_cast<int64_t>(spec.operators.size())), tau_(spec.params.get_double("tau", 0.8)) {}

  // x: (B, T, d); entropy: (B, T). weights (B, T, K) must sum to 1 and choice
  // must be their argmax; Hard mode means one-hot weights and no gradient into
  // the decision (the layer then runs sparsely). When ctx.causal, the decision
  // at t may depend on positions <= t only.
  RouteResult route(const at::Tensor& x, const at::Tensor& entropy, const OpContext&) override {
    RouteResult r;
    r.choice = (entropy.detach() > tau_).to(at::kLong) * (k_ - 1);  // (B, T)
    r.weights = at::one_hot(r.choice, k_).to(x.scalar_type());       // (B, T, K)
    r.mode = RouteMode::Hard;
    return r;
  }

  std::string describe() const override { return "@NAME@(tau " + std::to_string(tau_) + ")"; }

 private:
  int64_t k_;
  double tau_;
};

void register_plugin(Registrar& r) {
  r.add_router("@NAME@", "@NAME@: fixed entropy threshold (a template)",
               [](const RouterSpec& spec) { return std::make_unique<Rt>(spec); });
  // Every option the constructor reads, {key, kind, default, meaning}:
  // `chiar options` lists them, and a matrix setting a key not declared here
  // (router_params = { tua = 0.5 }) is refused before anything runs.
  r.declare_options("router", "@NAME@",
                    {{"tau", ParamKind::Number, "0.8", "entropy above which a token takes the last operator"}});
}

}  // namespace

CHIAR_PLUGIN("router", register_plugin)
)TPL";

const char* kTask = R"TPL(// @NAME@: a task plugin. It starts as a generated classification task:
// sequences of 4..12 digits, the label is their sum mod 10.
#include <ATen/ATen.h>

#include "chiar/class_data.h"
#include "chiar/plugin.h"
#include "chiar/random.h"

namespace {

using namespace chiar;

class Tk final : public ClassificationTask {
 public:
  // Build every split here; errors about data are UserErrors naming the file.
  explicit Tk(const TaskSpec& spec) : ClassificationTask("@NAME@") {
    const int64_t n = spec.params.get_int("n", 2000);
    SplitMix64 rng(static_cast<uint64_t>(spec.params.get_int("data_seed", 0)));
    for (const char* split : {"train", "valid", "test"}) {
      ClassSplit s(split, 10, /*pad_id=*/0, /*max_len=*/12);
      for (int64_t i = 0; i < (std::string(split) == "train" ? n : n / 10); ++i) {
        std::vector<int32_t> ids;
        int sum = 0;
        for (int64_t j = rng.between(4, 12); j > 0; --j) {
          const int digit = static_cast<int>(rng.below(10));
          ids.push_back(digit + 1);  // ids 1..10; 0 is padding
          sum += digit;
        }
        const auto length = static_cast<int64_t>(ids.size());
        s.add(std::move(ids), sum % 10, length);
      }
      add_split(std::move(s));
    }
  }

  int64_t vocab_size() const override { return 11; }
  int64_t n_classes() const override { return 10; }
  int64_t seq_len() const override { return 12; }
  int64_t pad_id() const override { return 0; }
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids;
    for (char c : text)
      if (c >= '0' && c <= '9') ids.push_back(c - '0' + 1);
    return ids;
  }
  std::string token_text(int64_t id) const override { return id <= 0 ? "<pad>" : std::to_string(id - 1); }
  std::string describe() const override { return "@NAME@(digit sums mod 10)"; }
};

void register_plugin(Registrar& r) {
  r.add_task("@NAME@", "@NAME@: digit sums mod 10 (a template)",
             [](const TaskSpec& spec) { return std::make_unique<Tk>(spec); });
  // Every option the constructor reads: the harness refuses an unknown key or
  // a value of another kind before the constructor runs.
  r.declare_options("task", "@NAME@",
                    {{"n", ParamKind::Int, "2000", "examples per split"},
                     {"data_seed", ParamKind::Int, "0", "seed of the generated examples"}});
}

}  // namespace

CHIAR_PLUGIN("task", register_plugin)
)TPL";

const char* kTest = R"TPL(// Runs the harness's shared conformance checks on this plugin.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "chiar/conformance.h"
#include "chiar/registry.h"

TEST_CASE("@NAME@ passes the conformance checks") {
  chiar::PluginRegistry registry;
  registry.load_file(PLUGIN_FILE);
  @CHECK@
  for (const auto& failure : failures) WARN(failure);
  CHECK(failures.empty());
}
)TPL";

const char* kReadme = R"TPL(# @NAME@ (a chiar-harness @KIND@ plugin)

Describe here what the @KIND@ computes, its options, and its costs.

Build against an installed harness and run the conformance checks:

    cmake -S . -B build -DCMAKE_PREFIX_PATH=<harness prefix>
    cmake --build build && ctest --test-dir build --output-on-failure

Use it: `chiar --plugin-dir build/plugins plugins` lists it; in a matrix, run
`chiar --plugin-dir build/plugins run matrix.toml` with, for example,
@USE@
)TPL";

std::string fill(std::string text, const std::map<std::string, std::string>& values) {
  for (const auto& [k, v] : values) text = std::regex_replace(text, std::regex("@" + k + "@"), v);
  return text;
}

// The kind and name, and no plugin already registered under the name: the
// loader refuses a second registration of a name (or alias) already taken,
// so a plugin under it could never load beside that one.
void check_new_plugin(const Global& g, const NewPluginArgs& a) {
  if (a.kind != "operator" && a.kind != "router" && a.kind != "task")
    throw UserError("new-plugin: kind must be operator, router or task, found '" + a.kind + "'");
  if (!std::regex_match(a.name, std::regex("[a-z][a-z0-9_]*")))
    throw UserError("new-plugin: name must be lower case letters, digits and _, starting with a letter; found '" +
                    a.name + "'");
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  if (registry.has(a.kind, a.name)) {
    const std::string taken = registry.canonical(a.kind, a.name);
    std::string file;
    for (const auto& e : registry.entries())
      if (e.kind == a.kind && e.name == taken) file = e.file;
    throw UserError("new-plugin: " + a.kind + " '" + a.name + "' is already registered by '" + file +
                    "', and the loader refuses a second; choose another name");
  }
}

// The test's conformance check and the README's matrix snippet, per kind.
struct KindText {
  std::string check, use;
};

KindText kind_text(const NewPluginArgs& a) {
  if (a.kind == "operator")
    return {
        "const auto make = [&](int64_t d, int64_t heads) {\n"
        "    chiar::OperatorSpec spec;\n    spec.d_model = d;\n    spec.n_heads = heads;\n"
        "    return registry.make_operator(\"" +
            a.name +
            "\", spec);\n  };\n"
            "  auto failures = chiar::check_operator(make);\n"
            "  // The operator test matrix: every standard case against itself in float64.\n"
            "  for (const auto& c : chiar::operator_cases(make(16, 2)->traits(), false))\n"
            "    if (const auto r = chiar::run_operator_case(make, c); !r.failure.empty())\n"
            "      failures.push_back(c.name() + \": \" + r.failure);",
        "\n    [variants.mine]\n    layers = [\"dct\", \"dct|" + a.name + "\", \"dct|" + a.name +
            "\", \"attn\"]\n    router = \"threshold\"\n"};
  if (a.kind == "router")
    return {
        "const auto failures = chiar::check_router([&](const std::vector<std::string>& ops) {\n"
        "    chiar::RouterSpec spec;\n    spec.d_model = 16;\n    spec.operators = ops;\n"
        "    return registry.make_router(\"" +
            a.name + "\", spec);\n  });",
        "\n    [variants.mine]\n    layers = [\"dct\", \"dct|attn\", \"dct|attn\", \"attn\"]\n    router = \"" +
            a.name + "\"\n"};
  return {
      "chiar::TaskSpec spec;\n  spec.params.set(\"n\", int64_t{200});\n"
      "  const auto failures = chiar::check_task(*registry.make_task(\"" +
          a.name + "\", spec));",
      "\n    [tasks.mine]\n    plugin = \"" + a.name + "\"\n"};
}

// All four files or none: a folder left half written would block a rerun.
void write_plugin_folder(const boost::filesystem::path& dir, const NewPluginArgs& a) {
  boost::system::error_code ec;
  boost::filesystem::create_directories(dir, ec);
  if (ec) throw EnvironmentError(dir.string() + ": cannot create the folder: " + ec.message());
  const KindText text = kind_text(a);
  const std::map<std::string, std::string> v = {
      {"NAME", a.name}, {"KIND", a.kind}, {"CHECK", text.check}, {"USE", text.use}};
  const char* source = a.kind == "operator" ? kOperator : a.kind == "router" ? kRouter : kTask;
  try {
    engine::write_file_durably((dir / "CMakeLists.txt").string(), fill(kCMake, v));
    engine::write_file_durably((dir / (a.name + ".cpp")).string(), fill(source, v));
    engine::write_file_durably((dir / ("test_" + a.name + ".cpp")).string(), fill(kTest, v));
    engine::write_file_durably((dir / "README.md").string(), fill(kReadme, v));
  } catch (...) {
    boost::filesystem::remove_all(dir, ec);
    throw;
  }
}

}  // namespace

int run_new_plugin(const Global& g, const NewPluginArgs& a) {
  check_new_plugin(g, a);
  const boost::filesystem::path dir = boost::filesystem::path(a.dir) / a.name;
  if (boost::filesystem::exists(dir)) throw UserError("new-plugin: '" + dir.string() + "' already exists");
  write_plugin_folder(dir, a);
  std::cout << "wrote " << dir.string() << "/{CMakeLists.txt, " << a.name << ".cpp, test_" << a.name
            << ".cpp, README.md}\nbuild: cmake -S " << dir.string() << " -B " << dir.string()
            << "/build -DCMAKE_PREFIX_PATH=<harness prefix> && cmake --build " << dir.string() << "/build\n";
  return 0;
}

}  // namespace chiar::cli
