#pragma once
// A fresh folder under the system temp folder, removed with its contents.
#include <fstream>
#include <cstdint>
#include <string>
#include <vector>

namespace chiar::test {

class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes text to path()/relative, creating folders.
  std::string write(const std::string& relative, const std::string& text) const;

 private:
  std::string path_;
};

// corpus/wiki.{train,valid,test}.tokens under d: lines of 8 words drawn
// from `words` with SplitMix64(seed), train_lines of them for train and
// other_lines for the other splits. A WikiText-layout corpus for tiny runs.
void write_word_corpus(const TempDir& d, const std::vector<std::string>& words, uint64_t seed, int train_lines,
                       int other_lines);

// ../shared/data beside the source tree, or "" when this machine has none.
std::string shared_data();

}  // namespace chiar::test
