#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>
#include <sys/wait.h>

#include <boost/filesystem.hpp>

#include "chiar/registry.h"
#include "engine/runtime/runtime.h"
#include "chiar/error.h"
#include "chiar/plugin.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/reference.h"
#include "support/skip.h"
#include "support/temp_dir.h"
#include "chiar/listops.h"
#include <cerrno>
#include <cstring>
#include <sstream>

using namespace chiar;
using test::TempDir;

namespace {

const std::string kBroken = CHIAR_TEST_PLUGIN_DIR;  // build/test_plugins/<case>/
std::string broken(const std::string& name) { return kBroken + "/" + name + "/libchiar_" + name + ".so"; }
std::string in_tree(const std::string& name) { return std::string(CHIAR_PLUGIN_DIR) + "/libchiar_" + name + ".so"; }
std::string in_tree_task(const std::string& name) { return in_tree(name); }

struct Result {
  int status;
  std::string output;
};

// A command that computes measures the BLAS first and, below 20 GFLOP/s,
// prints the runtime and a warning: on a loaded machine it can, so the exact
// messages checked here are compared without those lines (the warning's
// own text is checked through engine::describe(), below).
std::string without_slow_blas_notice(const std::string& output) {
  if (output.find("warning: the BLAS runs a GEMM at ") == std::string::npos) return output;
  std::istringstream lines(output);
  std::string kept, line;
  while (std::getline(lines, line))
    if (line.rfind("libtorch ", 0) != 0 && line.rfind("warning: the BLAS runs a GEMM at ", 0) != 0) kept += line + "\n";
  return kept;
}

// Runs the chiar CLI with arguments; captures stdout and stderr together.
Result run_cli(const std::string& args, const std::string& input = "", const std::string& env = "") {
  std::string command = env + " " + CHIAR_CLI + " " + args + " 2>&1";
  if (!input.empty()) command = "printf '" + input + "' | " + command;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed: " + std::string(std::strerror(errno))};
  std::string out;
  std::array<char, 512> buffer{};
  while (fgets(buffer.data(), buffer.size(), pipe)) out += buffer.data();
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, without_slow_blas_notice(out)};
}

}  // namespace

TEST_CASE("the in-tree plugins load and list every kind", "[plugins]") {
  const auto entries = test::plugins().entries();
  std::vector<std::string> names;
  for (const auto& e : entries) {
    names.push_back(e.kind + ":" + e.name);
    CHECK(e.api_version == CHIAR_PLUGIN_API_VERSION);
    CHECK_FALSE(e.description.empty());
  }
  CHECK(names == std::vector<std::string>{"operator:attention", "operator:dct", "operator:fourier", "operator:rbf",
                                          "router:hard_ste", "router:soft", "router:threshold", "router:topk_entropy",
                                          "task:imdb", "task:listops", "task:listops_flat", "task:wikitext"});
  CHECK(test::plugins().canonical("operator", "attn") == "attention");
}

TEST_CASE("loader errors name the file and what is wrong", "[plugins][errors]") {
  PluginRegistry r;
  CHECK_THROWS_WITH(r.load_directory("/nonexistent/chiar-plugins"),
                    "plugin folder '/nonexistent/chiar-plugins' does not exist or is not a folder");
  CHECK_THROWS_WITH(r.load_file("/nonexistent/libchiar_x.so"),
                    "plugin file '/nonexistent/libchiar_x.so' does not exist");
  CHECK_THROWS_WITH(r.load_file(broken("no_entry")),
                    "plugin file '" + broken("no_entry") +
                        "' has no entry point 'chiar_plugin_entry' (a chiar plugin declares one with CHIAR_PLUGIN)");
  CHECK_THROWS_WITH(r.load_file(broken("bad_api")),
                    "plugin file '" + broken("bad_api") +
                        "' was built for plugin API version 999, but this harness provides version " +
                        std::to_string(CHIAR_PLUGIN_API_VERSION) + "; rebuild the plugin");
  // Plugin API 8 changed no layout: a plugin of API 7 still loads.
  CHECK_NOTHROW(r.load_file(broken("old_api")));
  CHECK_THROWS_WITH(r.load_file(broken("bad_torch")),
                    "plugin file '" + broken("bad_torch") +
                        "' was built against libtorch 0.1, but this harness uses libtorch " +
                        CHIAR_TORCH_VERSION_STRING + "; rebuild the plugin");
  CHECK_THROWS_WITH(r.load_file(broken("throws_registering")), "plugin file '" + broken("throws_registering") +
                                                                   "' failed while registering: cannot register today");
  // Nothing from the failed libraries was registered.
  CHECK(r.entries().empty());
}

