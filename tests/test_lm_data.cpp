#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <set>

#include "chiar/error.h"
#include "chiar/lm_data.h"
#include "chiar/metrics.h"

using namespace chiar;

namespace {

std::vector<int64_t> counting(int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(10 + i);  // distinct: target i is 10 + i
  return ids;
}

}  // namespace

TEST_CASE("evaluation scores every target exactly once, blocks and sliding", "[lm]") {
  for (int64_t N : {1, 7, 64, 100, 257}) {
    LmStream stream(counting(N), 2, 0);
    REQUIRE(stream.targets() == N);
    for (int64_t T : {1, 8, 64}) {
      for (int64_t stride : {int64_t{0}, T, std::max<int64_t>(1, T / 4)}) {
        for (int64_t B : {1, 3}) {
          INFO("N " << N << ", T " << T << ", stride " << stride << ", B " << B);
          std::vector<int> seen(static_cast<size_t>(N), 0);
          int64_t min_context = T;
          for (int64_t i = 0; i < stream.eval_batch_count(B, T, stride); ++i) {
            auto b = stream.eval_batch(i, B, T, stride);
            CHECK(b.tokens.size(1) == T);
            auto y = b.targets.contiguous();
            auto s = b.scored.contiguous();
            auto x = b.tokens.contiguous();
            for (int64_t r = 0; r < y.size(0); ++r)
              for (int64_t t = 0; t < T; ++t) {
                if (!s[r][t].item<bool>()) continue;
                const int64_t target = y[r][t].item<int64_t>() - 10;
                REQUIRE(target >= 0);
                ++seen[target];
                // The input at t is the token before the target.
                CHECK(x[r][t].item<int64_t>() == (target == 0 ? 2 : target + 9));
                if (target >= T) min_context = std::min(min_context, t + 1);
              }
          }
          CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
          if (stride > 0 && N > T) CHECK(min_context >= T - stride + 1);
        }
      }
    }
  }
}

TEST_CASE("training batches: deterministic in (seed, step), shifted targets, epochs are permutations", "[lm]") {
  LmStream stream(counting(1000), 2, 0);
  const int64_t T = 16, B = 4;
  auto a = stream.train_batch(7, 3, B, T, "blocks");
  auto again = stream.train_batch(7, 3, B, T, "blocks");
  CHECK(at::equal(a.tokens, again.tokens));
  CHECK_FALSE(at::equal(a.tokens, stream.train_batch(8, 3, B, T, "blocks").tokens));
  CHECK(at::equal(a.tokens.narrow(1, 1, T - 1), a.targets.narrow(1, 0, T - 1)));
  // Within one epoch no block repeats: (1000 - 15) / 16 = 61 blocks.
  std::set<int64_t> starts;
  for (int64_t step = 0; step * B < 60; ++step) {
    auto b = stream.train_batch(7, step, B, T, "blocks");
    for (int64_t r = 0; r < B && step * B + r < 61; ++r) starts.insert(b.tokens[r][0].item<int64_t>());
  }
  CHECK(starts.size() == 60);
  auto s0 = stream.train_batch(7, 0, B, T, "streams"), s1 = stream.train_batch(7, 1, B, T, "streams");
  CHECK(at::equal(s1.tokens.select(1, 0), s0.tokens.select(1, T - 1) + 1));  // streams continue
  CHECK_THROWS_WITH(stream.train_batch(7, 0, B, T, "random"), "unknown batching 'random' (known: blocks, streams)");
  LmStream tiny(counting(5), 2, 0);
  CHECK_THROWS_WITH(tiny.train_batch(0, 0, 1, 8, "blocks"),
                    "the training split has 5 tokens, fewer than one block of seq_len + 1 = 9");
}

TEST_CASE("language-model metrics come from sums", "[lm][metrics]") {
  // A 3-line corpus "a b" / "c" / "d e f": 6 words + 3 <eos> = 9 tokens; bytes 4 + 2 + 6 = 12.
  // A model that gives every token probability 1/4 has NLL 9 ln 4.
  const auto m = lm_metrics(9 * std::log(4.0), 9, 9, 12);
  CHECK(m.token_ppl == Approx(4.0));
  CHECK(m.word_ppl == Approx(4.0));
  CHECK(m.bits_per_byte == Approx(9 * 2.0 / 12));
  // The same NLL over a subword tokenisation with 18 tokens: token perplexity
  // changes, word-level perplexity and bits per byte do not.
  const auto sub = lm_metrics(9 * std::log(4.0), 18, 9, 12);
  CHECK(sub.token_ppl == Approx(2.0));
  CHECK(sub.word_ppl == Approx(4.0));
  CHECK(sub.bits_per_byte == Approx(m.bits_per_byte));
  const auto c = class_metrics(3.0, {2, 1}, {3, 3});
  CHECK(c.accuracy == Approx(0.5));
  CHECK(c.mean_loss == Approx(0.5));
}
