// Durable checkpoints: written whole or not at all, verified on load, and a
// run that resumes past a corrupt or half-written one ends exactly as an
// uninterrupted run. (Full disks, read-only folders and kills at every crash
// point are tests/test_faults.cpp's.)
#include <catch2/catch.hpp>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>

#include <boost/filesystem.hpp>

#include "engine/store/sqlite.h"
#include "engine/training/durable_file.h"
#include "chiar/error.h"
#include "support/faults.h"
#include "support/process.h"
#include "support/skip.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::line_with;
using test::TempDir;
namespace fs = boost::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The message an expression throws as E, or "" when it throws nothing.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// CHIAR_FAILPOINT for the children spawned in its scope.
struct FailpointScope {
  explicit FailpointScope(const std::string& spec) { setenv("CHIAR_FAILPOINT", spec.c_str(), 1); }
  ~FailpointScope() { unsetenv("CHIAR_FAILPOINT"); }
  FailpointScope(const FailpointScope&) = delete;
  FailpointScope& operator=(const FailpointScope&) = delete;
};

// One tiny language-model run of 60 steps: a state checkpoint every 7 steps,
// a validation (and possibly a best model) every 20.
constexpr const char* kRun = "routed/lm/seed=1";

void write_fixture(const TempDir& d) {
  test::write_tiny_corpus(d);
  d.write("m.toml", R"([matrix]
name = "durable"
variants = ["routed"]
tasks = ["lm"]
seeds = [1]

)" + test::kTinyModelTable +
                        "\n[train]\n" + test::tiny_train_body(60, 20, 7) + "\n" + test::kTinyRoutedVariant + "\n" +
                        test::kTinyLmTask);
}

// Product library pinned: metrics are compared bit for bit across processes.
test::Finished run(const TempDir& d, const std::string& db) {
  return test::run_chiar({"--gemm", "blas", "run", d.path() + "/m.toml", "--db", d.path() + "/" + db, "--data-root",
                          d.path(), "--cache-dir", d.path() + "/cache"});
}

std::string query_text(const std::string& db, const std::string& sql) {
  engine::Database con(db);
  auto q = con.prepare(sql);
  return q.step() ? q.text(0) : "";
}

std::vector<double> final_metrics(const std::string& db) { return test::test_split_metrics(db); }

// The test metrics of the run uninterrupted, computed once.
const std::vector<double>& reference_metrics() {
  static const std::vector<double> reference = [] {
    TempDir d("durable-ref");
    write_fixture(d);
    const auto r = run(d, "ref.db");
    INFO(r.output);
    REQUIRE(r.status == 0);
    return final_metrics(d.path() + "/ref.db");
  }();
  return reference;
}

std::string checkpoint_folder(const std::string& db) {
  return db + ".checkpoints/" + query_text(db, "SELECT hash FROM runs");
}

// The names of the files in a folder, sorted.
std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  for (fs::directory_iterator it(folder), end; it != end; ++it) names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("durable file: written bytes read back verified, with no temporary left", "[durability]") {
  TempDir d("durable-file");
  CHECK(engine::crc32_of("123456789") == "crc32:cbf43926");  // the CRC-32 check value
  CHECK(engine::crc32_of("") == "crc32:00000000");
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::string file = d.path() + "/state-7.pt";
  engine::write_durably(file, bytes);
  CHECK(files_in(d.path()) == std::vector<std::string>{"state-7.pt"});
  CHECK(engine::read_verified(file, static_cast<int64_t>(bytes.size()), engine::crc32_of(bytes)) == bytes);
  // Rewriting replaces the file whole.
  engine::write_durably(file, "short");
  CHECK(engine::read_verified(file, 5, engine::crc32_of("short")) == "short");
  CHECK(files_in(d.path()) == std::vector<std::string>{"state-7.pt"});
}

TEST_CASE("durable file: missing, truncated, oversized and bit-flipped files are named exactly", "[durability]") {
  TempDir d("durable-corrupt");
  const std::string bytes(40960, 'x'), sum = engine::crc32_of(bytes);
  const std::string file = d.path() + "/best-20.pt";
  CHECK(message_of<engine::CorruptCheckpoint>([&] { engine::read_verified(file, 40960, sum); }) ==
        file + ": missing checkpoint (No such file or directory)");
  write_file(file, bytes.substr(0, 12288));
  CHECK(message_of<engine::CorruptCheckpoint>([&] { engine::read_verified(file, 40960, sum); }) ==
        file + ": truncated checkpoint (12288 of 40960 bytes)");
  write_file(file, bytes + "y");
  CHECK(message_of<engine::CorruptCheckpoint>([&] { engine::read_verified(file, 40960, sum); }) ==
        file + ": oversized checkpoint (40961 of 40960 bytes)");
  std::string flipped = bytes;
  flipped[20000] ^= 0x10;
  write_file(file, flipped);
  CHECK(message_of<engine::CorruptCheckpoint>([&] { engine::read_verified(file, 40960, sum); }) ==
        file + ": checksum mismatch (recorded " + sum + ", found " + engine::crc32_of(flipped) + ")");
}

