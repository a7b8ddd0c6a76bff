#include "chiar/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "spm/spm_bridge.h"

namespace chiar {

Tokenizer::~Tokenizer() = default;

// ---- word ------------------------------------------------------------------

WordTokenizer::WordTokenizer(const std::vector<std::string>& train_lines, int64_t min_count, int64_t max_vocab)
    : min_count_(min_count), max_vocab_(max_vocab) {
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& line : train_lines) {
    std::istringstream in(line);
    std::string w;
    while (in >> w) ++counts[w];
  }
  std::vector<std::pair<std::string, int64_t>> kept;
  for (auto& kv : counts)
    if (kv.second >= min_count && kv.first != "<unk>" && kv.first != "<eos>" && kv.first != "<pad>") kept.push_back(kv);
  // Most frequent first; ties by the word itself, so ids never depend on hashing.
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (max_vocab > 0 && static_cast<int64_t>(kept.size()) > max_vocab) kept.resize(max_vocab);
  words_ = {"<pad>", "<unk>", "<eos>"};
  for (auto& kv : kept) words_.push_back(kv.first);
  for (size_t i = 0; i < words_.size(); ++i) ids_[words_[i]] = static_cast<int64_t>(i);
}

std::vector<int64_t> WordTokenizer::encode(const std::string& line) const {
  std::vector<int64_t> out;
  std::istringstream in(line);
  std::string w;
  while (in >> w) {
    auto it = ids_.find(w);
    out.push_back(it == ids_.end() || it->second < 2 ? unk_id() : it->second);
  }
  return out;
}

std::string WordTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (!out.empty()) out += ' ';
    out += token_text(id);
  }
  return out;
}

std::string WordTokenizer::token_text(int64_t id) const { return id >= 0 && id < vocab_size() ? words_[id] : "<unk>"; }

std::string WordTokenizer::describe() const {
  std::string s = "word(vocab " + std::to_string(vocab_size());
  if (min_count_ > 1) s += ", min_count " + std::to_string(min_count_);
  if (max_vocab_ > 0) s += ", max_vocab " + std::to_string(max_vocab_);
  return s + ")";
}

// ---- bytes -----------------------------------------------------------------