TEST_CASE("two plugins may not register the same name", "[plugins][errors]") {
  PluginRegistry r;
  r.load_file(in_tree("dct"));
  CHECK_THROWS_WITH(r.load_file(broken("duplicate_dct")), "plugin file '" + broken("duplicate_dct") +
                                                              "' registers operator 'dct', which '" + in_tree("dct") +
                                                              "' already registered");
  // Loading the same file twice is not a clash.
  r.load_file(in_tree("dct"));
  CHECK(r.entries().size() == 1);
}

TEST_CASE("a plugin may register only the kinds it declares", "[plugins][errors]") {
  PluginRegistry r;
  CHECK_THROWS_WITH(r.load_file(broken("undeclared_kind")),
                    "plugin file '" + broken("undeclared_kind") +
                        "' failed while registering: it registers router 'sneaky' but declares kinds 'operator'");
}

TEST_CASE("a throwing factory and unknown names give clear errors", "[plugins][errors]") {
  PluginRegistry r;
  r.load_file(broken("throwing"));
  r.load_file(in_tree("dct"));
  OperatorSpec spec;
  CHECK_THROWS_WITH(r.make_operator("explode", spec),
                    "operator 'explode' (" + broken("throwing") + "): factory failed: boom");
  // A libtorch error's message, without the backtrace libtorch appends to what().
  CHECK_THROWS_WITH(r.make_operator("explode_in_torch", spec),
                    "operator 'explode_in_torch' (" + broken("throwing") + "): factory failed: boom in libtorch");
  // Memory running out is not the plugin's fault: it passes through as it was thrown.
  CHECK_THROWS_AS(r.make_operator("runs_out", spec), c10::OutOfMemoryError);
  CHECK_THROWS_WITH(r.make_operator("attention", spec),
                    "unknown operator 'attention' (known: dct, explode, explode_in_torch, runs_out)");
  CHECK_THROWS_WITH(r.make_router("threshold", {}), "unknown router 'threshold' (known: none; no plugins loaded)");
  spec.params.set("colour", std::string("blue")).set("dct_impl", std::string("gemm"));
  CHECK_THROWS_WITH(r.make_operator("dct", spec),
                    "operator 'dct' (" + in_tree("dct") + "): unknown parameter 'colour' (known: dct_impl)");
}

TEST_CASE("an object keeps its plugin library loaded after the registry is gone", "[plugins][lifetime]") {
  std::shared_ptr<Operator> op;
  {
    PluginRegistry r;
    r.load_file(in_tree("attention"));
    OperatorSpec spec;
    spec.d_model = 8;
    spec.n_heads = 2;
    op = r.make_operator("attention", spec);
  }
  // The registry (and its handles) are destroyed; the code must still be there.
  auto y = op->forward(at::randn({1, 4, 8}), {});
  CHECK(y.sizes() == at::IntArrayRef({1, 4, 8}));
  CHECK(op->describe() == std::string("attention(heads 2, block 128, fused core (fp32 CPU), else ") +
                              (test::attention_has_sdpa() ? "SDPA" : "chunked") + ", rope)");
  // The interface type is shared across the boundary.
  std::shared_ptr<torch::nn::Module> as_module = op;
  CHECK(std::dynamic_pointer_cast<Operator>(as_module) != nullptr);
  op.reset();  // unloads the library after the destructor ran
}

TEST_CASE("plugin search path: CHIAR_PLUGIN_PATH and extra folders", "[plugins]") {
  PluginRegistry r;
  setenv("CHIAR_PLUGIN_PATH", (kBroken + "/throwing").c_str(), 1);
  r.load_default();
  unsetenv("CHIAR_PLUGIN_PATH");
  CHECK(r.has("operator", "explode"));
  CHECK(r.has("operator", "dct"));
  PluginRegistry missing;
  CHECK_THROWS_WITH(missing.load_default({"/nonexistent/extra"}),
                    "plugin folder '/nonexistent/extra' does not exist or is not a folder");
}

