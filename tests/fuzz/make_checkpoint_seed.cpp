// Writes the seeds of fuzz_checkpoint: the reference state checkpoint behind
// a "harness" header (the record the store holds for it) and behind "= ="
// (a record of whatever the file holds). Usage: make_checkpoint_seed OUT_DIR
#include <fstream>
#include <string>

#include "checkpoint_fixture.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1], bytes = chiar::fuzz::reference_checkpoint();
  std::ofstream(dir + "/state_checkpoint", std::ios::binary) << "harness\n" << bytes;
  std::ofstream(dir + "/state_checkpoint_any_record", std::ios::binary) << "= =\n" << bytes;
  return 0;
}
