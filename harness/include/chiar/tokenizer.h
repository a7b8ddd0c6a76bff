#pragma once
// Tokenisers shared by task plugins: word-level (the WikiText recipe),
// byte-level (Long Range Arena's "Text"), and subword through sentencepiece.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chiar/export.h"
#include "chiar/params.h"
#include "chiar/random.h"

namespace chiar {

class CHIAR_API Tokenizer {
 public:
  virtual ~Tokenizer();
  // Ids of one line of text, without the end-of-line token.
  virtual std::vector<int64_t> encode(const std::string& line) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual std::string token_text(int64_t id) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t pad_id() const = 0;
  virtual int64_t unk_id() const = 0;
  virtual int64_t eos_id() const = 0;
  virtual std::string describe() const = 0;
};

// Whitespace-separated words; the vocabulary is every word of the training
// lines seen at least min_count times (most frequent first, at most max_vocab
// words when max_vocab > 0), then <unk> for the rest. A literal "<unk>" in the
// text (as in WikiText) is the unknown token. Ids: <pad> 0, <unk> 1, <eos> 2.
class CHIAR_API WordTokenizer final : public Tokenizer {
 public:
  WordTokenizer(const std::vector<std::string>& train_lines, int64_t min_count = 1, int64_t max_vocab = 0);
  std::vector<int64_t> encode(const std::string& line) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(words_.size()); }
  int64_t pad_id() const override { return 0; }
  int64_t unk_id() const override { return 1; }
  int64_t eos_id() const override { return 2; }
  std::string describe() const override;

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, int64_t> ids_;
  int64_t min_count_, max_vocab_;
};

// UTF-8 bytes as ids 0..255, then <pad> 256, <eos> 257, <unk> 258 (never produced).
class CHIAR_API ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int64_t> encode(const std::string& line) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;
  int64_t vocab_size() const override { return 259; }
  int64_t pad_id() const override { return 256; }
  int64_t unk_id() const override { return 258; }
  int64_t eos_id() const override { return 257; }
  std::string describe() const override { return "bytes"; }
};

// Subwords (BPE or unigram) trained by sentencepiece on the training lines.
// The model is cached as <cache_dir>/spm-<hash>.model, the hash covering the
// training text and every option, so reruns load instead of retraining.
// Ids: <pad> 0, <unk> 1, <eos> 2, then the pieces.
class CHIAR_API SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::vector<std::string>& train_lines, const std::string& model_type, int64_t vocab_size,
                         const std::string& cache_dir);
  ~SentencePieceTokenizer() override;
  std::vector<int64_t> encode(const std::string& line) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;
  int64_t vocab_size() const override;
  int64_t pad_id() const override { return 0; }
  int64_t unk_id() const override { return 1; }
  int64_t eos_id() const override { return 2; }
  std::string describe() const override;
  const std::string& model_path() const { return model_path_; }
  bool loaded_from_cache() const { return from_cache_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string model_type_, model_path_;
  bool from_cache_ = false;
};

// From task options: tokenizer = "word" | "bytes" | "bpe" | "unigram", with
// min_count / max_vocab (word) or vocab_size (subword).
CHIAR_API std::unique_ptr<Tokenizer> make_tokenizer(const Params& params, const std::vector<std::string>& train_lines,
                                                    const std::string& cache_dir, const std::string& fallback = "word");

}  // namespace chiar
