#pragma once
// ListOps as Long Range Arena defines it, reimplemented from its published
// generator parameters, with a fixed generator so the same seed always gives
// byte-identical data. Plus the flat variant the CHIAR paper trained on.
#include <cstdint>
#include <string>
#include <vector>

#include "chiar/export.h"

namespace chiar {

struct ListOpsOptions {
  int64_t max_depth = 10;     // root at depth 1; every node at max_depth is a digit
  int64_t max_args = 10;      // an operator takes 2..max_args arguments, uniformly
  int64_t min_length = 500;   // keep only min_length < length < max_length, where length
  int64_t max_length = 2000;  // counts operators, digits and closing brackets
  double operator_p = 0.25;   // below max_depth a node is an operator with this probability
};

struct ListOpsExample {
  std::string source;  // LRA text: "( ( ( [MAX 2 ) 9 ) ] )"
  int target = 0;      // 0..9
};

// n distinct examples in generation order; sequential, so independent of threads.
CHIAR_API std::vector<ListOpsExample> generate_listops(int64_t n, uint64_t seed, const ListOpsOptions& options = {});

// The flat variant: one operator (MAX, MIN, MEAN, MED; MEAN and MED take the
// floor, then mod 10) over min_args..max_args digits, same text format.
CHIAR_API std::vector<ListOpsExample> generate_listops_flat(int64_t n, uint64_t seed, int64_t min_args = 4,
                                                            int64_t max_args = 8);

// LRA tokenisation: whitespace split with the parentheses dropped.
CHIAR_API std::vector<std::string> listops_tokens(const std::string& source);

// The value of an expression: MIN, MAX, MED (median; with an even count the
// floor of the mean of the two middle values), SM (sum mod 10), MEAN (floor
// of the mean, mod 10). Throws UserError for malformed input.
CHIAR_API int evaluate_listops(const std::string& source);

// Reads and writes LRA's TSV ("Source<TAB>Target" header, one example a line).
// Errors name the file and line.
CHIAR_API std::vector<ListOpsExample> read_listops_tsv(const std::string& path);
CHIAR_API void write_listops_tsv(const std::string& path, const std::vector<ListOpsExample>& examples);

}  // namespace chiar
