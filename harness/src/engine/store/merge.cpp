#include "merge.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/store/store.h"

namespace chiar::engine {
namespace fs = boost::filesystem;
namespace {

// The tables that hold a run's records, keyed by runs.id in run_id. The
// checkpoint records stay with the store whose folder holds the files: a
// run resumed through the merged store must not prune another store's files.
const char* const kCopiedTables[] = {"metrics", "train_log", "flops", "flops_reference", "routing", "histograms"};
const char* const kRunTables[] = {"metrics", "train_log",  "flops",      "flops_reference",
                                  "routing", "histograms", "checkpoints"};

// One metric value as the store holds it, for comparing finished copies.
struct MetricValue {
  std::string key;    // "test best token_ppl @ step 40"
  std::string value;  // exact: hexadecimal float, or "NULL"
};

// One store's copy of a run.
struct RunCopy {
  size_t store = 0;  // index into the inputs (or kOut)
  int64_t id = 0;    // runs.id in that store
  std::string hash, name;
  RunStatus status = RunStatus::Pending;
  int64_t step = 0;
  std::string error;
  int64_t diverged_step = -1;
  std::vector<MetricValue> metrics;  // finished copies only
};

constexpr size_t kOut = static_cast<size_t>(-1);

std::string exact(const Statement& q, int col) {
  if (q.is_null(col)) return "NULL";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%a", q.real(col));
  return buf;
}

std::vector<MetricValue> metrics_of(Database& db, int64_t id) {
  auto q = db.prepare(
      "SELECT split, checkpoint, name, step, value FROM metrics WHERE run_id = ? "
      "ORDER BY split, checkpoint, name, step");
  q.bind(1, id);
  std::vector<MetricValue> out;
  while (q.step())
    out.push_back({q.text(0) + " " + q.text(1) + " " + q.text(2) + " at step " + q.text(3), exact(q, 4)});
  return out;
}

std::vector<RunCopy> runs_of(Database& db, size_t store) {
  auto q =
      db.prepare("SELECT id, hash, name, status, step, COALESCE(error, ''), COALESCE(diverged_step, -1) FROM runs");
  std::vector<RunCopy> out;
  while (q.step()) {
    RunCopy r;
    r.store = store;
    r.id = q.integer(0);
    r.hash = q.text(1);
    r.name = q.text(2);
    r.status = run_status_from_string(q.text(3));
    r.step = q.integer(4);
    r.error = q.text(5);
    r.diverged_step = q.integer(6);
    out.push_back(std::move(r));
  }
  for (auto& r : out)
    if (is_final(r.status)) r.metrics = metrics_of(db, r.id);
  return out;
}

// How far a copy got: finished beats unfinished, then the later step.
bool further(const RunCopy& a, const RunCopy& b) {
  if (is_final(a.status) != is_final(b.status)) return is_final(a.status);
  return a.step > b.step;
}

// Empty when two finished copies agree; otherwise what differs.
std::string difference(const RunCopy& a, const RunCopy& b) {
  if (a.status != b.status) return std::string("status ") + to_string(a.status) + " vs " + to_string(b.status);
  if (a.error != b.error) return "error '" + a.error + "' vs '" + b.error + "'";
  if (a.diverged_step != b.diverged_step)
    return "diverged at step " + std::to_string(a.diverged_step) + " vs " + std::to_string(b.diverged_step);
  for (size_t i = 0; i < std::max(a.metrics.size(), b.metrics.size()); ++i) {
    if (i >= a.metrics.size()) return b.metrics[i].key + " only in the second";
    if (i >= b.metrics.size()) return a.metrics[i].key + " only in the first";
    if (a.metrics[i].key != b.metrics[i].key) return a.metrics[i].key + " vs " + b.metrics[i].key;
    if (a.metrics[i].value != b.metrics[i].value) {
      auto readable = [](const std::string& v) {
        if (v == "NULL") return v;
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.9g", std::strtod(v.c_str(), nullptr));
        return std::string(buf);
      };
      return a.metrics[i].key + " " + readable(a.metrics[i].value) + " vs " + readable(b.metrics[i].value);
    }
  }
  return "";
}

// The column names of a table, in order.
std::vector<std::string> columns_of(Database& db, const std::string& table) {
  auto q = db.prepare("SELECT name FROM pragma_table_info(?) ORDER BY cid");
  q.bind(1, table);
  std::vector<std::string> out;
  while (q.step()) out.push_back(q.text(0));
  return out;
}

// "a, b, c", or with placeholders "?, ?, ?".
std::string joined(const std::vector<std::string>& names, bool placeholders = false) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + (placeholders ? std::string("?") : n);
  return out;
}

// Copies runs from one input store into the output (inside the output's
// transaction), each under a new id. The statements are prepared once per
// input: an input may be of an older schema, with fewer columns, so each
// input has its own. (Preparing them per run cost about half of a merge of
// 100 shards of 100 runs: chiar_store_scale.)
class RunCopier {
 public:
  RunCopier(Database& from, Database& to) {
    std::vector<std::string> cols = columns_of(from, "runs");
    cols.erase(std::remove(cols.begin(), cols.end(), "id"), cols.end());
    run_ = std::make_unique<Copy>(from, "SELECT " + joined(cols) + " FROM runs WHERE id = ?", to,
                                  "INSERT INTO runs(" + joined(cols) + ") VALUES (" + joined(cols, true) + ")", -1);
    for (const char* table : kCopiedTables) {
      const std::vector<std::string> tcols = columns_of(from, table);
      const auto at = std::find(tcols.begin(), tcols.end(), "run_id");
      records_.push_back(std::make_unique<Copy>(
          from, "SELECT " + joined(tcols) + " FROM " + table + " WHERE run_id = ?", to,
          std::string("INSERT INTO ") + table + "(" + joined(tcols) + ") VALUES (" + joined(tcols, true) + ")",
          at == tcols.end() ? -1 : static_cast<int>(at - tcols.begin())));
    }
    from_ = &from;
    to_ = &to;
  }

