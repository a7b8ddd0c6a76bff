#include "chiar/params.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "chiar/error.h"

namespace chiar {
namespace {

const char* type_name(const Params::Value& v) {
  switch (v.index()) {
    case 0: return "a boolean";
    case 1: return "an integer";
    case 2: return "a number";
    case 3: return "a string";
    default: return "a list of numbers";
  }
}

[[noreturn]] void wrong_type(const std::string& key, const char* expected, const Params::Value& found) {
  throw UserError("parameter '" + key + "': expected " + expected + ", found " + type_name(found) + " (" +
                  describe_value(found) + ")");
}

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  // strtod reads "nan" and "inf"; an option given them stays text, and its
  // kind check refuses it.
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(out);
}

bool parse_integer(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end == s.c_str() + s.size();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string describe_value(const Params::Value& value) {
  std::ostringstream out;
  switch (value.index()) {
    case 0: out << (std::get<bool>(value) ? "true" : "false"); break;
    case 1: out << std::get<int64_t>(value); break;
    case 2: out << std::get<double>(value); break;
    case 3: out << '"' << std::get<std::string>(value) << '"'; break;
    default: {
      out << '[';
      const auto& list = std::get<std::vector<double>>(value);
      for (size_t i = 0; i < list.size(); ++i) out << (i ? ", " : "") << list[i];
      out << ']';
    }
  }
  return out.str();
}

Params& Params::set(const std::string& key, Value value) {
  values_[key] = std::move(value);
  return *this;
}

bool Params::has(const std::string& key) const { return values_.count(key) != 0; }

const Params::Value* Params::find(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return nullptr;
  read_.insert(key);
  return &it->second;
}

double Params::get_double(const std::string& key, double fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (auto d = std::get_if<double>(v)) return *d;
  if (auto i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  wrong_type(key, "a number", *v);
}

int64_t Params::get_int(const std::string& key, int64_t fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (auto i = std::get_if<int64_t>(v)) return *i;
  if (auto d = std::get_if<double>(v)) {
    if (std::floor(*d) == *d && std::abs(*d) < 9.0e15) return static_cast<int64_t>(*d);
  }
  wrong_type(key, "an integer", *v);
}

bool Params::get_bool(const std::string& key, bool fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (auto b = std::get_if<bool>(v)) return *b;
  wrong_type(key, "a boolean", *v);
}

std::string Params::get_string(const std::string& key, const std::string& fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (auto s = std::get_if<std::string>(v)) return *s;
  wrong_type(key, "a string", *v);
}

std::vector<double> Params::get_doubles(const std::string& key, const std::vector<double>& fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (auto l = std::get_if<std::vector<double>>(v)) return *l;
  if (auto d = std::get_if<double>(v)) return {*d};
  if (auto i = std::get_if<int64_t>(v)) return {static_cast<double>(*i)};
  wrong_type(key, "a list of numbers", *v);
}

Params& Params::set_default(const std::string& key, Value value) {
  if (values_.emplace(key, std::move(value)).second) read_.insert(key);
  return *this;
}

namespace {

[[noreturn]] void no_default(const std::string& key) {
  throw UserError("option '" + key + "' is not set and its declaration gives no default value");
}

}  // namespace

double Params::get_double(const std::string& key) const {
  if (!has(key)) no_default(key);
  return get_double(key, 0.0);
}

int64_t Params::get_int(const std::string& key) const {
  if (!has(key)) no_default(key);
  return get_int(key, 0);
}

bool Params::get_bool(const std::string& key) const {
  if (!has(key)) no_default(key);
  return get_bool(key, false);
}

std::string Params::get_string(const std::string& key) const {
  if (!has(key)) no_default(key);
  return get_string(key, "");
}

std::vector<double> Params::get_doubles(const std::string& key) const {
  if (!has(key)) no_default(key);
  return get_doubles(key, {});
}

std::vector<std::string> Params::unread_keys() const {
  std::vector<std::string> out;
  for (const auto& kv : values_)
    if (!read_.count(kv.first)) out.push_back(kv.first);
  return out;
}

std::string Params::describe() const {
  std::string out;
  for (const auto& kv : values_) {
    if (!out.empty()) out += ", ";
    out += kv.first + "=" + describe_value(kv.second);
  }
  return out;
}

Params Params::from_assignments(const std::vector<std::string>& assignments) {
  Params p;
  for (const auto& a : assignments) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) throw UserError("expected key=value, found '" + a + "'");
    const std::string key = trim(a.substr(0, eq));
    const std::string text = trim(a.substr(eq + 1));
    int64_t i = 0;
    double d = 0;
    if (text == "true" || text == "false") {
      p.set(key, text == "true");
    } else if (parse_integer(text, i)) {
      p.set(key, i);
    } else if (parse_number(text, d)) {
      p.set(key, d);
    } else if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
      std::vector<double> list;
      std::stringstream items(text.substr(1, text.size() - 2));
      std::string item;
      while (std::getline(items, item, ',')) {
        item = trim(item);
        if (item.empty()) continue;
        if (!parse_number(item, d))
          throw UserError("parameter '" + key + "': '" + item + "' in " + text + " is not a number");
        list.push_back(d);
      }
      p.set(key, list);
    } else {
      p.set(key, text);
    }
  }
  return p;
}

}  // namespace chiar
