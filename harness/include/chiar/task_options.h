#pragma once
// The options a task reads, declared when its plugin registers it
// (Registrar::declare_task_options), so that an unknown key or a value of the
// wrong kind is refused before the task's factory opens a single file.
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "chiar/params.h"

namespace chiar {

// The kind of value an option takes: what the Params getter of that kind
// accepts (a Number may be written as an integer, an Int as an integral
// number, Numbers as one number).
enum class ParamKind { Bool, Int, Number, String, Numbers };

struct TaskOption {
  std::string key;
  ParamKind kind;
};

// One option an operator, router or task reads, declared once when its
// plugin registers it (Registrar::declare_options): the harness refuses an
// unknown key or a value of another kind before the factory runs, and before
// any run starts (`chiar run --dry-run`, `chiar slurm`), at the key's own
// line with a did-you-mean; `chiar options` lists the declarations.
struct PluginOption {
  std::string key;
  ParamKind kind;
  // The value the plugin uses when the key is not set, as the docs say it:
  // "128", "model.n_heads", "equal shares".
  std::string default_value;
  std::string doc;  // one line: what it does
  // Strings accepted besides a value of `kind`: {"auto"} for a number
  // that may also be "auto".
  std::vector<std::string> words = {};
};

// "a boolean", "an integer", ... as messages say it.
inline const char* param_kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::Bool: return "a boolean";
    case ParamKind::Int: return "an integer";
    case ParamKind::Number: return "a number";
    case ParamKind::String: return "a string";
    case ParamKind::Numbers: return "a list of numbers";
  }
  return "a value";
}

// The kind a value is written as ("an integer" for 3, "a number" for 0.5).
inline const char* param_value_kind_name(const Params::Value& value) {
  switch (value.index()) {
    case 0: return "a boolean";
    case 1: return "an integer";
    case 2: return "a number";
    case 3: return "a string";
    default: return "a list of numbers";
  }
}

// Whether the getter of `kind` would accept the value (mirrors params.cpp).
inline bool param_has_kind(const Params::Value& value, ParamKind kind) {
  const bool is_int = std::holds_alternative<int64_t>(value);
  const bool is_double = std::holds_alternative<double>(value);
  switch (kind) {
    case ParamKind::Bool: return std::holds_alternative<bool>(value);
    case ParamKind::Int:
      if (is_double) {
        const double d = std::get<double>(value);
        return std::abs(d) < 9.0e15 && std::floor(d) == d;
      }
      return is_int;
    case ParamKind::Number: return is_int || is_double;
    case ParamKind::String: return std::holds_alternative<std::string>(value);
    case ParamKind::Numbers: return is_int || is_double || std::holds_alternative<std::vector<double>>(value);
  }
  return false;
}

// Whether a declared option takes the value: one of its kind, or one of its words.
inline bool option_accepts(const PluginOption& option, const Params::Value& value) {
  if (const auto* text = std::get_if<std::string>(&value))
    for (const auto& w : option.words)
      if (*text == w) return true;
  return param_has_kind(value, option.kind);
}

// "a number or \"auto\"" as messages say what an option takes.
inline std::string option_kind_name(const PluginOption& option) {
  std::string out = param_kind_name(option.kind);
  for (size_t i = 0; i < option.words.size(); ++i)
    out += std::string(i + 1 == option.words.size() ? " or " : ", ") + "\"" + option.words[i] + "\"";
  return out;
}

// The options make_tokenizer (chiar/tokenizer.h) reads, declared with their
// defaults, for tasks that build their tokeniser with it to add to their own;
// `fallback` is the tokeniser the task passes make_tokenizer.
inline std::vector<PluginOption> tokenizer_plugin_options(const std::string& fallback) {
  return {{"tokenizer", ParamKind::String, fallback,
           "word, bytes, bpe or unigram (sentencepiece, trained on the train split and cached)"},
          {"min_count", ParamKind::Int, "1", "word: the fewest occurrences a word needs to enter the vocabulary"},
          {"max_vocab", ParamKind::Int, "0", "word: the most words kept, most frequent first (0: no limit)"},
          {"vocab_size", ParamKind::Int, "8192", "bpe and unigram: the vocabulary size"}};
}

// The same keys and kinds only, for declare_task_options (plugin API 5).
inline std::vector<TaskOption> tokenizer_options() {
  return {{"tokenizer", ParamKind::String},
          {"min_count", ParamKind::Int},
          {"max_vocab", ParamKind::Int},
          {"vocab_size", ParamKind::Int}};
}

}  // namespace chiar
