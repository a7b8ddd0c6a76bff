#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "chiar/export.h"

namespace chiar {

// Options for one plugin object, e.g. {"tau": 0.6, "features": 64}. Plugins read
// them through typed getters; a wrong type is a UserError naming the key. The
// keys a plugin never read are reported back as unknown (see unread_keys()).
class CHIAR_API Params {
 public:
  using Value = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

  Params() = default;
  Params& set(const std::string& key, Value value);

  bool has(const std::string& key) const;
  bool empty() const { return values_.empty(); }
  const std::map<std::string, Value>& values() const { return values_; }

  double get_double(const std::string& key, double fallback) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::vector<double> get_doubles(const std::string& key, const std::vector<double>& fallback) const;

  // The value set, else the declared default, which the registry fills in
  // (set_default) before a plugin that declares its options is built: such
  // a plugin writes each default once, in its declaration. A UserError
  // naming the key when there is neither (a key declared without a value
  // for its default, read without a fallback).
  double get_double(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<double> get_doubles(const std::string& key) const;
  // Sets `key` to `value` unless it is set. A default is not something the
  // user gave: unread_keys never names it.
  Params& set_default(const std::string& key, Value value);

  // Keys set but never read by the object that consumed these params.
  std::vector<std::string> unread_keys() const;

  // "key=value, key=value" in key order, for descriptions and run specs.
  std::string describe() const;

  // Parses "key=value" (value: true/false, integer, number, [a, b], else string).
  static Params from_assignments(const std::vector<std::string>& assignments);

 private:
  const Value* find(const std::string& key) const;
  std::map<std::string, Value> values_;
  mutable std::set<std::string> read_;
};

CHIAR_API std::string describe_value(const Params::Value& value);

}  // namespace chiar