  void copy(int64_t id) {
    Copy& run = *run_;
    run.read.bind(1, id);
    if (!run.read.step())
      throw std::logic_error(from_->file() + ": run " + std::to_string(id) + " vanished during a merge");
    for (int c = 0; c < run.read.columns(); ++c) run.put.bind_column(c + 1, run.read, c);
    run.put.run();
    run.put.reset();
    run.read.reset();
    const int64_t new_id = to_->last_insert_id();
    for (auto& table : records_) {
      table->read.bind(1, id);
      while (table->read.step()) {
        for (int c = 0; c < table->read.columns(); ++c) {
          if (c == table->run_id_column)
            table->put.bind(c + 1, new_id);
          else
            table->put.bind_column(c + 1, table->read, c);
        }
        table->put.run();
        table->put.reset();
      }
      table->read.reset();
    }
  }

 private:
  // One table's read from the input and insert into the output.
  struct Copy {
    Copy(Database& from, const std::string& read_sql, Database& to, const std::string& put_sql, int run_id)
        : read(from.prepare(read_sql)), put(to.prepare(put_sql)), run_id_column(run_id) {}
    Statement read, put;
    int run_id_column;  // where the record names its run; -1 in runs itself
  };
  std::unique_ptr<Copy> run_;
  std::vector<std::unique_ptr<Copy>> records_;
  Database* from_ = nullptr;
  Database* to_ = nullptr;
};

void delete_run(Database& db, int64_t id) {
  for (const char* table : kRunTables)
    db.prepare(std::string("DELETE FROM ") + table + " WHERE run_id = ?").bind(1, id).run();
  db.prepare("DELETE FROM runs WHERE id = ?").bind(1, id).run();
}

bool same_file(const std::string& a, const std::string& b) {
  boost::system::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

}  // namespace

std::vector<std::string> expand_store_paths(const std::vector<std::string>& paths, const std::string& skip) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    boost::system::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
        if (it->path().extension() == ".db" && fs::is_regular_file(it->path()) &&
            !(!skip.empty() && same_file(it->path().string(), skip)))
          found.push_back(it->path().string());
      if (ec) throw EnvironmentError(p + ": cannot list the folder: " + ec.message());
      if (found.empty()) throw UserError(p + ": folder holds no store (no *.db file)");
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::exists(p, ec)) {
      out.push_back(p);
    } else {
      throw UserError(p + ": no such database");
    }
  }
  return out;
}

namespace {

// The copy of each run that got furthest over the inputs, by hash; each
// input is opened read-only and held in one snapshot (a shard still being
// written is read as it was then) until the copies are made. Throws when
// two finished copies of a run differ.
std::map<std::string, RunCopy> choose_copies(const std::vector<std::string>& inputs,
                                             std::vector<std::unique_ptr<Store>>& stores) {
  std::map<std::string, RunCopy> chosen;
  for (size_t i = 0; i < inputs.size(); ++i) {
    stores.push_back(std::make_unique<Store>(inputs[i], StoreAccess::ReadOnly));
    stores.back()->db().exec("BEGIN");
    for (RunCopy& r : runs_of(stores.back()->db(), i)) {
      auto it = chosen.find(r.hash);
      if (it == chosen.end()) {
        chosen.emplace(r.hash, std::move(r));
        continue;
      }
      if (is_final(r.status) && is_final(it->second.status)) {
        const std::string diff = difference(it->second, r);
        if (!diff.empty())
          throw UserError("conflict: run " + r.name + " (" + r.hash + ") finished differently in " +
                          inputs[it->second.store] + " and " + inputs[i] + ": " + diff + "; nothing written");
      } else if (further(r, it->second)) {
        it->second = std::move(r);
      }
    }
  }
  return chosen;
}

// A group-sequential design (chiar run --decide, chiar slurm --decide) goes
// with its runs: at most one over the inputs and the output together.
struct CarriedDesign {
  std::optional<SequentialDesignRecord> design;
  std::string from;  // the store it was read from
  std::vector<SequentialLookRecord> looks;

