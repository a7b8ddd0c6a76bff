#pragma once
// Several stores read as one. A matrix spread over a Slurm job array writes
// one store per array task (SQLite must not be shared over a network file
// system); `chiar merge` combines them, and show, export and report accept
// several stores or a folder of them.
#include <cstdint>
#include <string>
#include <vector>

namespace chiar::engine {

// The stores that paths name: a file is itself; a folder stands for every
// *.db file directly in it but `skip` (a merge's output kept among its
// shards), sorted by name. UserError ("<path>: no such database") for a path that does not exist or a
// folder with no .db file.
std::vector<std::string> expand_store_paths(const std::vector<std::string>& paths, const std::string& skip = "");

struct MergeResult {
  size_t inputs = 0;      // stores read
  int64_t added = 0;      // runs the output did not hold
  int64_t updated = 0;    // runs it held unfinished, replaced by a copy that got further
  int64_t unchanged = 0;  // runs it already held as far (finished, or at least as many steps)
};

// Copies every run of the inputs into `out` (created when missing): its row
// (spec, status, summary, provenance) and its metrics, train log, FLOPs,
// routing shares and entropy histograms. Checkpoint records stay with the
// store beside whose folder the files are (chiar inspect reads them there). A run held by
// several stores is taken from the copy that got furthest: finished over
// unfinished, then the later step. Finished copies must agree (status, error
// and every metric, bit for bit); two that differ are a conflict, reported as
// a UserError naming the run, both stores and the first difference, and then
// nothing is written. Merging the same inputs again changes nothing.
MergeResult merge_stores(const std::string& out, const std::vector<std::string>& inputs);

// What a read-only command reads when it is given stores: the store itself
// when paths name exactly one file, otherwise every store they name merged
// into a temporary store that lives as long as this object.
class StoreView {
 public:
  explicit StoreView(const std::vector<std::string>& paths);
  ~StoreView();
  StoreView(const StoreView&) = delete;
  StoreView& operator=(const StoreView&) = delete;

  const std::string& db() const { return db_; }
  // The stores as the user named them, for messages and report titles:
  // "results/x.db" or "3 stores: results/x/shard-1.db, ...".
  const std::string& label() const { return label_; }

 private:
  std::string db_, label_, temp_dir_;
};

}  // namespace chiar::engine
