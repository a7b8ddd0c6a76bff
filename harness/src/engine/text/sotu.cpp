#include "sotu.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cctype>
#include <fstream>
#include <sstream>
#include <vector>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "chiar/text_io.h"

namespace chiar::engine {
namespace fs = boost::filesystem;

std::string split_punctuation(const std::string& text) {
  static const std::string kAlone = ".,;:!?()[]{}\"";
  std::string out;
  auto space = [&] {
    if (!out.empty() && out.back() != ' ') out += ' ';
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      space();
    } else if (kAlone.find(c) != std::string::npos &&
               // keep 1,000 and 3.5 whole
               !((c == ',' || c == '.') && i > 0 && i + 1 < text.size() &&
                 std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
                 std::isdigit(static_cast<unsigned char>(text[i + 1])))) {
      space();
      out += c;
      out += ' ';
    } else if (c == '-' && (i + 1 < text.size() && text[i + 1] == '-')) {
      space();
      out += "-- ";
      ++i;
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

SotuSummary convert_sotu(const std::string& from_dir, const std::string& out_dir, int valid_from, int test_from) {
  boost::system::error_code ec;
  if (!fs::is_directory(from_dir, ec)) throw UserError("sotu: folder '" + from_dir + "' does not exist");
  if (!(valid_from <= test_from)) throw UserError("sotu: valid_from must not be after test_from");
  std::vector<std::pair<std::string, int>> files;  // (name, year)
  for (const auto& f : fs::directory_iterator(from_dir)) {
    const std::string name = f.path().filename().string();
    if (f.path().extension() != ".txt") continue;
    const int year = std::atoi(name.substr(0, name.find('_')).c_str());
    if (year < 1700 || year > 2200) throw UserError("sotu: '" + name + "' does not start with a year");
    files.emplace_back(name, year);
  }
  if (files.empty()) throw UserError("sotu: no <year>_<name>_<party>.txt files in '" + from_dir + "'");
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second < b.second : a.first < b.first;
  });
  fs::create_directories(out_dir, ec);
  if (ec) throw EnvironmentError("sotu: cannot create '" + out_dir + "': " + ec.message());
  const char* names[3] = {"train", "valid", "test"};
  std::ofstream tokens[3], raw[3];
  for (int s = 0; s < 3; ++s) {
    for (const auto& [file, ext] : {std::pair<std::ofstream*, const char*>{&tokens[s], ".tokens"},
                                    std::pair<std::ofstream*, const char*>{&raw[s], ".raw"}}) {
      const std::string path = out_dir + "/sotu." + names[s] + ext;
      file->open(path, std::ios::binary);
      if (!*file) throw EnvironmentError(path + ": cannot write the file: " + std::strerror(errno));
    }
  }
  SotuSummary summary;
  for (const auto& [name, year] : files) {
    const int s = year < valid_from ? 0 : year < test_from ? 1 : 2;
    std::string text;
    for (const auto& line : read_lines(from_dir + "/" + name)) text += (text.empty() ? "" : " ") + line;
    const std::string tokenised = split_punctuation(text);
    tokens[s] << tokenised << '\n';
    raw[s] << text << '\n';
    ++summary.speeches[s];
    summary.words[s] += count_words(tokenised);
  }
  for (int s = 0; s < 3; ++s)
    for (std::ofstream* file : {&tokens[s], &raw[s]})
      if (!file->flush()) throw EnvironmentError("sotu: write error in '" + out_dir + "': " + std::strerror(errno));
  for (int s = 0; s < 3; ++s)
    if (summary.speeches[s] == 0) throw UserError(std::string("sotu: the ") + names[s] + " split is empty");
  return summary;
}

}  // namespace chiar::engine