  void take(Store& store, const std::string& name) {
    const auto d = store.sequential_design();
    if (!d) return;
    if (design && !same_design(*design, *d))
      throw UserError("conflict: " + from + " and " + name + " hold different sequential designs; nothing written");
    design = d;
    from = name;
    for (auto& l : store.looks()) looks.push_back(l);
  }
};

// What the merge writes into the output: runs it lacks, and runs an input
// got further with. Throws when a finished run differs from the output's.
struct MergePlan {
  std::map<std::string, RunCopy> held;  // the output's runs, by hash
  std::vector<const RunCopy*> to_add, to_replace;
};

MergePlan plan_merge(const std::string& out, const std::vector<std::string>& inputs,
                     const std::map<std::string, RunCopy>& chosen, CarriedDesign& design, MergeResult& result) {
  MergePlan plan;
  if (fs::exists(out)) {
    Store existing(out, StoreAccess::ReadOnly);
    for (RunCopy& r : runs_of(existing.db(), kOut)) plan.held.emplace(r.hash, std::move(r));
    design.take(existing, out);
  }
  for (const auto& [hash, copy] : chosen) {
    const auto it = plan.held.find(hash);
    if (it == plan.held.end()) {
      plan.to_add.push_back(&copy);
      continue;
    }
    if (is_final(copy.status) && is_final(it->second.status)) {
      const std::string diff = difference(it->second, copy);
      if (!diff.empty())
        throw UserError("conflict: run " + copy.name + " (" + hash + ") finished differently in " + out + " and " +
                        inputs[copy.store] + ": " + diff + "; nothing written");
      ++result.unchanged;
    } else if (further(copy, it->second)) {
      plan.to_replace.push_back(&copy);
    } else {
      ++result.unchanged;
    }
  }
  return plan;
}

// Carries out `plan` in one transaction of the output (created if missing).
void write_merge(const std::string& out, const std::vector<std::unique_ptr<Store>>& stores, const MergePlan& plan,
                 const CarriedDesign& design) {
  if (!fs::exists(out)) {
    const fs::path parent = fs::absolute(out).parent_path();
    boost::system::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw EnvironmentError(parent.string() + ": cannot create the folder: " + ec.message());
  }
  Store target(out, StoreAccess::ReadWrite);
  target.db().transaction([&] {
    std::map<size_t, std::unique_ptr<RunCopier>> copiers;  // by input
    const auto copy_run = [&](const RunCopy& copy) {
      auto& copier = copiers[copy.store];
      if (!copier) copier = std::make_unique<RunCopier>(stores[copy.store]->db(), target.db());
      copier->copy(copy.id);
    };
    for (const RunCopy* copy : plan.to_replace) {
      delete_run(target.db(), plan.held.at(copy->hash).id);
      copy_run(*copy);
    }
    for (const RunCopy* copy : plan.to_add) copy_run(*copy);
    if (design.design) {
      target.save_sequential_design_in_transaction(*design.design);
      for (const auto& l : design.looks) target.record_look(l);
    }
  });
}

}  // namespace

MergeResult merge_stores(const std::string& out, const std::vector<std::string>& inputs) {
  MergeResult result;
  result.inputs = inputs.size();
  for (const auto& in : inputs)
    if (same_file(in, out)) throw UserError(in + ": the merge's output is also one of its inputs");
  // Read everything and decide before anything is written.
  std::vector<std::unique_ptr<Store>> stores;
  const std::map<std::string, RunCopy> chosen = choose_copies(inputs, stores);
  CarriedDesign design;
  for (size_t i = 0; i < inputs.size(); ++i) design.take(*stores[i], inputs[i]);
  const MergePlan plan = plan_merge(out, inputs, chosen, design, result);
  write_merge(out, stores, plan, design);
  result.added = static_cast<int64_t>(plan.to_add.size());
  result.updated = static_cast<int64_t>(plan.to_replace.size());
  return result;
}

StoreView::StoreView(const std::vector<std::string>& paths) {
  const std::vector<std::string> stores = expand_store_paths(paths);
  const bool one_file = paths.size() == 1 && stores.size() == 1 && stores[0] == paths[0];
  if (one_file) {
    db_ = label_ = stores[0];
    return;
  }
  label_ = std::to_string(stores.size()) + (stores.size() == 1 ? " store: " : " stores: ");
  for (size_t i = 0; i < stores.size(); ++i) label_ += (i ? ", " : "") + stores[i];
  const fs::path base = fs::temp_directory_path() / "chiar-view-XXXXXX";
  std::string pattern = base.string();
  if (!mkdtemp(pattern.data()))
    throw EnvironmentError(base.parent_path().string() + ": cannot create a temporary folder: " + std::strerror(errno));
  temp_dir_ = pattern;
  db_ = temp_dir_ + "/merged.db";
  try {
    merge_stores(db_, stores);
  } catch (...) {
    boost::system::error_code ec;
    fs::remove_all(temp_dir_, ec);
    throw;
  }
}

StoreView::~StoreView() {
  if (temp_dir_.empty()) return;
  boost::system::error_code ec;
  fs::remove_all(temp_dir_, ec);
}

}  // namespace chiar::engine