std::vector<int64_t> ByteTokenizer::encode(const std::string& line) const {
  std::vector<int64_t> out(line.size());
  for (size_t i = 0; i < line.size(); ++i) out[i] = static_cast<unsigned char>(line[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids)
    if (id >= 0 && id < 256) out += static_cast<char>(id);
  return out;
}

std::string ByteTokenizer::token_text(int64_t id) const {
  if (id == pad_id()) return "<pad>";
  if (id == eos_id()) return "<eos>";
  if (id < 0 || id > 255) return "<unk>";
  return std::string(1, static_cast<char>(id));
}

// ---- sentencepiece -----------------------------------------------------------

namespace {

// The bridge's functions, resolved once from libchiar_spm.so beside the core.
struct SpmBridge {
  decltype(&chiar_spm_train) train;
  decltype(&chiar_spm_load) load;
  decltype(&chiar_spm_free) free;
  decltype(&chiar_spm_size) size;
  decltype(&chiar_spm_encode) encode;
  decltype(&chiar_spm_piece) piece;
  decltype(&chiar_spm_decode) decode;
};

const SpmBridge& spm() {
  static const SpmBridge bridge = [] {
    const auto path = (boost::dll::this_line_location().parent_path() / "libchiar_spm.so").string();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) throw UserError("cannot load the sentencepiece bridge '" + path + "': " + dlerror());
    auto get = [&](const char* name) {
      void* f = dlsym(h, name);
      if (!f) throw UserError("'" + path + "' lacks " + name);
      return f;
    };
    SpmBridge b;
    b.train = reinterpret_cast<decltype(b.train)>(get("chiar_spm_train"));
    b.load = reinterpret_cast<decltype(b.load)>(get("chiar_spm_load"));
    b.free = reinterpret_cast<decltype(b.free)>(get("chiar_spm_free"));
    b.size = reinterpret_cast<decltype(b.size)>(get("chiar_spm_size"));
    b.encode = reinterpret_cast<decltype(b.encode)>(get("chiar_spm_encode"));
    b.piece = reinterpret_cast<decltype(b.piece)>(get("chiar_spm_piece"));
    b.decode = reinterpret_cast<decltype(b.decode)>(get("chiar_spm_decode"));
    return b;  // the library stays loaded for the life of the process
  }();
  return bridge;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  void* processor = nullptr;
  ~Impl() {
    if (processor) spm().free(processor);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::vector<std::string>& train_lines,
                                               const std::string& model_type, int64_t vocab_size,
                                               const std::string& cache_dir)
    : impl_(std::make_unique<Impl>()), model_type_(model_type) {
  if (model_type != "bpe" && model_type != "unigram")
    throw UserError("sentencepiece: model type must be bpe or unigram, found '" + model_type + "'");
  if (vocab_size < 8) throw UserError("sentencepiece: vocab_size must be at least 8");
  const std::string options = " --model_type=" + model_type + " --vocab_size=" + std::to_string(vocab_size) +
                              " --pad_id=0 --unk_id=1 --eos_id=2 --bos_id=-1"
                              " --pad_piece=<pad> --unk_piece=<unk> --eos_piece=<eos>"
                              " --character_coverage=1.0 --num_threads=1"
                              " --hard_vocab_limit=false --minloglevel=2";
  uint64_t h = fnv1a(options);
  for (const auto& line : train_lines) h = fnv1a(line + "\n", h);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  const std::string prefix = cache_dir + "/spm-" + hex;
  model_path_ = prefix + ".model";

  boost::system::error_code ec;
  boost::filesystem::create_directories(cache_dir, ec);
  if (ec) throw UserError("sentencepiece: cannot create cache folder '" + cache_dir + "': " + ec.message());
  from_cache_ = boost::filesystem::exists(model_path_);
  char err[512] = {0};
  if (!from_cache_) {
    // Names of this process's own: several processes sharing the cache (the
    // ranks of a run, a Slurm array's tasks) may train the same model at
    // once. Training is deterministic, so whichever rename lands last puts
    // the same bytes in place.
    const std::string mine = prefix + ".partial-" + std::to_string(::getpid());
    const std::string text_path = mine + ".train.txt";
    {
      std::ofstream text(text_path, std::ios::binary);
      for (const auto& line : train_lines)
        if (!line.empty()) text << line << "\n";
      if (!text) throw UserError("sentencepiece: cannot write '" + text_path + "'");
    }
    // Train under a temporary name, then rename: a crash never leaves a half model.
    const std::string args = "--input=" + text_path + " --model_prefix=" + mine + options;
    const int failed = spm().train(args.c_str(), err, sizeof err);
    std::remove(text_path.c_str());
    boost::filesystem::remove(mine + ".vocab", ec);
    if (failed) throw UserError(std::string("sentencepiece training failed: ") + err);
    boost::filesystem::rename(mine + ".model", model_path_, ec);
    if (ec) throw EnvironmentError(model_path_ + ": cannot put the trained tokeniser in place: " + ec.message());
  }
  impl_->processor = spm().load(model_path_.c_str(), err, sizeof err);
  if (!impl_->processor) throw UserError(model_path_ + ": cannot load the sentencepiece model: " + err);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::encode(const std::string& line) const {
  std::vector<int> ids(line.size() + 8);
  int n = spm().encode(impl_->processor, line.data(), line.size(), ids.data(), static_cast<int>(ids.size()));
  if (n > static_cast<int>(ids.size())) {
    ids.resize(static_cast<size_t>(n));
    n = spm().encode(impl_->processor, line.data(), line.size(), ids.data(), n);
  }
  return std::vector<int64_t>(ids.begin(), ids.begin() + n);
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow(ids.begin(), ids.end());
  std::string out(ids.size() * 8 + 16, '\0');
  int n = spm().decode(impl_->processor, narrow.data(), static_cast<int>(narrow.size()), out.data(),
                       static_cast<int>(out.size()));
  if (n > static_cast<int>(out.size())) {
    out.resize(static_cast<size_t>(n));
    n = spm().decode(impl_->processor, narrow.data(), static_cast<int>(narrow.size()), out.data(), n);
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string SentencePieceTokenizer::token_text(int64_t id) const {
  if (id < 0 || id >= vocab_size()) return "<unk>";
  std::string out(64, '\0');
  int n = spm().piece(impl_->processor, static_cast<int>(id), out.data(), static_cast<int>(out.size()));
  if (n > static_cast<int>(out.size())) {
    out.resize(static_cast<size_t>(n));
    n = spm().piece(impl_->processor, static_cast<int>(id), out.data(), n);
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return spm().size(impl_->processor); }

std::string SentencePieceTokenizer::describe() const {
  return model_type_ + "(vocab " + std::to_string(vocab_size()) + ", sentencepiece)";
}

// ---- factory -----------------------------------------------------------------

std::unique_ptr<Tokenizer> make_tokenizer(const Params& params, const std::vector<std::string>& train_lines,
                                          const std::string& cache_dir, const std::string& fallback) {
  const std::string kind = params.get_string("tokenizer", fallback);
  if (kind == "word") {
    const int64_t min_count = params.get_int("min_count", 1), max_vocab = params.get_int("max_vocab", 0);
    if (min_count < 1) throw UserError("min_count must be at least 1, found " + std::to_string(min_count));
    if (max_vocab < 0)
      throw UserError("max_vocab must be 0 (no limit) or positive, found " + std::to_string(max_vocab));
    return std::make_unique<WordTokenizer>(train_lines, min_count, max_vocab);
  }
  if (kind == "bytes") return std::make_unique<ByteTokenizer>();
  if (kind == "bpe" || kind == "unigram")
    return std::make_unique<SentencePieceTokenizer>(train_lines, kind, params.get_int("vocab_size", 8192), cache_dir);
  throw UserError("unknown tokenizer '" + kind + "' (known: word, bytes, bpe, unigram)");
}

}  // namespace chiar
