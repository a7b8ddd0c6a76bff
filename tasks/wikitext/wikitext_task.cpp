// Language modelling on a corpus in the WikiText layout: one file per split
// (wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens by default), one
// <eos> per line. The vocabulary comes from the train split.
//
// Options: path (folder; relative to the data root), files (pattern with
// {split}, default "wiki.{split}.tokens"; "wiki.{split}.raw" for the raw
// release), train_file / valid_file / test_file (override one split, e.g.
// train_file = "wiki.valid.tokens" where no training split exists),
// tokenizer (word | bytes | bpe | unigram) with min_count, max_vocab or
// vocab_size, seq_len (256), batching (blocks | streams), eval_stride (0 =
// non-overlapping windows), valid_fraction (0: when > 0 the last fraction of
// the training file's lines is the validation split instead of valid_file —
// for corpora whose training split is not available), eval_lines (0: when
// > 0 validation and test keep only their first eval_lines lines, so a short
// demonstration does not spend most of its time scoring whole splits).
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>

#include "chiar/error.h"
#include "chiar/lm_data.h"
#include "chiar/plugin.h"
#include "chiar/text_io.h"
#include "chiar/tokenizer.h"
#include "chiar/class_data.h"

namespace {

using namespace chiar;

const char* const kSplits[] = {"train", "valid", "test"};

struct Split {
  std::unique_ptr<LmStream> stream;
  SplitStats stats;
};

class WikiTextTask final : public Task {
 public:
  explicit WikiTextTask(const TaskSpec& spec)
      : seq_len_(spec.params.get_int("seq_len", 256)),
        batching_(spec.params.get_string("batching", "blocks")),
        eval_stride_(spec.params.get_int("eval_stride", 0)) {
    if (seq_len_ < 1) throw UserError("wikitext: seq_len must be positive");
    if (eval_stride_ < 0 || eval_stride_ > seq_len_) throw UserError("wikitext: eval_stride must lie in 0..seq_len");
    if (batching_ != "blocks" && batching_ != "streams")
      throw UserError("wikitext: unknown batching '" + batching_ + "' (known: blocks, streams)");
    root_ = resolve_path(spec.data_root, spec.params.get_string("path", "wikitext-2"));
    const std::string pattern = spec.params.get_string("files", "wiki.{split}.tokens");
    const double valid_fraction = spec.params.get_double("valid_fraction", 0.0);
    if (!(valid_fraction >= 0 && valid_fraction < 1)) throw UserError("wikitext: valid_fraction must lie in [0, 1)");
    const int64_t eval_lines = spec.params.get_int("eval_lines", 0);
    if (eval_lines < 0) throw UserError("wikitext: eval_lines must be 0 (all) or positive");
    std::map<std::string, std::vector<std::string>> lines;
    for (const char* split : kSplits) {
      if (valid_fraction > 0 && std::string(split) == "valid") continue;
      std::string file = pattern;
      const auto at = file.find("{split}");
      if (at != std::string::npos) file.replace(at, 7, split);
      file = spec.params.get_string(std::string(split) + "_file", file);
      files_[split] = root_ + "/" + file;
      lines[split] = read_lines(files_[split]);
    }
    if (valid_fraction > 0) {
      auto& train = lines["train"];
      const auto n_valid = static_cast<size_t>(valid_fraction * static_cast<double>(train.size()) + 0.5);
      lines["valid"].assign(train.end() - static_cast<std::ptrdiff_t>(n_valid), train.end());
      train.resize(train.size() - n_valid);
      files_["valid"] = files_["train"] + " (last " + std::to_string(n_valid) + " lines)";
      files_["train"] += " (first " + std::to_string(train.size()) + " lines)";
    }
    for (const char* split : {"valid", "test"}) {
      auto& kept = lines[split];
      if (eval_lines == 0 || static_cast<size_t>(eval_lines) >= kept.size()) continue;
      kept.resize(static_cast<size_t>(eval_lines));
      files_[split] += " (first " + std::to_string(eval_lines) + " lines)";
    }
    for (const char* split : kSplits) {
      int64_t words = 0;
      for (const auto& l : lines[split]) words += count_words(l);
      if (words == 0) throw UserError(files_[split] + ": empty split (no words)");
    }
    tokenizer_ = make_tokenizer(spec.params, lines["train"], spec.cache_dir, "word");
    for (const char* split : kSplits) {
      SplitStats s;
      s.split = split;
      std::vector<int64_t> ids, per_line;
      for (const auto& line : lines[split]) {
        auto encoded = tokenizer_->encode(line);
        for (int64_t id : encoded) s.unknown += id == tokenizer_->unk_id();
        ids.insert(ids.end(), encoded.begin(), encoded.end());
        ids.push_back(tokenizer_->eos_id());
        per_line.push_back(static_cast<int64_t>(encoded.size()) + 1);
        s.words += count_words(line) + 1;
        s.bytes += static_cast<int64_t>(line.size()) + 1;
      }
      s.examples = static_cast<int64_t>(lines[split].size());
      s.types = static_cast<int64_t>(std::set<int64_t>(ids.begin(), ids.end()).size());
      s.tokens = static_cast<int64_t>(ids.size());
      s.lengths = length_percentiles(per_line);
      splits_[split] = {std::make_unique<LmStream>(ids, tokenizer_->eos_id(), tokenizer_->pad_id()), s};
    }
  }