TEST_CASE("CLI: exit status 2 and one clear message for bad input", "[plugins][cli]") {
  auto bad_dir = run_cli("--plugin-dir /nonexistent/x plugins");
  CHECK(bad_dir.status == 2);
  CHECK(bad_dir.output == "chiar: plugin folder '/nonexistent/x' does not exist or is not a folder\n");
  auto broken_dir = run_cli("--plugin-dir " + kBroken + "/bad_api plugins");
  CHECK(broken_dir.status == 2);
  CHECK_THAT(broken_dir.output, Catch::Matchers::Contains("was built for plugin API version 999"));
  auto ragged = run_cli("entropy -", "1 2\\n3\\n");
  CHECK(ragged.status == 2);
  CHECK(ragged.output == "chiar: <stdin>:2: expected 2 numbers (as on line 1), found 1\n");
  auto missing = run_cli("entropy /nonexistent/vectors.txt");
  CHECK(missing.status == 2);
  CHECK(missing.output == "chiar: /nonexistent/vectors.txt: cannot open the file\n");
  auto unknown_option = run_cli("plugins --colour");
  CHECK(unknown_option.status == 2);
  auto no_layers = run_cli("model --router threshold");
  CHECK(no_layers.status == 2);
  CHECK(no_layers.output == "chiar: --layers is required\n");
  auto unknown_router = run_cli("model --layers 'dct|attn' --router mystery");
  CHECK(unknown_router.status == 2);
  CHECK(unknown_router.output == "chiar: unknown router 'mystery' (known: hard_ste, soft, threshold, topk_entropy)\n");
  // The harness has no router of its own: a routed plan names one.
  auto no_router = run_cli("model --layers 'dct,dct|attn'");
  CHECK(no_router.status == 2);
  CHECK(no_router.output ==
        "chiar: model.router is required: layer 2 ('dct|attn') is routed (routers loaded: "
        "hard_ste, soft, threshold, topk_entropy)\n");
  CHECK(run_cli("model --layers 'dct,attn'").status == 0);  // nothing routed, nothing to name
}

TEST_CASE("CLI: plugins lists, entropy prints H per line", "[plugins][cli]") {
  auto list = run_cli("plugins");
  CHECK(list.status == 0);
  CHECK_THAT(list.output, Catch::Matchers::Contains("attention, attn  operator"));
  CHECK_THAT(list.output, Catch::Matchers::Contains("libchiar_threshold.so"));
  auto h = run_cli("entropy", "5 5 5 5\\n0 0 0 0\\n1 -2 3 -4\\n");
  CHECK(h.status == 0);
  // Constant: all energy at DC; zero: 0 by definition; the third from the reference.
  double a = 0, b = 0, c = 0;
  REQUIRE(std::sscanf(h.output.c_str(), "%lf\n%lf\n%lf", &a, &b, &c) == 3);
  CHECK(a == Approx(0).margin(1e-12));
  CHECK(b == 0);
  auto x = at::tensor(std::vector<double>{1, -2, 3, -4}).view({1, 4});
  CHECK(c == Approx(test::ref::entropy(x).item<double>()).epsilon(1e-11));
  CHECK(h.output.find("-0") == std::string::npos);
}

