#include "vector_text.h"

#include <ATen/ATen.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "chiar/error.h"

namespace chiar::engine {

at::Tensor read_vectors(std::istream& in, const std::string& source) {
  std::vector<double> values;
  int64_t width = -1, rows = 0, line_no = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream fields(line);
    std::string field;
    int64_t count = 0;
    while (fields >> field) {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(field.c_str(), &end);
      if (end != field.c_str() + field.size() || errno == ERANGE || !std::isfinite(v))
        throw UserError(source + ":" + std::to_string(line_no) + ": '" + field + "' is not a finite number");
      values.push_back(v);
      ++count;
    }
    if (count == 0)
      throw UserError(source + ":" + std::to_string(line_no) + ": empty line (expected " +
                      (width < 0 ? std::string("numbers") : std::to_string(width) + " numbers") + ")");
    if (width >= 0 && count != width)
      throw UserError(source + ":" + std::to_string(line_no) + ": expected " + std::to_string(width) +
                      " numbers (as on line 1), found " + std::to_string(count));
    width = count;
    ++rows;
  }
  if (rows == 0) throw UserError(source + ": no vectors (empty input)");
  return at::from_blob(values.data(), {rows, width}, at::TensorOptions().dtype(at::kDouble)).clone();
}

}  // namespace chiar::engine
