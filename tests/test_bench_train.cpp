// chiar bench-train end to end: every variant and precision measured, every
// JSON field written, bad options refused by name.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "bench/op_times.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::TempDir;

TEST_CASE("bench-train: every variant measured, every JSON field written", "[engine][bench]") {
  TempDir d("bench");
  const std::string json = d.path() + "/b.json";
  // A tiny model of every variant named, timed over `steps` steps; `extra` options last.
  const auto bench = [](const std::string& variants, const std::string& steps, std::vector<std::string> extra) {
    std::vector<std::string> args = {"bench-train",
                                     "--variants-file",
                                     std::string(CHIAR_SOURCE_DIR) + "/configs/variants.toml",
                                     "--variants",
                                     variants,
                                     "--batch",
                                     "2",
                                     "--seq",
                                     "16",
                                     "--d-model",
                                     "16",
                                     "--heads",
                                     "2",
                                     "--vocab",
                                     "50",
                                     "--steps",
                                     steps,
                                     "--warmup",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_chiar(args);
  };
  const auto out = bench("baseline,chiar_dct_attn,chiar_soft", "2", {"--json", json});
  INFO(out.output);
  REQUIRE(out.status == 0);
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  for (const char* v : {"\"baseline\"", "\"chiar_dct_attn\"", "\"chiar_soft\""})
    CHECK(text.find(v) != std::string::npos);
  for (const char* k : {"train_tokens_per_s", "infer_tokens_per_s", "step_flops", "achieved_gflops", "gemm_gflops",
                        "peak_rss_mb", "\"device\": \"cpu\"", "\"precision\": \"fp32\""}) {
    size_t n = 0;
    for (size_t at = text.find(k); at != std::string::npos; at = text.find(k, at + 1)) ++n;
    CHECK(n == 3);
  }
  // A dense soft model executes more FLOPs per step than the sparse DCT+Attn model.
  const auto flops_of = [&](const std::string& v) {
    const auto at = text.find("\"step_flops\": ", text.find("\"" + v + "\""));
    return std::stod(text.substr(at + 14));
  };
  CHECK(flops_of("chiar_soft") > flops_of("chiar_dct_attn"));
  // Operator by operator on request, after the timed steps.
  const auto ops = bench("baseline", "1", {"--op-times", "2"});
  INFO(ops.output);
  REQUIRE(ops.status == 0);
  CHECK_THAT(ops.output, Catch::Matchers::Contains("baseline: operators by self time, ms per training step (2 recorded "
                                                   "steps of ") &&
                             Catch::Matchers::Contains("chiar::linear_cross_entropy") &&
                             Catch::Matchers::Contains("[chiar::linear]"));
  // bf16 autocast in the timed forward passes, on request.
  const std::string bf16_json = d.path() + "/bf16.json";
  const auto bf16 = bench("baseline", "1", {"--precision", "bf16", "--json", bf16_json});
  INFO(bf16.output);
  REQUIRE(bf16.status == 0);
  CHECK(test::read_text(bf16_json).find("\"precision\": \"bf16\"") != std::string::npos);
  // Both precisions in one process, interleaved: one entry each, each against its own GEMM rate.
  const std::string both_json = d.path() + "/both.json";
  const auto both = bench("baseline", "1", {"--compare-precision", "fp32,bf16", "--json", both_json});
  INFO(both.output);
  REQUIRE(both.status == 0);
  const std::string both_text = test::read_text(both_json);
  for (const char* k : {"\"baseline@fp32\"", "\"baseline@bf16\"", "\"precision\": \"fp32\"", "\"precision\": \"bf16\""})
    CHECK(both_text.find(k) != std::string::npos);
  CHECK_THAT(both.output, Catch::Matchers::Contains("libtorch bf16 ") && Catch::Matchers::Contains(" fp32 ") &&
                              Catch::Matchers::Contains("baseline: bf16 / fp32 train "));
  const auto twice = bench("baseline", "1", {"--compare-precision", "bf16,bf16"});
  CHECK(twice.status == 2);
  CHECK(twice.output == "chiar: --compare-precision: 'bf16' is given twice\n");
  const auto exclusive = bench("baseline", "1", {"--compare-precision", "fp32,bf16", "--precision", "fp32"});
  CHECK(exclusive.status == 2);
  CHECK(exclusive.output == "chiar: --precision excludes --compare-precision\n");
  // Bad values are refused by the option that carries them, before anything is timed.
  const std::string variants = std::string(CHIAR_SOURCE_DIR) + "/configs/variants.toml";
  const auto unknown = test::run_chiar({"bench-train", "--variants", "basline", "--variants-file", variants});
  CHECK(unknown.status == 2);
  CHECK_THAT(unknown.output, Catch::Matchers::StartsWith("chiar: --variants: no variant 'basline' is defined (did you "
                                                         "mean 'baseline'?"));
  for (const auto& [flag, value, low] :
       std::vector<std::tuple<std::string, std::string, int>>{{"--steps", "0", 1},
                                                              {"--warmup", "-1", 0},
                                                              {"--batch", "0", 1},
                                                              {"--seq", "-4", 1},
                                                              {"--d-model", "0", 1},
                                                              {"--layers", "0", 1},
                                                              {"--heads", "0", 1},
                                                              {"--vocab", "0", 1},
                                                              {"--op-times", "-1", 0}}) {
    const auto refused = test::run_chiar({"bench-train", "--variants-file", variants, flag, value});
    CHECK(refused.status == 2);
    CHECK(refused.output == "chiar: " + flag + ": must be at least " + std::to_string(low) + ", found " + value + "\n");
  }
}

TEST_CASE("OpRecorder: each operator's self time, the scope it ran in and its calls", "[bench]") {
  const auto a = at::ones({8});
  std::vector<bench::OpTime> times;
  {
    const bench::OpRecorder recorder;
    {
      RECORD_USER_SCOPE("test::outer");
      const auto b = at::add(a, a);
      at::add(b, a);
    }
    at::mul(a, a);
    times = recorder.times();
  }
  const auto find = [&](const std::string& op, const std::string& scope) -> const bench::OpTime* {
    for (const auto& t : times)
      if (t.op == op && t.scope == scope) return &t;
    return nullptr;
  };
  const auto* outer = find("test::outer", "");
  const auto* add = find("aten::add", "test::outer");
  const auto* mul = find("aten::mul", "");
  REQUIRE(outer);
  REQUIRE(add);
  REQUIRE(mul);
  CHECK(outer->calls == 1);
  CHECK(add->calls == 2);
  CHECK(mul->calls == 1);
  CHECK(!find("aten::add", ""));  // both adds ran inside the scope
  // The scope's own time is its time less its calls' (the two adds).
  CHECK(outer->self_ms == Approx(outer->total_ms - add->total_ms).margin(1e-9));
  for (const auto& t : times) {
    CHECK(t.self_ms >= 0);
    CHECK(t.self_ms <= t.total_ms);
  }
  for (size_t i = 1; i < times.size(); ++i) CHECK(times[i - 1].self_ms >= times[i].self_ms);
  // A recorder that has ended records nothing more; a new one starts empty.
  at::add(a, a);
  const bench::OpRecorder next;
  CHECK(next.times().empty());
}