TEST_CASE("runtime: the BLAS libtorch binds to is named, slow GEMM is flagged", "[runtime][cli]") {
  auto normal = run_cli("info");
  CHECK(normal.status == 0);
  if (normal.output.find("libtorch's own BLAS: ") != std::string::npos) {
    // A libtorch wheel (Torch_DIR): its BLAS is linked into libtorch_cpu,
    // named from its build configuration, and no preloaded one replaces it.
    CHIAR_SKIP("[runtime]",
               "libtorch links its own BLAS: the OpenBLAS and reference-BLAS checks apply to Debian's libtorch");
  }
  // The set-up scripts install OpenBLAS and, beside it, the reference BLAS.
  CHECK_THAT(normal.output, Catch::Matchers::Contains("openblas"));
  const std::string reference = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  REQUIRE(std::ifstream(reference).good());
  const std::string out = run_cli("--threads 1 info", "", "LD_PRELOAD=" + reference).output;
  CHECK_THAT(out, Catch::Matchers::Contains("BLAS       /usr/lib/x86_64-linux-gnu/blas/libblas.so.3"));
  CHECK_THAT(out, Catch::Matchers::Contains("threads    1"));

  // The products' own library may be fast on the reference BLAS (oneDNN
  // brings its own sgemm), but libtorch's other products are not: the BLAS's
  // rate decides the warning.
  engine::RuntimeInfo slow;
  slow.gemm_gflops = 480;
  slow.blas_gflops = 7.5;
  slow.gemm_size = 512;
  slow.blas = reference;
  CHECK_THAT(engine::describe(slow),
             Catch::Matchers::EndsWith("warning: the BLAS runs a GEMM at 7.5 GFLOP/s (< 20.0): libtorch is on "
                                       "the reference BLAS; install libopenblas0-openmp"));
  engine::RuntimeInfo fast = slow;
  fast.blas_gflops = 90;
  CHECK_THAT(engine::describe(fast), !Catch::Matchers::Contains("warning"));
}

TEST_CASE("CLI: data commands", "[cli][data]") {
  TempDir d("cli-data");
  auto missing = run_cli("data stats --task wikitext --set path=" + d.path() + "/none");
  CHECK(missing.status == 2);
  CHECK(missing.output == "chiar: task 'wikitext' (" + in_tree_task("wikitext") + "): " + d.path() +
                              "/none/wiki.train.tokens: cannot open the file\n");
  auto no_task = run_cli("data stats");
  CHECK(no_task.status == 2);
  CHECK(no_task.output == "chiar: data stats: give a TOML file with --table, or --task NAME\n");
  auto unknown = run_cli("data stats --task mnist");
  CHECK(unknown.status == 2);
  CHECK(unknown.output == "chiar: unknown task 'mnist' (known: imdb, listops, listops_flat, wikitext)\n");

  const std::string a = d.path() + "/a.tsv", b = d.path() + "/b.tsv";
  CHECK(run_cli("data listops --n 20 --seed 3 --min-len 20 --max-len 200 --out " + a).status == 0);
  CHECK(run_cli("--threads 1 data listops --n 20 --seed 3 --min-len 20 --max-len 200 --out " + b).status == 0);
  std::ifstream fa(a), fb(b);
  std::stringstream sa, sb;
  sa << fa.rdbuf();
  sb << fb.rdbuf();
  CHECK(sa.str() == sb.str());
  CHECK(read_listops_tsv(a).size() == 20);

  d.write("c/wiki.train.tokens", "a b\nc\n");
  d.write("c/wiki.valid.tokens", "a\n");
  d.write("c/wiki.test.tokens", "a b c d\n");
  auto stats = run_cli("data stats --task wikitext --set path=" + d.path() + "/c --set seq_len=4");
  CHECK(stats.status == 0);
  // The test row: examples, tokens (4 words + <eos>), words, bytes, "d" unknown.
  std::istringstream lines(stats.output);
  std::string line;
  std::vector<std::string> row;
  while (std::getline(lines, line))
    if (line.rfind("test ", 0) == 0) {
      std::istringstream fields(line);
      for (std::string f; fields >> f;) row.push_back(f);
    }
  REQUIRE(row.size() >= 7);  // ... vocabulary {a, b, c, <unk>, <eos>}
  CHECK(std::vector<std::string>(row.begin(), row.begin() + 7) ==
        std::vector<std::string>{"test", "1", "5", "5", "8", "5", "20.00"});
}

