#pragma once
// Shared by the TOML readers (task tables, matrices): values with their
// source position. Include only from .cpp files: toml++ is heavy.
#include <toml++/toml.h>

#include <string>

#include "chiar/params.h"

namespace chiar {

// "file:line:column" of a node (the file as toml++ recorded it).
std::string toml_where(const toml::node& node);

// A plugin option: boolean, integer, float, string, or list of numbers.
Params::Value toml_to_value(const toml::node& node, const std::string& key);

// Parses a file; a syntax error becomes a UserError at file:line:column.
toml::table toml_parse_file(const std::string& file);

}  // namespace chiar
