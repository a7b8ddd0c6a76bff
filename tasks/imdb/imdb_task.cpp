// IMDB sentiment classification from the aclImdb folder layout
// ({train,test}/{neg,pos}/<id>_<rating>.txt). Labels come from the folder
// (neg 0, pos 1) and must agree with the rating in the file name; "<br />"
// becomes a space. A validation split is carved from train by split_seed;
// test stays test. Validation and test come in an order drawn from
// split_seed, so an evaluation of their first batches sees both labels.
//
// Options: path (a folder holding aclImdb/, or aclImdb itself), archive (a
// .tar.gz of that layout, extracted once into the cache folder), tokenizer
// (bytes as in Long Range Arena's "Text" task, or word | bpe | unigram),
// max_len (4000; 1000 is LRA's other usual setting), valid_fraction (0.1),
// split_seed (0), test_size (0 = all 25,000 test reviews; otherwise an even
// count, half of each class, drawn by split_seed: scoring 25,000 reviews of
// 1,000+ bytes three times per run costs more than a CPU-scale run's training).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <boost/filesystem.hpp>

#include "chiar/class_data.h"
#include "chiar/error.h"
#include "chiar/plugin.h"
#include "chiar/random.h"
#include "chiar/text_io.h"
#include "chiar/tokenizer.h"

