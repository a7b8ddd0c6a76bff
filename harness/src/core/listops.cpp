#include "chiar/listops.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <unordered_set>

#include "chiar/error.h"
#include "chiar/random.h"
#include "chiar/text_io.h"

namespace chiar {
namespace {

const char* const kOperators[] = {"[MIN", "[MAX", "[MED", "[SM"};

int apply_operator(const std::string& op, std::vector<int> v) {
  if (v.empty()) throw UserError("listops: operator " + op + " has no arguments");
  if (op == "[MIN") return *std::min_element(v.begin(), v.end());
  if (op == "[MAX") return *std::max_element(v.begin(), v.end());
  if (op == "[SM") return std::accumulate(v.begin(), v.end(), 0) % 10;
  if (op == "[MED") {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;  // floor of the two middle values' mean
  }
  if (op == "[MEAN") return (std::accumulate(v.begin(), v.end(), 0) / static_cast<int>(v.size())) % 10;
  throw UserError("listops: unknown operator '" + op + "'");
}

// Writes an operator node in LRA's left-nested pair form:
// (op, a1, ..., an) -> "( ( ... ( [OP a1 ) a2 ) ... an ) ] )".
std::string nest(const std::string& op, const std::vector<std::string>& args) {
  std::string s;
  for (size_t i = 0; i <= args.size(); ++i) s += "( ";
  s += op;
  for (const auto& a : args) s += " " + a + " )";
  return s + " ] )";
}

struct Node {
  std::string text;
  int value;
  int64_t length;  // operators + digits + closing brackets
};

// LRA's generate_tree, decision for decision: below max_depth a node is an
// operator with probability operator_p; its argument count is uniform on
// 2..max_args; its operator is drawn after its arguments.
Node generate_tree(SplitMix64& rng, int64_t depth, const ListOpsOptions& o) {
  const double r = depth < o.max_depth ? rng.uniform() : 1.0;
  if (r > o.operator_p) {
    const int digit = static_cast<int>(rng.below(10));
    return {std::to_string(digit), digit, 1};
  }
  const int64_t n = rng.between(2, o.max_args);
  std::vector<std::string> texts;
  std::vector<int> values;
  int64_t length = 2;
  for (int64_t i = 0; i < n; ++i) {
    Node child = generate_tree(rng, depth + 1, o);
    texts.push_back(std::move(child.text));
    values.push_back(child.value);
    length += child.length;
  }
  const std::string op = kOperators[rng.below(4)];
  return {nest(op, texts), apply_operator(op, values), length};
}

}  // namespace

std::vector<ListOpsExample> generate_listops(int64_t n, uint64_t seed, const ListOpsOptions& o) {
  if (o.max_depth < 1 || o.max_args < 2 || o.min_length >= o.max_length - 1)
    throw UserError("listops: need max_depth >= 1, max_args >= 2 and min_length < max_length - 1");
  SplitMix64 rng(seed, 0x115);
  std::vector<ListOpsExample> out;
  std::unordered_set<uint64_t> seen;  // hashes: a collision skips a tree, never keeps a duplicate
  int64_t attempts = 0;
  while (static_cast<int64_t>(out.size()) < n) {
    if (++attempts > 1000 * std::max<int64_t>(n, 1000))
      throw UserError("listops: the length bounds reject nearly every tree; widen min_length/max_length");
    Node tree = generate_tree(rng, 1, o);
    if (tree.length <= o.min_length || tree.length >= o.max_length) continue;
    if (!seen.insert(fnv1a(tree.text)).second) continue;
    out.push_back({std::move(tree.text), tree.value});
  }
  return out;
}

std::vector<ListOpsExample> generate_listops_flat(int64_t n, uint64_t seed, int64_t min_args, int64_t max_args) {
  if (min_args < 1 || max_args < min_args) throw UserError("listops_flat: need 1 <= min_args <= max_args");
  static const char* const ops[] = {"[MAX", "[MIN", "[MEAN", "[MED"};
  SplitMix64 rng(seed, 0xF1A7);
  std::vector<ListOpsExample> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::string op = ops[rng.below(4)];
    const int64_t k = rng.between(min_args, max_args);
    std::vector<std::string> texts;
    std::vector<int> values;
    for (int64_t j = 0; j < k; ++j) {
      values.push_back(static_cast<int>(rng.below(10)));
      texts.push_back(std::to_string(values.back()));
    }
    out.push_back({nest(op, texts), apply_operator(op, values)});
  }
  return out;
}

std::vector<std::string> listops_tokens(const std::string& source) {
  std::vector<std::string> out;
  std::istringstream in(source);
  std::string t;
  while (in >> t)
    if (t != "(" && t != ")") out.push_back(t);
  return out;
}

int evaluate_listops(const std::string& source) {
  struct Frame {
    std::string op;
    std::vector<int> args;
  };
  std::vector<Frame> stack;
  std::vector<int> top;  // values outside any operator
  for (const auto& t : listops_tokens(source)) {
    auto& sink = stack.empty() ? top : stack.back().args;
    if (t.size() == 1 && t[0] >= '0' && t[0] <= '9') {
      sink.push_back(t[0] - '0');
    } else if (t == "]") {
      if (stack.empty()) throw UserError("listops: ']' without an operator in '" + source.substr(0, 60) + "'");
      Frame f = std::move(stack.back());
      stack.pop_back();
      (stack.empty() ? top : stack.back().args).push_back(apply_operator(f.op, f.args));
    } else if (t[0] == '[') {
      apply_operator(t, {0});  // validates the name
      stack.push_back({t, {}});
    } else {
      throw UserError("listops: unexpected token '" + t + "'");
    }
  }
  if (!stack.empty()) throw UserError("listops: unclosed operator " + stack.back().op);
  if (top.size() != 1) throw UserError("listops: expected one value, found " + std::to_string(top.size()));
  return top[0];
}

std::vector<ListOpsExample> read_listops_tsv(const std::string& path) {
  const auto lines = read_lines(path);
  if (lines.empty()) throw UserError(path + ": empty file (expected a 'Source<TAB>Target' header)");
  std::vector<ListOpsExample> out;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string where = path + ":" + std::to_string(i + 1);
    if (lines[i].empty()) continue;
    const auto tab = lines[i].find('\t');
    if (tab == std::string::npos || lines[i].find('\t', tab + 1) != std::string::npos)
      throw UserError(where + ": expected 2 tab-separated fields (Source, Target)");
    const std::string target = lines[i].substr(tab + 1);
    if (target.size() != 1 || target[0] < '0' || target[0] > '9')
      throw UserError(where + ": label '" + target + "' is not in 0..9");
    out.push_back({lines[i].substr(0, tab), target[0] - '0'});
  }
  return out;
}

void write_listops_tsv(const std::string& path, const std::vector<ListOpsExample>& examples) {
  // The path was the user's to choose; the system refusing it (a folder that
  // is a file, no permission, a full disk) is the environment's failure.
  std::ofstream out(path, std::ios::binary);
  if (!out) throw EnvironmentError(path + ": cannot write the file: " + std::strerror(errno));
  out << "Source\tTarget\n";
  for (const auto& e : examples) out << e.source << '\t' << e.target << '\n';
  out.flush();
  if (!out) throw EnvironmentError(path + ": write error: " + std::strerror(errno));
}

}  // namespace chiar
