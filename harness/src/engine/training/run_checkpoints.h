#pragma once
// One run's checkpoint files and their store records. A run's folder holds
// spec.toml, state-<step>.pt (model, optimiser, step, best score, training
// seconds, RNG: all a resumption needs; engine/training/training_state.h)
// and best-<step>.pt (the best-validation model as of that step). A file
// counts only once the store records it, after it is complete and in place;
// the newest two states are kept, so a corrupt newest one has a good
// previous one.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "engine/store/store.h"

namespace chiar::engine {

class RunCheckpoints {
 public:
  static constexpr const char* kState = "state";
  static constexpr const char* kBest = "best";

  // hash: the run's; dir: its checkpoint folder; tag: the run's console
  // prefix, for the lines about corrupt or legacy files.
  RunCheckpoints(Store& store, std::string hash, std::string dir, std::string tag);

  // Writes a checkpoint of `kind` durably, then records it, then drops the
  // ones superseded. Throws EnvironmentError when it cannot be written.
  void write(const char* kind, int64_t step, const std::string& bytes);

  // The newest recorded checkpoint of a kind whose file verifies, as
  // (step, bytes); step -1 when none does. Each corrupt one is forgotten and
  // reported in a line that ends with what is used instead: `instead(k)` for
  // a good one of step k, `none` otherwise.
  std::pair<int64_t, std::string> newest_verified(const char* kind, const std::function<std::string(int64_t)>& instead,
                                                  const std::string& none);

  // Where the run goes on: the bytes of the newest state checkpoint that
  // verifies, or "" when none does (it starts over). Records and files from
  // beyond that point, and files without a record, are removed.
  std::string resumable_state();

 private:
  void say(const std::string& line) const;
  void discard(const CheckpointRecord& c);
  void prune();
  void adopt_legacy();
  void forget_after(int64_t step);
  void remove_unrecorded_files();

  Store& store_;
  const std::string hash_, dir_, tag_;
};

}  // namespace chiar::engine
