// How the harness presents operators comes from their traits alone: an
// operator built outside the tree (tests/extra_plugins/shade_operator.cpp)
// is named and coloured by `chiar inspect`, plotted in the report's routing
// chart and benchmarked by chiar_bench without any harness edit. Also the
// claims file's errors.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>

#include <boost/filesystem.hpp>

#include "chiar/conformance.h"
#include "chiar/error.h"
#include "chiar/registry.h"
#include "report/claims.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

namespace {

const std::string kShadeDir = std::string(CHIAR_TEST_PLUGIN_DIR) + "/shade";

std::string read(const std::string& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// A tiny word corpus and a matrix with one routed variant, dct|shade;
// `norm` is its model.norm line (shade is post-norm only; "auto" is post on
// a language model).
void write_shade_matrix(const TempDir& d, const std::string& norm = "") {
  test::write_word_corpus(d, {"the", "light", "falls", "on", "a", "shade", "of", "grey", "and", "blue"}, 11, 200, 40);
  d.write("m.toml", R"([matrix]
name = "shade"
variants = ["routed"]
tasks = ["lm"]
seeds = [0]

)" + test::kTinyModelTable +
                        "\n[train]\n" + test::tiny_train_body() + R"(
[variants.routed]
layers = ["dct", "dct|shade"]
router = "threshold"
router_params = { shares = [0.5, 0.5] }
)" + norm + "\n" + test::kTinyLmTask);
}

struct Output {
  int status = -1;
  std::string text;
};

Output capture(const std::string& command) {
  Output o;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) o.text += buf.data();
  const int rc = p ? pclose(p) : -1;
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return o;
}

}  // namespace

TEST_CASE("operator traits come from the registry, without a model", "[presentation][plugins]") {
  PluginRegistry r;
  r.load_default({kShadeDir});
  const OperatorTraits shade = r.operator_traits("shade");
  CHECK(shade.display_name == "Shade");
  CHECK(shade.colour == "#f5e6a3");
  CHECK(shade.role == OperatorRole::IntermediateMixing);
  CHECK_FALSE(shade.attention_flops);
  const OperatorTraits attention = r.operator_traits("attn");  // aliases too
  CHECK(attention.display_name == "Attention");
  CHECK(attention.colour == "#f7c9c0");
  CHECK(attention.role == OperatorRole::GlobalMixing);
  CHECK(attention.attention_flops);
  CHECK(r.operator_traits("dct").role == OperatorRole::CheapMixing);
  CHECK(r.operator_traits("rbf").colour == "#cdeccf");
  CHECK_THROWS_AS(r.operator_traits("nope"), UserError);
  // Asking made an instance, yet the global generator is where it was.
  at::manual_seed(5);
  const auto expected = at::rand({4});
  at::manual_seed(5);
  PluginRegistry fresh;
  fresh.load_default({kShadeDir});
  fresh.operator_traits("attention");
  fresh.operator_traits("shade");
  CHECK(at::equal(at::rand({4}), expected));
  CHECK(check_operator([&](int64_t d, int64_t heads) {
          OperatorSpec spec;
          spec.d_model = d;
          spec.n_heads = heads;
          return r.make_operator("shade", spec);
        }).empty());
}

TEST_CASE("an operator that does not declare pre_norm is refused in a pre-norm model", "[presentation][errors]") {
  TempDir d("shade-pre");
  write_shade_matrix(d, "norm = \"pre\"\n");
  const std::string db = d.path() + "/s.db";
  const auto ran = test::run_chiar({"--plugin-dir", kShadeDir, "run", d.path() + "/m.toml", "--db", db, "--data-root",
                                    d.path(), "--cache-dir", d.path() + "/cache"});
  INFO(ran.output);
  CHECK(ran.status == 2);  // bad input: refused before anything runs, nothing written
  CHECK_THAT(ran.output,
             Catch::Matchers::Contains(
                 "/m.toml:21:1: variant 'routed' on task 'lm': layer 2: operator 'shade' does not support "
                 "pre-norm sub-layers (its traits do not declare pre_norm), which model.norm = \"pre\" asks "
                 "for here; set model.norm = \"post\""));
  CHECK_FALSE(boost::filesystem::exists(db));
}

