#pragma once
// A fresh folder under the system temp folder, removed with its contents.
#include <fstream>
#include <string>

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

// ../shared/data beside the source tree, or "" when this machine has none.
std::string shared_data();

}  // namespace chiar::test
