// test_store_safety: chiar writes only to its own databases. Read-only
// commands change no file (not even by leaving -wal or -shm files beside
// it) and refuse a database that is not a store; only `chiar run` creates,
// migrates and marks a store; SQLite failures of the environment are
// EnvironmentErrors; processes sharing a new store run every run once.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <boost/filesystem.hpp>

#include "engine/config/run_spec.h"
#include "engine/store/results.h"
#include "engine/store/sqlite.h"
#include "engine/store/store.h"
#include "chiar/error.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

namespace {

std::string read_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A database file's bytes and the names in its folder: equal snapshots mean
// nothing was written, and no journal, -wal or -shm file appeared.
struct Snapshot {
  std::string bytes;
  std::set<std::string> names;
  bool operator==(const Snapshot& o) const { return bytes == o.bytes && names == o.names; }
};

Snapshot snapshot(const std::string& file) {
  Snapshot s{read_bytes(file), {}};
  for (const auto& e : boost::filesystem::directory_iterator(boost::filesystem::path(file).parent_path()))
    s.names.insert(e.path().filename().string());
  return s;
}

std::string not_a_store(const std::string& file) {
  return file + ": not a chiar store (no chiar schema marker); chiar writes only to its own databases";
}

// Another application's SQLite database, in WAL mode or with a rollback journal.
void write_foreign_database(const std::string& file, bool wal) {
  engine::Database con(file);
  con.exec("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes(body) VALUES ('mine')");
  if (!wal) con.exec("PRAGMA journal_mode=DELETE");
}

engine::RunSpec spec_named(const std::string& variant, int seed) {
  engine::RunSpec r;
  r.matrix = "m";
  r.variant = variant;
  r.task = "t";
  r.seed = seed;
  r.canonical = variant + "/t/" + std::to_string(seed) + std::string(200, 'x');
  r.hash = "h-" + variant + "-" + std::to_string(seed);
  return r;
}

// A store holding two registered runs.
void write_store(const std::string& file) {
  engine::Store store(file);
  store.register_runs({spec_named("a", 0), spec_named("b", 0)});
}

// The matrix of the engine tests: 2 variants x 2 tasks x 2 seeds of tiny runs.
void write_matrix(const TempDir& d) {
  test::write_tiny_matrix(d, R"(name = "safety"
variants = ["base", "routed"]
tasks = ["lm", "flat"]
seeds = [0, 1]
)",
                          test::tiny_train_body());
}

using test::query_integer;
std::vector<std::string> run_args(const TempDir& d, const std::string& db) { return test::tiny_run_args(d, db); }

}  // namespace

TEST_CASE("store: every command refuses a database that is not a store and leaves it byte for byte",
          "[engine][store]") {
  TempDir d("safety-foreign");
  write_matrix(d);
  const std::string claims = std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml";
  for (const std::string kind : {"wal", "rollback", "other-application", "text"}) {
    SECTION(kind) {
      const std::string db = d.path() + "/theirs/" + kind + ".db";
      boost::filesystem::create_directories(d.path() + "/theirs");
      if (kind == "wal" || kind == "rollback") write_foreign_database(db, kind == "wal");
      if (kind == "other-application") {
        engine::Database con(db);
        con.exec("PRAGMA application_id = 1234; CREATE TABLE meta(key TEXT, value TEXT)");
      }
      if (kind == "text") d.write("theirs/text.db", "a user's notes, not a database\n");
      const Snapshot before = snapshot(db);
      const std::vector<std::vector<std::string>> commands = {
          {"show", db},
          {"export", db, "--csv"},
          {"report", db, "--out", d.path() + "/r/x", "--claims", claims},
          {"inspect", db, "--run", "base/lm/seed=0", "--text", "the route"},
          {"merge", d.path() + "/merged.db", db},
          {"show", d.path() + "/theirs"},
          run_args(d, db),
      };
      for (const auto& args : commands) {
        const auto out = test::run_chiar(args);
        INFO(args[0] << ": " << out.output);
        CHECK(out.status == 2);
        CHECK(out.output == "chiar: " + not_a_store(db) + "\n");
        CHECK(snapshot(db) == before);
      }
      auto dry = run_args(d, db);
      dry.push_back("--dry-run");
      CHECK(test::run_chiar(dry).output == "chiar: " + not_a_store(db) + "\n");
      CHECK_THROWS_WITH(engine::Store(db), not_a_store(db));
      CHECK_THROWS_WITH(engine::Store(db, engine::StoreAccess::ReadOnly), not_a_store(db));
      CHECK(snapshot(db) == before);
      CHECK_FALSE(boost::filesystem::exists(db + ".checkpoints"));
      CHECK_FALSE(boost::filesystem::exists(d.path() + "/merged.db"));
    }
  }
}

