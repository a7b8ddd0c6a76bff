// Does the classification path learn? A task a bag of words cannot solve:
// each text holds the markers "alpha" and "omega" among filler words, and the
// label says which comes first. The corpus is written in the aclImdb layout
// and read by the imdb task through its sentencepiece BPE tokenizer, so the
// test also covers that path end to end (reader, tokenizer training, padded
// batches, masked pooling, the trainer, the test split's scoring).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "chiar/random.h"
#include "engine/store/sqlite.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::TempDir;

namespace {

const std::vector<std::string> kFiller = {"the",  "a",   "film",  "was",   "very", "not",   "plot",  "actor",
                                          "good", "bad", "scene", "story", "long", "short", "music", "end"};

// One text: 12-40 filler words with the two markers at two distinct places
// drawn uniformly; label 1 ("pos") when alpha comes before omega. The filler
// is drawn the same way for both labels: only the markers' order tells them apart.
std::pair<std::string, int> order_text(SplitMix64& rng) {
  const auto words = 12 + rng.below(29);
  const auto first = rng.below(words + 2);
  auto second = rng.below(words + 1);
  second += second >= first;  // distinct from first
  const int label = static_cast<int>(rng.below(2));
  const bool alpha_at_first = (label == 1) == (first < second);
  std::string out;
  for (uint64_t i = 0; i < words + 2; ++i) {
    const std::string word = i == first    ? (alpha_at_first ? "alpha" : "omega")
                             : i == second ? (alpha_at_first ? "omega" : "alpha")
                                           : kFiller[rng.below(kFiller.size())];
    out += (out.empty() ? "" : " ") + word;
  }
  return {out, label};
}

void write_order_corpus(const TempDir& d, int64_t n_train, int64_t n_test) {
  SplitMix64 rng(2024, 0x0DE5);
  int64_t id = 0;
  for (const auto& [split, count] : {std::pair<const char*, int64_t>{"train", n_train}, {"test", n_test}}) {
    int64_t per_label[2] = {0, 0};
    while (per_label[0] < count / 2 || per_label[1] < count / 2) {
      auto [text, label] = order_text(rng);
      if (per_label[label] >= count / 2) continue;
      ++per_label[label];
      d.write(std::string("order/aclImdb/") + split + (label ? "/pos/" : "/neg/") + std::to_string(id++) +
                  (label ? "_8.txt" : "_2.txt"),
              text);
    }
  }
}

double test_accuracy(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(
      "SELECT m.value FROM metrics m JOIN runs r ON r.id = m.run_id WHERE r.status = 'done' "
      "AND m.split = 'test' AND m.checkpoint = 'last' AND m.name = 'accuracy'");
  return q.step() ? q.real(0) : -1.0;
}

// The matrix of the learning test: two attention layers, 32 wide, 600 steps
// of 32 texts; `model_extra` goes into [model]. max_len 96 holds every text
// whole: a text cut short could give its order away by which marker survived.
std::string order_matrix(const std::string& model_extra) {
  return R"([matrix]
name = "order"
variants = ["attn"]
tasks = ["order"]
seeds = [0]

[model]
d_model = 32
n_heads = 2
)" + model_extra +
         R"(
[variants.attn]
layers = ["attn", "attn"]

[train]
steps = 600
batch_size = 32
lr = 3e-3
warmup = 30
eval_every = 600
eval_batches = 2
eval_batch_size = 64
checkpoint_every = 600
calibration_batches = 1
threads = 1
log_every = 50

[tasks.order]
plugin = "imdb"
path = "order"
tokenizer = "bpe"
vocab_size = 64
max_len = 96
valid_fraction = 0.05
)";
}

double trained_accuracy(const TempDir& d, const std::string& model_extra) {
  d.write("m.toml", order_matrix(model_extra));
  const std::string db = d.path() + "/r-" + std::to_string(model_extra.size()) + ".db";
  const auto run = test::run_chiar({"--gemm", "blas", "run", d.path() + "/m.toml", "--db", db, "--data-root", d.path(),
                                    "--cache-dir", d.path() + "/cache"});
  INFO(run.output);
  REQUIRE(run.status == 0);
  return test_accuracy(db);
}

}  // namespace

TEST_CASE("imdb with BPE learns a label that only the order of two words decides", "[learning][imdb][spm]") {
  TempDir d("order");
  write_order_corpus(d, 4000, 1000);
  // 4,000 texts, 1,000 held out; a bag of words scores 50%.
  CHECK(trained_accuracy(d, "") > 0.95);
  // Without RoPE the model sees no order at all: the same budget must stay
  // near chance, or the task could be solved without position.
  CHECK(trained_accuracy(d, "operators = { attn = { rope = false } }\n") < 0.6);
}
