#include <catch2/catch.hpp>

#include "chiar/error.h"
#include "chiar/tokenizer.h"
#include "support/temp_dir.h"

using namespace chiar;

TEST_CASE("word tokenizer: vocabulary from train, <unk>, counts, ids by frequency", "[tokenizer]") {
  WordTokenizer t({"the cat sat", "the dog <unk> sat", "the end"}, 1, 0);
  CHECK(t.vocab_size() == 3 + 5);   // specials + the sat cat dog end
  CHECK(t.token_text(3) == "the");  // most frequent first
  CHECK(t.token_text(4) == "sat");
  CHECK(t.encode("the bird sat") == std::vector<int64_t>{3, t.unk_id(), 4});
  CHECK(t.encode("<unk> cat")[0] == t.unk_id());  // a literal <unk> is the unknown token
  CHECK(t.decode(t.encode("the cat sat")) == "the cat sat");
  CHECK(t.encode("  ").empty());
  WordTokenizer frequent({"a a a b b c"}, 2, 0);
  CHECK(frequent.vocab_size() == 5);
  CHECK(frequent.encode("c")[0] == frequent.unk_id());
  WordTokenizer capped({"a a a b b c"}, 1, 1);
  CHECK(capped.vocab_size() == 4);
  CHECK(capped.describe() == "word(vocab 4, max_vocab 1)");
}

TEST_CASE("byte tokenizer round-trips UTF-8", "[tokenizer]") {
  ByteTokenizer t;
  const std::string text = "na\xC3\xAFve caf\xC3\xA9 \xE2\x82\xAC";
  const auto ids = t.encode(text);
  CHECK(ids.size() == text.size());
  CHECK(ids[2] == 0xC3);
  CHECK(t.decode(ids) == text);
  CHECK(t.vocab_size() == 259);
  CHECK(t.token_text(t.eos_id()) == "<eos>");
}

TEST_CASE("sentencepiece tokenizers train, round-trip and come back from the cache", "[tokenizer][spm]") {
  test::TempDir dir("spm");
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i)
    lines.push_back("the spectral entropy of token " + std::to_string(i) + " decides its route through the layer");
  for (const char* type : {"bpe", "unigram"}) {
    INFO(type);
    SentencePieceTokenizer first(lines, type, 60, dir.path());
    CHECK_FALSE(first.loaded_from_cache());
    CHECK(first.vocab_size() >= 50);
    CHECK(first.token_text(first.eos_id()) == "<eos>");
    const std::string text = "the route of token 17 through the layer";
    CHECK(first.decode(first.encode(text)) == text);
    SentencePieceTokenizer again(lines, type, 60, dir.path());
    CHECK(again.loaded_from_cache());
    CHECK(again.model_path() == first.model_path());
    CHECK(again.encode(text) == first.encode(text));
  }
  SentencePieceTokenizer other(lines, "bpe", 70, dir.path());
  CHECK_FALSE(other.loaded_from_cache());  // another option, another model
  CHECK_THROWS_WITH(SentencePieceTokenizer(lines, "wordpiece", 60, dir.path()),
                    "sentencepiece: model type must be bpe or unigram, found 'wordpiece'");
  CHECK_THROWS_WITH(make_tokenizer(Params().set("tokenizer", std::string("chars")), lines, dir.path()),
                    "unknown tokenizer 'chars' (known: word, bytes, bpe, unigram)");
  // A negative limit was read as no limit; a count below 1 keeps every word, as 1 does.
  CHECK_THROWS_WITH(make_tokenizer(Params().set("max_vocab", int64_t{-1}), lines, dir.path(), "word"),
                    "max_vocab must be 0 (no limit) or positive, found -1");
  CHECK_THROWS_WITH(make_tokenizer(Params().set("min_count", int64_t{0}), lines, dir.path(), "word"),
                    "min_count must be at least 1, found 0");
}