TEST_CASE("store: a read-only command on a missing file says so and creates nothing", "[engine][store]") {
  TempDir d("safety-missing");
  const std::string db = d.path() + "/none.db";
  for (const std::string command : {"show", "export"}) {
    std::vector<std::string> args = {command, db};
    if (command == "export") args.push_back("--csv");
    const auto out = test::run_chiar(args);
    CHECK(out.status == 2);
    CHECK(out.output == "chiar: " + db + ": no such database\n");
  }
  CHECK_THROWS_WITH(engine::Store(db, engine::StoreAccess::ReadOnly), db + ": no such database");
  CHECK_FALSE(boost::filesystem::exists(db));
  CHECK_FALSE(engine::read_stored_runs(db).store);
  CHECK(boost::filesystem::is_empty(d.path()));
}

TEST_CASE("store: an empty database becomes a marked store only through read-write access", "[engine][store]") {
  TempDir d("safety-empty");
  const std::string db = d.write("empty.db", "");
  const Snapshot before = snapshot(db);
  CHECK_THROWS_WITH(engine::Store(db, engine::StoreAccess::ReadOnly), not_a_store(db));
  CHECK_FALSE(engine::read_stored_runs(db).store);
  CHECK(snapshot(db) == before);

  write_store(db);
  CHECK(query_integer(db, "PRAGMA application_id") == engine::kApplicationId);
  CHECK(query_integer(db, "SELECT value FROM meta WHERE key = 'schema_version'") == engine::kSchemaVersion);
  const auto stored = engine::read_stored_runs(db);
  CHECK(stored.store);
  CHECK(stored.current);
  CHECK(stored.status.size() == 2);
}

TEST_CASE("store: a store from before the marker is read as it is and marked by read-write access", "[engine][store]") {
  TempDir d("safety-legacy");
  const std::string db = d.path() + "/legacy.db";
  write_store(db);
  engine::Database(db).exec("PRAGMA application_id = 0");
  const Snapshot before = snapshot(db);
  {
    engine::Store store(db, engine::StoreAccess::ReadOnly);
    CHECK(store.status("h-a-0") == engine::RunStatus::Pending);
  }
  const auto stored = engine::read_stored_runs(db);
  CHECK(stored.store);
  CHECK_FALSE(stored.current);
  CHECK(snapshot(db) == before);

  engine::Store{db};
  CHECK(query_integer(db, "PRAGMA application_id") == engine::kApplicationId);
  CHECK(engine::read_stored_runs(db).current);
}

