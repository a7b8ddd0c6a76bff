#include "chiar/text_io.h"

#include <fstream>
#include <sstream>

#include "chiar/error.h"

namespace chiar {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open the file");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) throw UserError(path + ": read error");
  return lines;
}

int64_t count_words(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  int64_t n = 0;
  while (in >> word) ++n;
  return n;
}

std::string resolve_path(const std::string& root, const std::string& path) {
  // Absolute, or explicitly relative to the working folder ("./x", "../x").
  if (path.empty() || path.front() == '/' || root.empty() || path.rfind("./", 0) == 0 || path.rfind("../", 0) == 0)
    return path;
  return root + "/" + path;
}

}  // namespace chiar
