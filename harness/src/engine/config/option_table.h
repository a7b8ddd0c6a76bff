#pragma once
// The [model] and [train] options of a matrix, each described once: its key,
// TOML kind, meaning, the member it fills and the values it accepts. Reading
// a matrix, the defaults a run starts from (and so its hash), the checks of a
// resolved run and the options reference (`chiar options`) all come from
// these tables: a new option is one struct member and one row.
// Include only from .cpp files: toml++ is heavy.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/config/run_spec.h"
#include "chiar/error.h"
#include "engine/config/toml_values.h"

namespace chiar::engine {

// A value of the right kind that the option's type refuses (an unknown mode
// name); the message says what was found, and the reader adds where.
class RefusedValue : public UserError {
 public:
  RefusedValue(std::string path, const std::string& what) : UserError(what), path_(std::move(path)) {}
  // The option's key path, "model.execution".
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

enum class OptionKind { Int, Number, String, Bool, Strings, Ints, Table };

// Whether a node has the kind (a Number may be written as an integer).
bool has_kind(const toml::node& node, OptionKind kind);
// "an integer", "a list of strings", ... as messages say it.
const char* kind_name(OptionKind kind);

// "file:line:column" of a node at a key path of the matrix being read: nodes
// copied by merging lose their own positions.
using Locate = std::function<std::string(const toml::node& node, const std::string& path)>;

template <class Options>
struct OptionField {
  std::string key;
  OptionKind kind;
  std::string doc;
  // Sets the member from a value of the field's kind (path: "model.KEY").
  // Throws RefusedValue for a value its type refuses (an unknown mode name).
  std::function<void(Options&, const toml::node&, const std::string& path, const Locate&)> read;
  // Inserts the member's value under the key, as a run spec records it.
  std::function<void(const Options&, toml::table&)> write;
  // What is wrong with the member's value ("must be at least 1"), or "".
  std::function<std::string(const Options&)> check;
  // True where the member's value stays out of the run's hash; empty: always
  // hashed. Either always (a key that says where a run trains, not what it
  // is) or at the one value every run stored before the option existed
  // computed with, so that those runs keep their hashes.
  std::function<bool(const Options&)> unhashed;
  // What `chiar options` says of that ("`\"post\"` is left out of run
  // hashes, ..."), or "".
  std::string unhashed_note;
};

const std::vector<OptionField<model::ModelOptions>>& model_option_fields();
const std::vector<OptionField<TrainOptions>>& train_option_fields();

// Every field's key, in table order.
template <class Options>
std::vector<std::string> option_keys(const std::vector<OptionField<Options>>& fields) {
  std::vector<std::string> keys;
  for (const auto& f : fields) keys.push_back(f.key);
  return keys;
}

// Every field of a default-constructed Options: what a run starts from.
template <class Options>
toml::table option_defaults(const std::vector<OptionField<Options>>& fields) {
  const Options defaults;
  toml::table t;
  for (const auto& f : fields) f.write(defaults, t);
  return t;
}

// Removes from run[section] the keys whose values stay out of the run's hash.
template <class Options>
void erase_unhashed(toml::table& run, const std::string& section, const Options& o,
                    const std::vector<OptionField<Options>>& fields) {
  toml::table* t = run[section].as_table();
  if (!t) return;
  for (const auto& f : fields)
    if (f.unhashed && f.unhashed(o)) t->erase(f.key);
}

// Options from a resolved table, which holds every field's key with a value of
// its kind. `section` ("model", "train") prefixes the key paths of errors.
template <class Options>
Options read_options(const toml::table& t, const std::vector<OptionField<Options>>& fields, const std::string& section,
                     const Locate& where, Options o = {}) {
  for (const auto& f : fields) f.read(o, *t.get(f.key), section + "." + f.key, where);
  return o;
}

// The first failed check of an options struct: the key's path
// ("train.steps") and what is wrong with its value ("must be at least 1");
// an empty path when every check passes.
struct OptionProblem {
  std::string path;
  std::string what;
};
template <class Options>
OptionProblem check_options(const Options& o, const std::vector<OptionField<Options>>& fields,
                            const std::string& section) {
  for (const auto& f : fields)
    if (f.check)
      if (std::string what = f.check(o); !what.empty()) return {section + "." + f.key, what};
  return {};
}

// A plugin option value into a TOML table.
void put_value(toml::table& t, const std::string& key, const Params::Value& v);

}  // namespace chiar::engine