// Docs that state the plugin API version say the one the header defines:
// every "API version ... currently N" (or CHIAR_PLUGIN_API_VERSION ... currently N)
// in README.md and docs/*.md, so a version bump cannot leave a page behind.
TEST_CASE("the docs state the current plugin API version", "[plugins][docs]") {
  const std::regex stated(R"((API version|CHIAR_PLUGIN_API_VERSION)[^;]{0,100}?currently (\d+))");
  std::vector<std::string> pages = {CHIAR_SOURCE_DIR "/README.md"};
  for (const auto& entry : boost::filesystem::directory_iterator(CHIAR_SOURCE_DIR "/docs"))
    if (entry.path().extension() == ".md") pages.push_back(entry.path().string());
  int statements = 0;
  for (const auto& page : pages) {
    std::string flat = test::read_text(page);
    std::replace(flat.begin(), flat.end(), '\n', ' ');  // a statement may wrap
    for (std::sregex_iterator it(flat.begin(), flat.end(), stated), end; it != end; ++it) {
      INFO(page << ": " << it->str());
      CHECK(std::stoi((*it)[2].str()) == CHIAR_PLUGIN_API_VERSION);
      ++statements;
    }
  }
  CHECK(statements >= 2);  // docs/design.md and docs/plugins.md state it
}

TEST_CASE("plugins: declared options are refused by key and kind before the factory runs", "[plugins]") {
  PluginRegistry r;
  r.load_default();
  const auto declared = r.declared_options("router", "threshold");
  REQUIRE(declared);
  REQUIRE(declared->size() == 2);
  CHECK((*declared)[0].key == "tau");
  CHECK((*declared)[0].default_value == "auto");
  CHECK(r.declared_options("operator", "attn"));  // by alias too
  RouterSpec spec;
  spec.d_model = 8;
  spec.operators = {"dct", "attention"};
  spec.params.set("tua", std::string("auto"));
  std::string file;
  for (const auto& e : r.entries())
    if (e.name == "threshold") file = e.file;
  const std::string who = "router 'threshold' (" + file + "): ";
  CHECK_THROWS_WITH(r.make_router("threshold", spec), who + "unknown parameter 'tua' (known: shares, tau)");
  spec.params = Params().set("tau", std::string("high"));
  CHECK_THROWS_WITH(r.make_router("threshold", spec),
                    who + "parameter 'tau': expected a list of numbers or \"auto\", found a string (\"high\")");
  spec.params = Params().set("tau", std::string("auto"));
  CHECK_NOTHROW(r.make_router("threshold", spec));
  spec.params = Params().set("tau", 0.5);
  CHECK_NOTHROW(r.make_router("threshold", spec));
}

TEST_CASE("plugins: chiar options lists every plugin's declared options", "[plugins][cli]") {
  const auto printed = run_cli("options");
  REQUIRE(printed.status == 0);
  CHECK_THAT(printed.output,
             Catch::Matchers::Contains("### router `threshold`\n\n| key | takes | default | meaning |"));
  CHECK_THAT(printed.output, Catch::Matchers::Contains("| `tau` | a list of numbers or \"auto\" | `auto` |"));
  CHECK_THAT(printed.output, Catch::Matchers::Contains("### operator `attention` (also `attn`)"));
  CHECK_THAT(printed.output, Catch::Matchers::Contains("| `core` | a string | `auto` |"));
  CHECK_THAT(printed.output, Catch::Matchers::Contains("### task `listops`"));
}

TEST_CASE("declared defaults reach an operator's constructor through Params", "[plugins]") {
  Params p;
  p.set("given", 2.0).set_default("given", 5.0).set_default("defaulted", int64_t{3});
  CHECK(p.get_double("given") == 2.0);  // a value given wins over the default
  CHECK(p.get_int("defaulted") == 3);
  p.set_default("never_read", true);
  CHECK(p.unread_keys().empty());  // a default nobody reads is not an unknown key
  CHECK_THROWS_WITH(Params().get_int("missing"),
                    "option 'missing' is not set and its declaration gives no default value");
  // rbf declares features = 64 and reads it without a fallback: its
  // frequencies are (d, features).
  OperatorSpec spec;
  spec.d_model = 16;
  spec.n_heads = 2;
  const auto features = [&](const Params& params) {
    spec.params = params;
    return test::plugins().make_operator("rbf", spec)->named_buffers()["omega"].size(1);
  };
  CHECK(features({}) == 64);
  CHECK(features(Params().set("features", int64_t{16})) == 16);
}
