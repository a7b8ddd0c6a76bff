// chiar bench-train end to end: every variant and precision measured, every
// JSON field written, bad options refused by name.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "bench/op_times.h"
#include "bench/round_stats.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::TempDir;

namespace {

// The numbers of `key`'s array in the JSON's object for `entry`.
std::vector<double> json_rounds(const std::string& json, const std::string& entry, const std::string& key) {
  const size_t object = json.find("\"" + entry + "\": {");
  const size_t open = json.find("\"" + key + "\": [", object);
  if (object == std::string::npos || open == std::string::npos) return {};
  std::vector<double> out;
  size_t at = json.find('[', open) + 1;
  const size_t close = json.find(']', at);
  while (at < close) {
    size_t used = 0;
    out.push_back(std::stod(json.substr(at, close - at), &used));
    at += used;
    at = json.find_first_not_of(", ", at);
  }
  return out;
}

}  // namespace

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
  // Six rounds: the fewest that give the rounds' medians a 95% interval.
  const auto both = bench("baseline", "6", {"--compare-precision", "fp32,bf16", "--json", both_json});
  INFO(both.output);
  REQUIRE(both.status == 0);
  const std::string both_text = test::read_text(both_json);
  for (const char* k : {"\"baseline@fp32\"", "\"baseline@bf16\"", "\"precision\": \"fp32\"", "\"precision\": \"bf16\""})
    CHECK(both_text.find(k) != std::string::npos);
  CHECK_THAT(both.output, Catch::Matchers::Contains("libtorch bf16 ") && Catch::Matchers::Contains(" fp32 ") &&
                              Catch::Matchers::Contains("baseline: bf16 / fp32 train "));
  // Each round paired: shares of the GEMM rate and ratios with their
  // intervals, the rounds themselves in the JSON.
  CHECK_THAT(both.output,
             Catch::Matchers::Contains(
                 "per round, paired (6 rounds; medians [distribution-free intervals of 96.9% coverage]):\n"));
  CHECK_THAT(test::line_with(both.output, "  baseline@bf16 "),
             Catch::Matchers::Matches(" +baseline@bf16 +of GEMM [0-9.]+% \\[[0-9.]+, [0-9.]+\\]   train x [0-9.]+ "
                                      "\\[[0-9.]+, [0-9.]+\\]   infer x [0-9.]+ \\[[0-9.]+, [0-9.]+\\]"));
  CHECK_THAT(test::line_with(both.output, "baseline: bf16 / fp32 "),
             Catch::Matchers::Matches("baseline: bf16 / fp32 train [0-9.]+x \\[[0-9.]+, [0-9.]+\\], infer [0-9.]+x "
                                      "\\[[0-9.]+, [0-9.]+\\] \\(per round, paired\\)"));
  for (const char* entry : {"baseline@fp32", "baseline@bf16"})
    for (const char* k : {"train_round_s", "infer_round_s", "gemm_round_gflops"}) {
      CAPTURE(entry, k);
      CHECK(json_rounds(both_text, entry, k).size() == 6);  // six rounds
    }
  // The printed ratios pair the JSON's rounds: round i of bf16 against round
  // i of fp32, not another round nor another entry.
  const auto paired = [&](const char* key) {
    const auto ratio = bench::median_interval(bench::per_round_ratios(json_rounds(both_text, "baseline@fp32", key),
                                                                      json_rounds(both_text, "baseline@bf16", key)));
    char text[96];
    std::snprintf(text, sizeof text, "%.2fx [%.2f, %.2f]", ratio.median, ratio.low, ratio.high);
    return std::string(text);
  };
  CHECK(test::line_with(both.output, "baseline: bf16 / fp32 ") == "baseline: bf16 / fp32 train " +
                                                                      paired("train_round_s") + ", infer " +
                                                                      paired("infer_round_s") + " (per round, paired)");
  // Too few rounds for an interval: said once, the medians alone.
  const auto one = bench("baseline", "1", {"--compare-precision", "fp32,bf16"});
  REQUIRE(one.status == 0);
  CHECK_THAT(one.output, Catch::Matchers::Contains("per round, paired (1 round; medians; an interval needs 6 rounds or "
                                                   "more):\n") &&
                             Catch::Matchers::Contains("\nbaseline: bf16 / fp32 train "));
  CHECK_THAT(test::line_with(one.output, "baseline: bf16 / fp32 "),
             Catch::Matchers::Matches("baseline: bf16 / fp32 train [0-9.]+x, infer [0-9.]+x \\(per round, paired\\)"));
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

TEST_CASE("median_interval: the binomial's order statistics around the median", "[bench]") {
  using bench::median_interval;
  std::vector<double> twenty;
  for (int i = 20; i >= 1; --i) twenty.push_back(i);  // unsorted on purpose
  const auto m = median_interval(twenty);
  CHECK(m.count == 20);
  CHECK(m.median == 10.5);
  REQUIRE(m.bounded);
  // P(B(20, 1/2) <= 5) = 21700 / 2^20 <= 0.025 < P(B <= 6): ranks 6 and 15.
  CHECK(m.low == 6);
  CHECK(m.high == 15);
  CHECK(m.coverage == Approx(1 - 2 * 21700.0 / 1048576).epsilon(1e-12));
  // 99%: P(B <= 3) = 1351 / 2^20 <= 0.005 < P(B <= 4): ranks 4 and 17.
  const auto wide = median_interval(twenty, 0.99);
  CHECK(wide.low == 4);
  CHECK(wide.high == 17);
  // Six values: the extremes, 1 - 2 / 64; five: none qualifies.
  const auto six = median_interval({3, 1, 2, 6, 5, 4});
  REQUIRE(six.bounded);
  CHECK(six.low == 1);
  CHECK(six.high == 6);
  CHECK(six.median == 3.5);
  CHECK(six.coverage == Approx(1 - 2.0 / 64).epsilon(1e-12));
  const auto five = median_interval({5, 1, 4, 2, 3});
  CHECK_FALSE(five.bounded);
  CHECK(five.median == 3);
  CHECK(median_interval({}).count == 0);
  // Coverage holds for a skewed distribution (exponential, median ln 2):
  // 4000 seeded samples of 20 cover it as often as the ranks promise.
  std::mt19937 rng(7);
  std::exponential_distribution<double> exponential(1.0);
  int covered = 0;
  constexpr int kTrials = 4000;
  for (int t = 0; t < kTrials; ++t) {
    std::vector<double> sample(20);
    for (auto& x : sample) x = exponential(rng);
    const auto s = median_interval(sample);
    covered += s.low <= std::log(2.0) && std::log(2.0) <= s.high;
  }
  // 0.9586 expected; 4000 trials put the count within +- 0.013 at 4 sd.
  CHECK(static_cast<double>(covered) / kTrials == Approx(m.coverage).margin(0.013));
}

TEST_CASE("per_round_ratios: one ratio per round, rounds counted alike", "[bench]") {
  CHECK(bench::per_round_ratios({2, 3, 8}, {1, 2, 4}) == std::vector<double>{2, 1.5, 2});
  CHECK_THROWS_WITH(bench::per_round_ratios({1, 2}, {1}), "per_round_ratios: 2 rounds against 1");
}
