#pragma once
// Cells of the CSV and JSON files the result commands write.
#include <string>

namespace chiar::report {

// A CSV field: quoted (with doubled quotes) when it holds a comma, a quote or
// a line break.
std::string csv_cell(const std::string& s);

// A JSON string literal: quotes, backslashes and control characters escaped.
std::string json_string(const std::string& s);

// A number as CSV and JSON write it: up to 10 significant digits; "" for NaN
// (JSON: null).
std::string number_cell(double value);

}  // namespace chiar::report