TEST_CASE("durable file: a write that cannot happen names the file and the cause", "[durability]") {
  TempDir d("durable-fail");
  const std::string file = d.path() + "/gone/state-7.pt";
  CHECK(message_of<EnvironmentError>([&] { engine::write_durably(file, "bytes"); }) ==
        file + ".tmp: cannot write the checkpoint: No such file or directory");
  CHECK(message_of<EnvironmentError>([&] { engine::write_file_durably(d.path() + "/gone/spec.toml", "x"); }) ==
        d.path() + "/gone/spec.toml.tmp: cannot write the file: No such file or directory");
  CHECK(files_in(d.path()).empty());
}

TEST_CASE("resume: a corrupt newest state checkpoint is reported and the previous one used", "[durability]") {
  const auto& reference = reference_metrics();
  REQUIRE(reference.size() > 4);
  TempDir d("durable-resume");
  write_fixture(d);
  const std::string db = d.path() + "/r.db";
  {
    FailpointScope kill_at("train.step:30");  // states at 7, 14, 21, 28 written
    REQUIRE(run(d, "r.db").status == 128 + SIGKILL);
  }
  const std::string folder = checkpoint_folder(db);
  // The newest two states are kept, each best model a kept state may need.
  CHECK(files_in(folder) == std::vector<std::string>{"best-20.pt", "spec.toml", "state-21.pt", "state-28.pt"});
  const std::string newest = folder + "/state-28.pt";
  const std::string whole = read_file(newest);
  write_file(newest, whole.substr(0, whole.size() / 2));

  const auto resumed = run(d, "r.db");
  INFO(resumed.output);
  CHECK(resumed.status == 0);
  CHECK(line_with(resumed.output, "truncated") ==
        "[1/1] " + std::string(kRun) + ": " + newest + ": truncated checkpoint (" + std::to_string(whole.size() / 2) +
            " of " + std::to_string(whole.size()) + " bytes); resuming from step 21 instead");
  CHECK(final_metrics(db) == reference);
  CHECK(query_text(db, "SELECT status FROM runs") == "done");
  // The corrupt file is gone with its record; the newest two states remain.
  const auto left = files_in(folder);
  CHECK(std::count_if(left.begin(), left.end(), [](const std::string& f) { return f.rfind("state-", 0) == 0; }) == 2);
  CHECK(std::find(left.begin(), left.end(), "state-60.pt") != left.end());
  CHECK(std::find(left.begin(), left.end(), "state-28.pt") == left.end());
}

TEST_CASE("resume: every state checkpoint corrupt means starting over, to the same result", "[durability]") {
  const auto& reference = reference_metrics();
  TempDir d("durable-over");
  write_fixture(d);
  const std::string db = d.path() + "/o.db";
  {
    FailpointScope kill_at("train.step:10");  // one state, at 7
    REQUIRE(run(d, "o.db").status == 128 + SIGKILL);
  }
  const std::string state = checkpoint_folder(db) + "/state-7.pt";
  std::string flipped = read_file(state);
  const std::string recorded = engine::crc32_of(flipped);
  flipped[flipped.size() / 2] ^= 0x01;
  write_file(state, flipped);
  const auto resumed = run(d, "o.db");
  INFO(resumed.output);
  CHECK(resumed.status == 0);
  CHECK(line_with(resumed.output, "checksum") == "[1/1] " + std::string(kRun) + ": " + state +
                                                     ": checksum mismatch (recorded " + recorded + ", found " +
                                                     engine::crc32_of(flipped) + "); starting over");
  CHECK(final_metrics(db) == reference);
}

TEST_CASE("resume: a run killed between a checkpoint's fsync and rename, or rename and record, ends the same",
          "[durability]") {
  const auto& reference = reference_metrics();
  for (const char* point : {"checkpoint.written:2", "checkpoint.renamed:2"}) {
    INFO(point);
    TempDir d("durable-kill");
    write_fixture(d);
    const std::string db = d.path() + "/k.db";
    {
      FailpointScope kill_at(point);  // in the second checkpoint, state-14
      REQUIRE(run(d, "k.db").status == 128 + SIGKILL);
    }
    const std::string folder = checkpoint_folder(db);
    const std::string left = std::string(point) == "checkpoint.written:2" ? "state-14.pt.tmp" : "state-14.pt";
    CHECK(files_in(folder) == std::vector<std::string>{"spec.toml", left, "state-7.pt"});
    CHECK(query_text(db, "SELECT status FROM runs") == "running");  // its process is dead
    const auto resumed = run(d, "k.db");
    INFO(resumed.output);
    CHECK(resumed.status == 0);
    CHECK_THAT(resumed.output, Catch::Matchers::Contains("resuming"));
    CHECK(final_metrics(db) == reference);
  }
}

