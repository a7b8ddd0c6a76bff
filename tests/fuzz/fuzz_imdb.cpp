// aclImdb file-name/label parser: the imdb task's folder reader
// (tasks/imdb, included below so its reader is reachable without loading
// the plugin). The input is split on "-----" lines into the file names of
// neg/, those of pos/ (one per line) and the text every review holds. Names
// a file system cannot hold (empty, with '/', NUL, "." or "..", over 200
// bytes) are skipped. Bad names must surface as chiar::UserError; when the
// folder is accepted, every *.txt name must be <id>_<rating>.txt with a
// decimal rating in the folder's range (neg 1-4, pos 7-10).
#include "../../tasks/imdb/imdb_task.cpp"

#include <sstream>

#include "fuzz_support.h"

namespace {

bool storable(const std::string& name) {
  return !name.empty() && name.size() <= 200 && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// The contract, written independently of the reader: the rating follows the
// first '_' and is nothing but decimal digits.
bool well_named(const std::string& stem, int64_t label) {
  const auto bar = stem.find('_');
  if (bar == std::string::npos) return false;
  const std::string digits = stem.substr(bar + 1);
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const int rating = std::stoi(digits);
  return label == 0 ? rating >= 1 && rating <= 4 : rating >= 7 && rating <= 10;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = chiar::fuzz::split_parts(std::string(reinterpret_cast<const char*>(data), size), 3);
  const std::string& dir = chiar::fuzz::scratch().fresh_dir();
  const std::string text = parts.size() > 2 ? parts[2] : "a review";
  std::vector<std::pair<std::string, int64_t>> written;  // file name, label
  for (int64_t label = 0; label < 2; ++label) {
    const std::string sub = dir + (label == 0 ? "/neg" : "/pos");
    fs::create_directories(sub);
    if (static_cast<size_t>(label) >= parts.size()) continue;
    std::istringstream names(parts[static_cast<size_t>(label)]);
    for (std::string name; std::getline(names, name);) {
      if (!storable(name)) continue;
      chiar::fuzz::write_file(sub + "/" + name, text);
      written.emplace_back(name, label);
    }
  }
  std::vector<Review> reviews;
  try {
    reviews = read_reviews(dir);
  } catch (const chiar::UserError&) {
    return 0;
  }
  for (const auto& [name, label] : written) {
    const fs::path p(name);
    if (p.extension() == ".txt" && !well_named(p.stem().string(), label))
      chiar::fuzz::contract_broken("accepted '" + name + "' in " + (label == 0 ? "neg" : "pos"));
  }
  for (const auto& r : reviews)
    if (r.text.find("<br />") != std::string::npos) chiar::fuzz::contract_broken("a <br /> survived cleaning");
  return 0;
}