TEST_CASE("store: read-only access refuses an older schema and says that chiar run migrates it", "[engine][store]") {
  TempDir d("safety-older");
  const std::string db = d.path() + "/old.db";
  write_store(db);
  engine::Database(db).exec("DROP TABLE checkpoints; UPDATE meta SET value = '4' WHERE key = 'schema_version'");
  const Snapshot before = snapshot(db);
  CHECK_THROWS_WITH(engine::Store(db, engine::StoreAccess::ReadOnly),
                    db + ": schema version 4 is older than this harness's " + std::to_string(engine::kSchemaVersion) +
                        "; `chiar run` on its matrix migrates it");
  const auto stored = engine::read_stored_runs(db);  // what `chiar run` reads first
  CHECK(stored.store);
  CHECK_FALSE(stored.current);
  CHECK(stored.status.size() == 2);
  CHECK(snapshot(db) == before);

  engine::Store{db};
  CHECK(query_integer(db, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'checkpoints'") == 1);
  engine::Store store(db, engine::StoreAccess::ReadOnly);
  CHECK(store.checkpoints("h-a-0", "state").empty());
}

TEST_CASE("store: reading a store at rest leaves no -wal or -shm file beside it", "[engine][store]") {
  TempDir d("safety-at-rest");
  const std::string db = d.path() + "/s.db";
  write_store(db);
  const Snapshot before = snapshot(db);
  {
    engine::Store store(db, engine::StoreAccess::ReadOnly);
    CHECK(store.status("h-b-0") == engine::RunStatus::Pending);
    CHECK(store.integrity_ok());
  }
  CHECK(engine::integrity_ok(db));
  CHECK(engine::read_stored_runs(db).status.size() == 2);
  for (const std::string command : {"show", "export"}) {
    std::vector<std::string> args = {command, db};
    if (command == "export") args.push_back("--csv");
    const auto out = test::run_chiar(args);
    INFO(out.output);
    CHECK(out.status == 0);
  }
  CHECK(snapshot(db) == before);
}

// Opened immutable, a store at rest needs no -shm: a folder nobody may write
// to serves it. Root writes anyway, so there this checks nothing more than
// the test above; read-only mounts are the fault tests' ([faults]).
TEST_CASE("store: a store at rest in a read-only folder is readable", "[engine][store]") {
  TempDir d("safety-ro-folder");
  const std::string folder = d.path() + "/ro";
  boost::filesystem::create_directories(folder);
  const std::string db = folder + "/s.db";
  write_store(db);
  if (geteuid() == 0) {
    WARN("running as root, which ignores folder permissions: the read-only folder is not exercised here");
    return;
  }
  REQUIRE(::chmod(folder.c_str(), 0555) == 0);
  const auto out = test::run_chiar({"show", db});
  ::chmod(folder.c_str(), 0755);
  INFO(out.output);
  CHECK(out.status == 0);
  CHECK(boost::filesystem::exists(db));
  CHECK_FALSE(boost::filesystem::exists(db + "-shm"));
}

TEST_CASE("store: a reader of a live store sees its committed writes through the WAL", "[engine][store]") {
  TempDir d("safety-live");
  const std::string db = d.path() + "/live.db";
  engine::Store writer(db);
  writer.register_runs({spec_named("a", 0)});
  REQUIRE(boost::filesystem::exists(db + "-wal"));
  engine::Store reader(db, engine::StoreAccess::ReadOnly);
  CHECK(reader.status("h-a-0") == engine::RunStatus::Pending);
  writer.register_runs({spec_named("b", 1)});
  CHECK(reader.status("h-b-1") == engine::RunStatus::Pending);
  CHECK(engine::read_stored_runs(db).status.size() == 2);
}

TEST_CASE("store: SQLite failures of the environment are EnvironmentErrors naming the file and the cause",
          "[engine][store]") {
  TempDir d("safety-errors");
  const std::string db = d.path() + "/e.db";
  write_store(db);
  SECTION("a full database (max_page_count) rolls the transaction back and stays intact") {
    engine::Store store(db);
    const int64_t pages = query_integer(db, "PRAGMA page_count");
    store.db().exec("PRAGMA max_page_count = " + std::to_string(pages));
    std::vector<engine::RunSpec> many;
    for (int seed = 1; seed <= 200; ++seed) many.push_back(spec_named("c", seed));
    CHECK_THROWS_MATCHES(store.register_runs(many), EnvironmentError,
                         Catch::Matchers::Message(db + ": running 'INSERT INTO runs(hash, name, matrix, variant, task, "
                                                       "seed, sp...': database or disk is full"));
    CHECK(query_integer(db, "SELECT COUNT(*) FROM runs") == 2);
    CHECK(store.integrity_ok());
    store.register_runs({spec_named("d", 0)});  // the connection is usable after the rollback
    CHECK(query_integer(db, "SELECT COUNT(*) FROM runs") == 3);
  }
  SECTION("a write through a read-only connection") {
    engine::Store store(db, engine::StoreAccess::ReadOnly);
    CHECK_THROWS_MATCHES(store.db().exec("DELETE FROM runs"), EnvironmentError,
                         Catch::Matchers::Message(db + ": running 'DELETE FROM runs': attempt to write a readonly "
                                                       "database"));
  }
  SECTION("a wrong statement stays a UserError") {
    engine::Store store(db, engine::StoreAccess::ReadOnly);
    CHECK_THROWS_MATCHES(store.db().prepare("SELECT x FROM nowhere"), UserError,
                         Catch::Matchers::Message(db + ": preparing 'SELECT x FROM nowhere': no such table: nowhere"));
  }
}

TEST_CASE("store: integrity_ok tells a sound store from a damaged or foreign file", "[engine][store]") {
  TempDir d("safety-integrity");
  const std::string db = d.path() + "/i.db";
  write_store(db);
  CHECK(engine::integrity_ok(db));
  CHECK(engine::Store(db, engine::StoreAccess::ReadOnly).integrity_ok());
  CHECK_FALSE(engine::integrity_ok(d.path() + "/none.db"));
  CHECK_FALSE(engine::integrity_ok(d.write("notes.txt", "not a database at all\n")));
  // Every page but the first (the schema) overwritten.
  std::string bytes = read_bytes(db);
  const size_t page = static_cast<size_t>(query_integer(db, "PRAGMA page_size"));
  REQUIRE(bytes.size() > page);
  for (size_t i = page; i < bytes.size(); ++i) bytes[i] = static_cast<char>(0xA5);
  std::ofstream(db, std::ios::binary | std::ios::trunc) << bytes;
  CHECK_FALSE(engine::integrity_ok(db));
}

TEST_CASE("run: four processes started together on a new store run every run exactly once", "[engine][concurrency]") {
  TempDir d("safety-four");
  write_matrix(d);
  boost::filesystem::create_directories(d.path() + "/store");
  const std::string db = d.path() + "/store/four.db";
  std::vector<pid_t> pids;
  for (int p = 0; p < 4; ++p)
    pids.push_back(test::spawn_chiar(run_args(d, db), d.path() + "/log" + std::to_string(p) + ".txt"));
  std::vector<int> exits;
  for (const pid_t pid : pids) exits.push_back(test::wait_chiar(pid));
  std::string logs;
  for (int p = 0; p < 4; ++p) logs += read_bytes(d.path() + "/log" + std::to_string(p) + ".txt");
  INFO(logs);
  CHECK(exits == std::vector<int>{0, 0, 0, 0});
  size_t starts = 0;
  for (size_t at = logs.find(": starting"); at != std::string::npos; at = logs.find(": starting", at + 1)) ++starts;
  CHECK(starts == 8);
  CHECK(logs.find("database is locked") == std::string::npos);
  CHECK(query_integer(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 8);
  CHECK(query_integer(db, "PRAGMA application_id") == engine::kApplicationId);
  CHECK(engine::integrity_ok(db));

  // The read-only commands change nothing: not the file, not its folder.
  const Snapshot before = snapshot(db);
  auto dry = run_args(d, db);
  dry.push_back("--dry-run");
  const std::vector<std::vector<std::string>> readers = {
      {"show", db},
      {"export", db, "--json"},
      {"report", db, "--out", d.path() + "/r/four", "--claims", std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml"},
      {"inspect", db, "--run", "routed/lm/seed=0", "--text", "the route of a token", "--data-root", d.path(),
       "--cache-dir", d.path() + "/cache"},
      dry,
  };
  for (const auto& args : readers) {
    const auto out = test::run_chiar(args);
    INFO(args[0] << ": " << out.output);
    CHECK(out.status == 0);
    CHECK(snapshot(db) == before);
  }

  // The finished matrix on a store made older: run loads no data, migrates
  // and marks it, and then the read-only commands read it.
  engine::Database(db).exec(
      "PRAGMA application_id = 0; DROP TABLE checkpoints; UPDATE meta SET value = '4' WHERE key = 'schema_version'");
  CHECK(test::run_chiar({"show", db}).status == 2);
  const auto again = test::run_chiar(run_args(d, db));
  INFO(again.output);
  CHECK(again.status == 0);
  CHECK_THAT(again.output, Catch::Matchers::Contains("all 8 runs finished before"));
  CHECK(engine::read_stored_runs(db).current);
  CHECK(test::run_chiar({"show", db}).status == 0);
}

TEST_CASE("store: a results reader holds no read transaction between its queries", "[engine][store]") {
  TempDir d("safety-reader");
  const std::string db = d.path() + "/live.db";
  write_store(db);
  engine::Database writer(db);  // a live writer: the WAL stays, as during `chiar run`
  writer.exec("INSERT INTO meta(key, value) VALUES ('probe', '0')");
  engine::ResultsReader reader(db);
  // Queries that read one row and stop, then one that reads every row.
  CHECK(reader.run_count() > 0);
  CHECK_FALSE(reader.find_run("no such run"));
  CHECK_FALSE(reader.runs().empty());
  // A reader mid-query would pin the WAL: a truncating checkpoint then
  // reports itself blocked (its first column, 1).
  writer.exec("UPDATE meta SET value = '1' WHERE key = 'probe'");
  auto checkpoint = writer.prepare("PRAGMA wal_checkpoint(TRUNCATE)");
  REQUIRE(checkpoint.step());
  CHECK(checkpoint.integer(0) == 0);
}