TEST_CASE("resume: a schema-4 run's state.pt and best.pt are adopted unverified", "[durability]") {
  const auto& reference = reference_metrics();
  TempDir d("durable-legacy");
  write_fixture(d);
  const std::string db = d.path() + "/l.db";
  {
    FailpointScope kill_at("train.step:30");
    REQUIRE(run(d, "l.db").status == 128 + SIGKILL);
  }
  // What a schema-4 process left: state.pt and best.pt, and no records.
  const std::string folder = checkpoint_folder(db);
  fs::rename(folder + "/state-28.pt", folder + "/state.pt");
  fs::rename(folder + "/best-20.pt", folder + "/best.pt");
  fs::remove(folder + "/state-21.pt");
  engine::Database(db).exec("DELETE FROM checkpoints");
  const auto resumed = run(d, "l.db");
  INFO(resumed.output);
  CHECK(resumed.status == 0);
  CHECK(line_with(resumed.output, "state.pt") == "[1/1] " + std::string(kRun) + ": " + folder +
                                                     "/state.pt predates checksummed checkpoints; resuming from its "
                                                     "step 28 unverified");
  CHECK(final_metrics(db) == reference);
  CHECK(!fs::exists(folder + "/state.pt"));
  CHECK(!fs::exists(folder + "/best.pt"));
}

TEST_CASE("run: too little room for the next checkpoints is warned about before training", "[durability]") {
  if (!test::TmpfsMount::available()) CHIAR_SKIP("[durability]", "needs root to mount a tmpfs");
  TempDir d("durable-room");
  write_fixture(d);
  const std::string db = d.path() + "/s.db";
  fs::create_directories(db + ".checkpoints");
  test::TmpfsMount disk(db + ".checkpoints", 32 << 10);  // the store outside, its checkpoints on a small disk
  const auto cramped = run(d, "s.db");
  INFO(cramped.output);
  const std::string folder = checkpoint_folder(db);
  const std::string warning = line_with(cramped.output, " free, the next checkpoints need about ");
  CHECK_THAT(warning, Catch::Matchers::StartsWith("warning: " + folder + ": ") &&
                          Catch::Matchers::Contains(" KiB free, the next checkpoints need about ") &&
                          Catch::Matchers::EndsWith(" KiB"));
  // Then the first checkpoint fails: the run is interrupted, not failed.
  CHECK(cramped.status == 3);
  const std::string full = folder + "/state-7.pt.tmp: cannot write the checkpoint: No space left on device";
  CHECK(line_with(cramped.output, "chiar: ") == "chiar: " + full);
  CHECK(query_text(db, "SELECT status FROM runs") == "interrupted");
  CHECK(query_text(db, "SELECT error FROM runs") == full);
  CHECK(files_in(folder) == std::vector<std::string>{"spec.toml"});
  disk.resize(16 << 20);
  const auto roomy = run(d, "s.db");
  INFO(roomy.output);
  CHECK(roomy.status == 0);
  CHECK(line_with(roomy.output, " free, the next checkpoints need about ").empty());
  CHECK(final_metrics(db) == reference_metrics());
}

TEST_CASE("inspect: a named checkpoint the store records is verified before libtorch reads it", "[durability]") {
  TempDir d("durable-inspect");
  write_fixture(d);
  const std::string db = d.path() + "/i.db";
  REQUIRE(run(d, "i.db").status == 0);
  const std::string best =
      query_text(db, "SELECT file FROM checkpoints WHERE kind = 'best' ORDER BY step DESC LIMIT 1");
  const std::vector<std::string> inspect = {"inspect",     best,     "--text",      "the route of a token", "--tsv",
                                            "--data-root", d.path(), "--cache-dir", d.path() + "/cache"};
  const auto good = test::run_chiar(inspect);
  INFO(good.output);
  CHECK(good.status == 0);
  CHECK_THAT(good.output, !Catch::Matchers::Contains("unverified"));
  // One flipped byte: refused by its checksum, never handed to libtorch.
  std::string bytes = read_file(best);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x40);
  write_file(best, bytes);
  const auto bad = test::run_chiar(inspect);
  INFO(bad.output);
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, Catch::Matchers::StartsWith("chiar: " + best + ": checksum mismatch (recorded crc32:"));
  // A copy outside the store's layout loads with a warning that no record vouches for it.
  boost::filesystem::create_directories(d.path() + "/copy");
  const std::string folder = boost::filesystem::path(best).parent_path().string();
  boost::filesystem::copy_file(folder + "/spec.toml", d.path() + "/copy/spec.toml");
  const std::string state =
      query_text(db, "SELECT file FROM checkpoints WHERE kind = 'state' ORDER BY step DESC LIMIT 1");
  boost::filesystem::copy_file(state, d.path() + "/copy/state-60.pt");
  auto copied = inspect;
  copied[1] = d.path() + "/copy/state-60.pt";
  const auto unverified = test::run_chiar(copied);
  INFO(unverified.output);
  CHECK(unverified.status == 0);
  CHECK_THAT(unverified.output, Catch::Matchers::Contains("warning: " + copied[1] +
                                                          ": no store records this checkpoint; loading it unverified"));
}