namespace {

using namespace chiar;
namespace fs = boost::filesystem;

struct Review {
  std::string text;
  int64_t label;
};

std::string clean(std::string text) {
  for (size_t at; (at = text.find("<br />")) != std::string::npos;) text.replace(at, 6, 1, ' ');
  return text;
}

// The rating of an "<id>_<rating>" file stem, or -1 for any other stem: only
// one or two decimal digits after the first '_' (atoi would read "3.tx_1" as
// 3 and wrap "4294967297" to 1).
int rating_of(const std::string& stem) {
  const auto bar = stem.find('_');
  if (bar == std::string::npos) return -1;
  const std::string digits = stem.substr(bar + 1);
  if (digits.empty() || digits.size() > 2 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

std::vector<Review> read_reviews(const fs::path& folder) {
  std::vector<Review> out;
  for (const auto& [sub, label] : {std::pair<const char*, int64_t>{"neg", 0}, {"pos", 1}}) {
    const fs::path dir = folder / sub;
    boost::system::error_code ec;
    if (!fs::is_directory(dir, ec)) throw UserError("imdb: missing folder '" + dir.string() + "'");
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(dir))
      if (f.path().extension() == ".txt") files.push_back(f.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      // <id>_<rating>.txt; the rating must agree with the folder (neg <= 4, pos >= 7).
      const std::string stem = f.stem().string();
      const int rating = rating_of(stem);
      if (rating < 1 || rating > 10 || (label == 0 && rating > 4) || (label == 1 && rating < 7))
        throw UserError("imdb: '" + f.string() + "': expected <id>_<rating>.txt with a rating of " +
                        (label == 0 ? "1-4" : "7-10"));
      std::ifstream in(f.string(), std::ios::binary);
      if (!in) throw UserError(f.string() + ": cannot open the file");
      std::stringstream text;
      text << in.rdbuf();
      out.push_back({clean(text.str()), label});
    }
  }
  if (out.empty()) throw UserError("imdb: '" + folder.string() + "' holds no reviews");
  return out;
}

// The reviews in an order drawn from `seed` (the files come sorted by label,
// and an evaluation that scores only the first batches must see both), all
// of them, or `size` of them, half of each label, when size is not 0.
std::vector<Review> shuffled_test_split(std::vector<Review> reviews, int64_t size, uint64_t seed) {
  int64_t per_label[2] = {0, 0};
  for (const auto& r : reviews) ++per_label[r.label];
  const int64_t most = 2 * std::min(per_label[0], per_label[1]);
  if (size < 0 || size % 2 != 0 || size > most)
    throw UserError("imdb: test_size must be 0 (all) or an even count of at most " + std::to_string(most) +
                    " (half of each class), found " + std::to_string(size));
  const int64_t quota = size == 0 ? std::max(per_label[0], per_label[1]) : size / 2;
  std::vector<Review> out;
  int64_t taken[2] = {0, 0};
  for (int64_t i : SplitMix64(seed, 0x7E57).permutation(static_cast<int64_t>(reviews.size())))
    if (taken[reviews[i].label]++ < quota) out.push_back(std::move(reviews[i]));
  return out;
}

// The folder that holds train/ and test/.
fs::path find_root(const TaskSpec& spec) {
  const std::string archive = spec.params.get_string("archive", "");
  fs::path base;
  if (!archive.empty()) {
    const std::string path = resolve_path(spec.data_root, archive);
    boost::system::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw UserError("imdb: archive '" + path + "' does not exist");
    base = fs::path(spec.cache_dir) / ("imdb-" + std::to_string(fnv1a(fs::canonical(path).string())));
    if (!fs::exists(base / ".extracted")) {
      fs::create_directories(base);
      const std::string command = "tar -xzf '" + path + "' -C '" + base.string() + "'";
      if (std::system(command.c_str()) != 0) throw UserError("imdb: cannot extract '" + path + "'");
      std::ofstream((base / ".extracted").string()) << path << "\n";
    }
  } else {
    base = resolve_path(spec.data_root, spec.params.get_string("path", "imdb"));
  }
  return fs::is_directory(base / "aclImdb") ? base / "aclImdb" : base;
}

class ImdbTask final : public ClassificationTask {
 public:
  explicit ImdbTask(const TaskSpec& spec) : ClassificationTask("imdb"), max_len_(spec.params.get_int("max_len", 4000)) {
    const double valid_fraction = spec.params.get_double("valid_fraction", 0.1);
    const auto split_seed = static_cast<uint64_t>(spec.params.get_int("split_seed", 0));
    if (max_len_ < 1) throw UserError("imdb: max_len must be positive");
    if (!(valid_fraction >= 0 && valid_fraction < 1)) throw UserError("imdb: valid_fraction must lie in [0, 1)");
    root_ = find_root(spec);
    auto train = read_reviews(root_ / "train");
    auto test = shuffled_test_split(read_reviews(root_ / "test"), spec.params.get_int("test_size", 0), split_seed);

    const auto order = SplitMix64(split_seed, 0x1DB).permutation(static_cast<int64_t>(train.size()));
    const auto n_valid = static_cast<int64_t>(valid_fraction * static_cast<double>(train.size()) + 0.5);
    std::vector<bool> is_valid(train.size(), false);
    for (int64_t i = 0; i < n_valid; ++i) is_valid[order[i]] = true;

    std::vector<std::string> train_text;
    for (size_t i = 0; i < train.size(); ++i)
      if (!is_valid[i]) train_text.push_back(train[i].text);
    tokenizer_ = make_tokenizer(spec.params, train_text, spec.cache_dir, "bytes");
    train_text.clear();

    for (const char* name : {"train", "valid", "test"}) add_split(ClassSplit(name, 2, tokenizer_->pad_id(), max_len_));
    for (size_t i = 0; i < train.size(); ++i)
      if (!is_valid[i]) add("train", train[i]);
    for (int64_t i = 0; i < n_valid; ++i) add("valid", train[order[i]]);  // drawn order: both labels in any prefix
    for (const auto& r : test) add("test", r);
  }

  int64_t vocab_size() const override { return tokenizer_->vocab_size(); }
  int64_t n_classes() const override { return 2; }
  int64_t seq_len() const override { return max_len_; }
  int64_t pad_id() const override { return tokenizer_->pad_id(); }
  std::vector<int64_t> encode(const std::string& text) const override { return tokenizer_->encode(text); }
  std::string token_text(int64_t id) const override { return tokenizer_->token_text(id); }
  std::string describe() const override {
    return "imdb(" + root_.string() + ", " + tokenizer_->describe() + ", max_len " + std::to_string(max_len_) + ")";
  }

 private:
  void add(const std::string& split, const Review& r) {
    const auto ids = tokenizer_->encode(r.text);
    int64_t unknown = 0;
    for (int64_t id : ids) unknown += id == tokenizer_->unk_id();
    std::vector<int32_t> narrow(ids.begin(), ids.begin() + std::min<int64_t>(max_len_, ids.size()));
    split_of(split).add(std::move(narrow), r.label, static_cast<int64_t>(ids.size()),
                        static_cast<int64_t>(r.text.size()), unknown);
  }

  int64_t max_len_;
  fs::path root_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

// Every option the constructor reads, so the harness refuses a misspelt or
// mistyped one before the reviews are read or the archive extracted.
std::vector<PluginOption> imdb_options() {
  std::vector<PluginOption> options = {
      {"path", ParamKind::String, "imdb", "a folder holding aclImdb/, or aclImdb itself, relative to the data root"},
      {"archive", ParamKind::String, "", "a .tar.gz of the aclImdb layout, extracted once into the cache folder"},
      {"max_len", ParamKind::Int, "4000", "tokens kept of each review (LRA Text: 1000 or 4000 bytes)"},
      {"valid_fraction", ParamKind::Number, "0.1", "the share of train held out for validation"},
      {"split_seed", ParamKind::Int, "0", "seed of the validation split and of the test order and sample"},
      {"test_size", ParamKind::Int, "0", "test reviews scored, half of each class (0: all 25,000)"}};
  for (auto& o : tokenizer_plugin_options("bytes")) options.push_back(std::move(o));
  return options;
}

void register_plugin(Registrar& r) {
  r.add_task("imdb", "IMDB sentiment (aclImdb layout), byte-level like LRA Text or word/subword",
             [](const TaskSpec& spec) { return std::make_unique<ImdbTask>(spec); });
  r.declare_options("task", "imdb", imdb_options());
}

}  // namespace

CHIAR_PLUGIN("task", register_plugin)
