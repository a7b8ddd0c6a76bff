// Checkpoint loader, as a resume or `chiar inspect` reaches it.
// The input's first line is the record the store holds, the rest is the file
// on disk:
//   "harness"        the record of the reference checkpoint the harness
//                    wrote (checkpoint_fixture.h): the file is a user's or a
//                    disk's change to it;
//   "SIZE CHECKSUM"  any record ("=" for the file's true size or checksum).
// (a) engine/training/durable_file.cpp read_verified must return exactly the file and
//     only when it matches the record, else throw CorruptCheckpoint.
// (b) bytes that passed go through torch::serialize::InputArchive::load_from
//     and the keys a state checkpoint holds (engine/training/trainer.cpp restore), into
//     a tiny model, an AdamW and the CPU generator. By design only bytes the
//     harness wrote reach libtorch: with "harness", (b) runs on what passed;
//     with any other record, (b) runs only under CHIAR_FUZZ_LIBTORCH=1,
//     because libtorch 1.13 crashes on malformed archives
//     (crashes/checkpoint/libtorch_*, docs/fuzzing.md). libtorch is not
//     instrumented: inside it only crashes show.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint_fixture.h"
#include "chiar/error.h"
#include "engine/training/durable_file.h"
#include "fuzz_support.h"

namespace {

struct Record {
  int64_t bytes;
  std::string checksum;
  bool harness;  // the record of the reference checkpoint
};

const std::string& reference() {
  static const std::string bytes = chiar::fuzz::reference_checkpoint();
  return bytes;
}

Record record_of(const std::string& header, const std::string& file) {
  if (header == "harness")
    return {static_cast<int64_t>(reference().size()), chiar::engine::crc32_of(reference()), true};
  const auto space = header.find(' ');
  const std::string size_text = header.substr(0, space);
  const std::string checksum_text = space == std::string::npos ? "=" : header.substr(space + 1);
  return {size_text == "=" ? static_cast<int64_t>(file.size()) : std::strtoll(size_text.c_str(), nullptr, 10),
          checksum_text == "=" ? chiar::engine::crc32_of(file) : checksum_text, false};
}

// restore() in engine/training/trainer.cpp, on a tiny model.
void load_state(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  torch::nn::Linear model(4, 3);
  model->load(archive);
  torch::optim::AdamW optimizer(model->parameters());
  torch::serialize::InputArchive opt_archive;
  archive.read("optimizer", opt_archive);
  optimizer.load(opt_archive);
  auto read = [&](const char* key) {
    at::Tensor v;
    archive.read(key, v);
    return v;
  };
  read("step").item<int64_t>();
  read("best").item<double>();
  read("has_best").item<int64_t>();
  read("train_seconds").item<double>();
  const at::Tensor rng = read("rng");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using chiar::fuzz::contract_broken;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto newline = input.find('\n');
  const std::string header = input.substr(0, newline == std::string::npos ? input.size() : newline);
  const std::string file = newline == std::string::npos ? std::string() : input.substr(newline + 1);
  const Record record = record_of(header, file);

  const std::string path = chiar::fuzz::scratch().fresh_dir() + "/state.pt";
  chiar::fuzz::write_file(path, file);
  std::string bytes;
  try {
    bytes = chiar::engine::read_verified(path, record.bytes, record.checksum);
  } catch (const chiar::engine::CorruptCheckpoint&) {
    return 0;
  }
  if (bytes != file || record.bytes != static_cast<int64_t>(bytes.size()) ||
      record.checksum != chiar::engine::crc32_of(bytes))
    contract_broken("read_verified returned bytes that do not match the record");
  if (record.harness && bytes != reference())
    contract_broken("a changed checkpoint passed verification (a CRC-32 collision)");
  if (!record.harness && !std::getenv("CHIAR_FUZZ_LIBTORCH")) return 0;
  // libtorch refuses most bad archives with c10::Error, but its TorchScript
  // type parser throws std::runtime_error (crashes/checkpoint/
  // libtorch_type_parser_runtime_error): both are refusals the harness must
  // catch. CHIAR_FUZZ_VERBOSE=1 prints what libtorch said.
  try {
    load_state(bytes);
  } catch (const c10::Error& e) {
    if (record.harness)
      contract_broken(std::string("the reference checkpoint does not load: ") + e.what_without_backtrace());
    if (std::getenv("CHIAR_FUZZ_VERBOSE")) std::fprintf(stderr, "c10::Error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    if (record.harness) contract_broken(std::string("the reference checkpoint does not load: ") + e.what());
    if (std::getenv("CHIAR_FUZZ_VERBOSE")) std::fprintf(stderr, "std::exception: %s\n", e.what());
  }
  return 0;
}
