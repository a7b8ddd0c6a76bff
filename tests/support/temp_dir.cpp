#include "temp_dir.h"

#include "chiar/random.h"

#include <unistd.h>

#include <boost/filesystem.hpp>

#include <random>

namespace chiar::test {
namespace fs = boost::filesystem;

TempDir::TempDir(const std::string& tag) {
  std::random_device rd;
  path_ =
      (fs::temp_directory_path() / ("chiar-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(rd())))
          .string();
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  boost::system::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& relative, const std::string& text) const {
  const fs::path p = fs::path(path_) / relative;
  fs::create_directories(p.parent_path());
  std::ofstream(p.string(), std::ios::binary) << text;
  return p.string();
}

std::string shared_data() {
  const fs::path p = fs::path(CHIAR_SOURCE_DIR) / ".." / "shared" / "data";
  boost::system::error_code ec;
  return fs::is_directory(p, ec) ? fs::canonical(p).string() : std::string();
}

void write_word_corpus(const TempDir& d, const std::vector<std::string>& words, uint64_t seed, int train_lines,
                       int other_lines) {
  SplitMix64 rng(seed);
  for (const char* split : {"train", "valid", "test"}) {
    std::string text;
    for (int line = 0; line < (std::string(split) == "train" ? train_lines : other_lines); ++line) {
      for (int w = 0; w < 8; ++w) text += std::string(w ? " " : "") + words[rng.below(words.size())];
      text += "\n";
    }
    d.write(std::string("corpus/wiki.") + split + ".tokens", text);
  }
}

}  // namespace chiar::test
