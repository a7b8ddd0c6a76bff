#pragma once
#include <string>
#include <vector>

#include "chiar/export.h"

namespace chiar {

// Every line of a text file ("\r\n" accepted). A missing or unreadable file is
// a UserError naming it.
CHIAR_API std::vector<std::string> read_lines(const std::string& path);

// Whitespace-separated words on a line.
CHIAR_API int64_t count_words(const std::string& line);

// path itself when absolute or explicitly relative ("./x", "../x": from the
// working folder), else root/path.
CHIAR_API std::string resolve_path(const std::string& root, const std::string& path);

}  // namespace chiar