TEST_CASE("an operator from outside the tree is coloured, charted and benchmarked", "[presentation][cli]") {
  TempDir d("shade");
  write_shade_matrix(d);
  const std::string db = d.path() + "/s.db";
  const std::vector<std::string> data = {"--data-root", d.path(), "--cache-dir", d.path() + "/cache"};
  std::vector<std::string> run = {"--plugin-dir", kShadeDir, "run", d.path() + "/m.toml", "--db", db};
  run.insert(run.end(), data.begin(), data.end());
  const auto ran = test::run_chiar(run);
  INFO(ran.output);
  REQUIRE(ran.status == 0);

  // chiar inspect: ANSI colours from the traits' colours (shade's pale yellow
  // is ANSI yellow, dct's pale blue ANSI blue), and the HTML's own colours
  // and display names.
  std::vector<std::string> inspect = {
      "--plugin-dir", kShadeDir,          "inspect", db,
      "--run",        "routed/lm/seed=0", "--text",  "the light falls on a shade of grey and blue the light",
      "--color",      "always",           "--html",  d.path() + "/routes.html"};
  inspect.insert(inspect.end(), data.begin(), data.end());
  const auto shown = test::run_chiar(inspect);
  INFO(shown.output);
  REQUIRE(shown.status == 0);
  CHECK_THAT(shown.output, Catch::Matchers::Contains("\033[33mshade         \033[0m"));
  CHECK_THAT(shown.output, Catch::Matchers::Contains("\033[34mdct           \033[0m"));
  const std::string html = read(d.path() + "/routes.html");
  CHECK_THAT(html, Catch::Matchers::Contains("<span style=\"background:#cfe3f7\">DCT</span>"
                                             "<span style=\"background:#f5e6a3\">Shade</span>"));
  CHECK_THAT(html, Catch::Matchers::Contains("<span class=\"t\" style=\"background:#f5e6a3\""));

  // chiar report: the routing chart plots shade under its display name and
  // the caption names it; DCT takes the rest.
  const auto report = test::run_chiar({"--plugin-dir", kShadeDir, "report", db, "--out", d.path() + "/r/shade",
                                       "--claims", std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml"});
  INFO(report.output);
  REQUIRE(report.status == 0);
  const std::string chart = read(d.path() + "/r/shade-routing-lm.svg");
  CHECK_THAT(chart, Catch::Matchers::Contains("routed L2 Shade"));
  const std::string md = read(d.path() + "/r/shade.md");
  CHECK_THAT(md, Catch::Matchers::Contains("*Share of tokens sent to Shade ("));
  CHECK_THAT(md, Catch::Matchers::Contains("; the rest go to DCT. A share falling to 0 is routing collapse.*"));

#ifdef CHIAR_BENCH
  // chiar_bench: a forward and a forward+backward case for every operator it
  // finds, shade included.
  const auto bench =
      capture(std::string(CHIAR_BENCH) + " --allow-debug --plugin-dir=" + kShadeDir + " --benchmark_list_tests");
  INFO(bench.text);
  CHECK(bench.status == 0);
  CHECK_THAT(bench.text, Catch::Matchers::Contains("\nshade/fwd/128/256/real_time\n"));
  CHECK_THAT(bench.text, Catch::Matchers::Contains("\nshade/fwd+bwd/2048/512/real_time\n"));
  CHECK_THAT(bench.text, Catch::Matchers::Contains("\nrouted_dct_attn/sparse/128/256/0/real_time\n"));
  const auto without = capture(std::string(CHIAR_BENCH) + " --allow-debug --benchmark_list_tests");
  CHECK(without.text.find("shade/") == std::string::npos);
#else
  WARN("chiar_bench is not built (Google Benchmark not found): its cases are not checked");
#endif
}

TEST_CASE("claims file: unknown keys and names are refused at file:line", "[presentation][report][errors]") {
  TempDir d("claims-file");
  const std::string variants = std::string(CHIAR_SOURCE_DIR) + "/configs/variants.toml";
  const auto claim = [&](const std::string& names, const std::string& metric, const std::string& extra) {
    return "include = [\"" + variants +
           "\"]\n\n[[claims]]\nid = \"x\"\ntext = \"X beats Y\"\nkind = \"compare\"\n"
           "task = \"*\"\nvariants = " +
           names + "\nmetric = \"" + metric + "\"\nbetter = \"lower\"\n" + extra;
  };
  const std::string named = "[\"chiar_dct_attn\", \"$baseline\"]";
  const std::string good = d.write("good.toml", claim(named, "token_ppl", ""));
  const auto specs = report::load_claims(good);
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].variants == std::vector<std::string>{"chiar_dct_attn", "$baseline"});

  const std::string key = d.write("key.toml", claim(named, "token_ppl", "paperr = [1, 2]\n"));
  CHECK_THROWS_WITH(report::load_claims(key),
                    key + ":11:10: key 'claims[0].paperr': unknown key (did you mean 'paper'?)");
  const std::string variant = d.write("variant.toml", claim("[\"chiar_dtc_attn\", \"$baseline\"]", "token_ppl", ""));
  CHECK_THROWS_WITH(report::load_claims(variant),
                    variant +
                        ":8:12: key 'claims[0].variants': unknown variant 'chiar_dtc_attn' (did you mean "
                        "'chiar_dct_attn'?)");
  const std::string metric = d.write("metric.toml", claim(named, "tokn_ppl", ""));
  CHECK_THROWS_WITH(report::load_claims(metric),
                    metric + ":9:10: key 'claims[0].metric': unknown metric 'tokn_ppl' (did you mean 'token_ppl'?)");

  // Through the CLI: one message, exit status 2, nothing written.
  const auto out = test::run_chiar({"report", d.path() + "/none.db", "--out", d.path() + "/r/x", "--claims", variant});
  CHECK(out.status == 2);
  CHECK(out.output == "chiar: " + variant +
                          ":8:12: key 'claims[0].variants': unknown variant 'chiar_dtc_attn' (did you mean "
                          "'chiar_dct_attn'?)\n");
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/r"));
}
