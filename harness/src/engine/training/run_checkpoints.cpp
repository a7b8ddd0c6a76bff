#include "engine/training/run_checkpoints.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <vector>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/runtime/failpoint.h"
#include "engine/training/durable_file.h"

namespace chiar::engine {
namespace {

namespace fs = boost::filesystem;

constexpr size_t kStatesKept = 2;

std::string checkpoint_path(const std::string& dir, const char* kind, int64_t step) {
  return dir + "/" + kind + "-" + std::to_string(step) + ".pt";
}

}  // namespace

RunCheckpoints::RunCheckpoints(Store& store, std::string hash, std::string dir, std::string tag)
    : store_(store), hash_(std::move(hash)), dir_(std::move(dir)), tag_(std::move(tag)) {}

// One line about the run's checkpoints on the console, under its tag.
void RunCheckpoints::say(const std::string& line) const {
  std::cout << (tag_.empty() ? "" : tag_ + ": ") << line << "\n" << std::flush;
}

// Forgets a checkpoint, then removes its file: a record never names a
// missing file because of us. A file left behind has no record and goes at
// the next start (remove_unrecorded_files).
void RunCheckpoints::discard(const CheckpointRecord& c) {
  store_.forget_checkpoint(hash_, c.kind, c.step);
  boost::system::error_code ignored;
  fs::remove(c.file, ignored);
}

// Keeps the newest two states and every best model one of them or the live
// run may still need: the newest two, those newer than the oldest kept
// state, and the one in force at that state.
void RunCheckpoints::prune() {
  const auto states = store_.checkpoints(hash_, kState);
  for (size_t i = kStatesKept; i < states.size(); ++i) discard(states[i]);
  const int64_t oldest_kept_state = states.empty() ? 0 : states[std::min(states.size(), kStatesKept) - 1].step;
  const auto bests = store_.checkpoints(hash_, kBest);
  bool in_force_seen = false;
  for (size_t i = 0; i < bests.size(); ++i) {
    const bool newer = bests[i].step > oldest_kept_state;
    const bool in_force = !newer && !in_force_seen;
    in_force_seen |= !newer;
    if (i >= 2 && !newer && !in_force) discard(bests[i]);
  }
}

void RunCheckpoints::write(const char* kind, int64_t step, const std::string& bytes) {
  const std::string file = checkpoint_path(dir_, kind, step);
  write_durably(file, bytes);
  failpoint("checkpoint.renamed");
  store_.record_checkpoint(hash_, {kind, step, file, static_cast<int64_t>(bytes.size()), crc32_of(bytes)});
  prune();
}

std::pair<int64_t, std::string> RunCheckpoints::newest_verified(const char* kind,
                                                                const std::function<std::string(int64_t)>& instead,
                                                                const std::string& none) {
  std::vector<std::string> corrupt;
  std::pair<int64_t, std::string> found{-1, {}};
  for (const auto& c : store_.checkpoints(hash_, kind)) {
    try {
      found = {c.step, read_verified(c.file, c.bytes, c.checksum)};
      break;
    } catch (const CorruptCheckpoint& e) {
      corrupt.push_back(e.what());
      discard(c);
    }
  }
  for (const auto& what : corrupt) say(what + "; " + (found.first >= 0 ? instead(found.first) : none));
  return found;
}

// A run begun before checkpoints were checksummed (a store of schema 4)
// left state.pt and best.pt. They are adopted as recorded checkpoints of the
// state's step, trusted unverified (they were renamed into place whole, but
// carry no checksum); an unreadable one means starting over.
void RunCheckpoints::adopt_legacy() {
  const std::string state_file = dir_ + "/state.pt", best_file = dir_ + "/best.pt";
  if (!fs::exists(state_file) || !store_.checkpoints(hash_, kState).empty()) return;
  auto read_file = [](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    if (in.bad()) throw EnvironmentError(file + ": cannot read the checkpoint: " + std::strerror(errno));
    return bytes;
  };
  const std::string state = read_file(state_file);
  int64_t step = -1;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(state.data(), state.size(), at::Device(at::kCPU));
    at::Tensor v;
    archive.read("step", v);
    step = v.item<int64_t>();
  } catch (const std::exception& e) {
    // Memory running out says nothing about the file: keep it, stop the run.
    if (is_out_of_memory(e)) throw;
    // libtorch's archive reader throws c10::Errors, and plain runtime_errors
    // on some damage (tests/fuzz/crashes/checkpoint/libtorch_type_parser_runtime_error).
    say(state_file + ": unreadable checkpoint (" + message_of(e) + "); starting over");
    return;  // the file goes with the other unrecorded ones
  }
  say(state_file + " predates checksummed checkpoints; resuming from its step " + std::to_string(step) + " unverified");
  // The best model first: recording the state prunes bests by its step.
  if (fs::exists(best_file)) write(kBest, step, read_file(best_file));
  write(kState, step, state);
}

// Drops what a resumption from `step` will write again: best models newer
// than it (and states, when starting over after corrupt ones).
void RunCheckpoints::forget_after(int64_t step) {
  for (const char* kind : {kState, kBest})
    for (const auto& c : store_.checkpoints(hash_, kind))
      if (c.step > step) discard(c);
}

// Removes checkpoint files no record vouches for: a crash between a rename
// and its record, a temporary file of a crash mid-write, legacy files.
void RunCheckpoints::remove_unrecorded_files() {
  std::set<std::string> recorded;
  for (const char* kind : {kState, kBest})
    for (const auto& c : store_.checkpoints(hash_, kind)) recorded.insert(fs::path(c.file).filename().string());
  boost::system::error_code ec;
  std::vector<fs::path> unrecorded;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string ext = it->path().extension().string();
    if ((ext == ".pt" || ext == ".tmp") && !recorded.count(name)) unrecorded.push_back(it->path());
  }
  for (const auto& file : unrecorded) fs::remove(file, ec);
}

std::string RunCheckpoints::resumable_state() {
  adopt_legacy();
  const auto state = newest_verified(
      kState, [](int64_t step) { return "resuming from step " + std::to_string(step) + " instead"; }, "starting over");
  forget_after(std::max<int64_t>(state.first, 0));
  remove_unrecorded_files();
  return state.first < 0 ? std::string() : state.second;
}

}  // namespace chiar::engine