  TaskHead head() const override { return TaskHead::LanguageModel; }
  int64_t vocab_size() const override { return tokenizer_->vocab_size(); }
  int64_t n_classes() const override { return 0; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t pad_id() const override { return tokenizer_->pad_id(); }
  std::vector<std::string> splits() const override { return {"train", "valid", "test"}; }
  SplitStats stats(const std::string& split) const override { return find(split).stats; }

  Batch train_batch(uint64_t seed, int64_t step, int64_t batch_size) const override {
    return find("train").stream->train_batch(seed, step, batch_size, seq_len_, batching_);
  }
  int64_t eval_batch_count(const std::string& split, int64_t batch_size) const override {
    return find(split).stream->eval_batch_count(batch_size, seq_len_, eval_stride_);
  }
  Batch eval_batch(const std::string& split, int64_t index, int64_t batch_size) const override {
    return find(split).stream->eval_batch(index, batch_size, seq_len_, eval_stride_);
  }

  std::vector<int64_t> encode(const std::string& text) const override { return tokenizer_->encode(text); }
  std::string token_text(int64_t id) const override { return tokenizer_->token_text(id); }

  std::string describe() const override {
    return "wikitext(train " + files_.at("train") + ", valid " + files_.at("valid") + ", test " + files_.at("test") +
           ", " + tokenizer_->describe() + ", seq_len " + std::to_string(seq_len_) + ", train " + batching_ +
           ", eval " + (eval_stride_ > 0 ? "sliding stride " + std::to_string(eval_stride_) : std::string("blocks")) +
           ")";
  }

 private:
  const Split& find(const std::string& split) const {
    auto it = splits_.find(split);
    if (it == splits_.end()) throw UserError("wikitext: unknown split '" + split + "' (known: train, valid, test)");
    return it->second;
  }

  int64_t seq_len_;
  std::string batching_;
  int64_t eval_stride_;
  std::string root_;
  std::map<std::string, std::string> files_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<std::string, Split> splits_;
};

// Every option the constructor reads, so the harness refuses a misspelt or
// mistyped one before the corpus is read.
std::vector<PluginOption> wikitext_options() {
  std::vector<PluginOption> options = {
      {"path", ParamKind::String, "wikitext-2", "the corpus folder, relative to the data root"},
      {"files", ParamKind::String, "wiki.{split}.tokens",
       "the split files' pattern (wiki.{split}.raw: the raw release)"},
      {"train_file", ParamKind::String, "", "the training split's file, instead of the pattern's"},
      {"valid_file", ParamKind::String, "", "the validation split's file, instead of the pattern's"},
      {"test_file", ParamKind::String, "", "the test split's file, instead of the pattern's"},
      {"seq_len", ParamKind::Int, "256", "tokens per training sequence"},
      {"batching", ParamKind::String, "blocks", "blocks (shuffled windows) or streams (contiguous per batch row)"},
      {"eval_stride", ParamKind::Int, "0", "validation and test window stride (0: windows that do not overlap)"},
      {"valid_fraction", ParamKind::Number, "0",
       "when above 0, the training file's last fraction of lines is the validation split"},
      {"eval_lines", ParamKind::Int, "0", "when above 0, validation and test keep only their first lines"}};
  for (auto& o : tokenizer_plugin_options("word")) options.push_back(std::move(o));
  return options;
}

void register_plugin(Registrar& r) {
  r.add_task("wikitext", "language modelling on a WikiText-layout corpus (train/valid/test files)",
             [](const TaskSpec& spec) { return std::make_unique<WikiTextTask>(spec); });
  r.declare_options("task", "wikitext", wikitext_options());
}

}  // namespace

CHIAR_PLUGIN("task", register_plugin)
