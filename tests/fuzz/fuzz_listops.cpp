// ListOps TSV reader (core/listops.cpp): the input is one TSV file as
// train_file/valid_file/test_file would name it. Every example read is then
// tokenised and evaluated as the task and `chiar data` do. Bad input must
// surface as chiar::UserError.
#include <cstdint>
#include <string>

#include "chiar/error.h"
#include "chiar/listops.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chiar;
  const std::string path = fuzz::scratch().fresh_dir() + "/listops.tsv";
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  try {
    for (const auto& e : read_listops_tsv(path)) {
      if (e.target < 0 || e.target > 9) fuzz::contract_broken("label outside 0..9");
      listops_tokens(e.source);
      try {
        const int value = evaluate_listops(e.source);
        if (value < 0 || value > 9) fuzz::contract_broken("evaluate_listops gave " + std::to_string(value));
      } catch (const UserError&) {
      }
    }
  } catch (const UserError&) {
  }
  return 0;
}
