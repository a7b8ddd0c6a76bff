#include "sqlite.h"

#include <chrono>
#include <thread>

#include "chiar/error.h"

namespace chiar::engine {

namespace {
[[noreturn]] void fail(sqlite3* db, const std::string& file, const std::string& what) {
  throw UserError(file + ": " + what + ": " + sqlite3_errmsg(db));
}
}  // namespace

Statement::Statement(sqlite3* db, const std::string& sql, const std::string& file) : db_(db), file_(file) {
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK)
    fail(db, file, "cannot prepare '" + sql.substr(0, 60) + "'");
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::bind(int i, int64_t v) {
  sqlite3_bind_int64(stmt_, i, v);
  return *this;
}
Statement& Statement::bind(int i, double v) {
  sqlite3_bind_double(stmt_, i, v);
  return *this;
}
Statement& Statement::bind(int i, const std::string& v) {
  sqlite3_bind_text(stmt_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}
Statement& Statement::bind_null(int i) {
  sqlite3_bind_null(stmt_, i);
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  fail(db_, file_, "statement failed");
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t Statement::integer(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::real(int col) const { return sqlite3_column_double(stmt_, col); }
std::string Statement::text(int col) const {
  const auto* p = sqlite3_column_text(stmt_, col);
  return p ? reinterpret_cast<const char*>(p) : "";
}
bool Statement::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
int Statement::columns() const { return sqlite3_column_count(stmt_); }
std::string Statement::column_name(int col) const { return sqlite3_column_name(stmt_, col); }

Database::Database(const std::string& file) : file_(file) {
  if (sqlite3_open(file.c_str(), &db_) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    throw UserError(file + ": cannot open the database: " + msg);
  }
  sqlite3_busy_timeout(db_, 60000);
  // Switching to WAL takes an exclusive lock without consulting the busy
  // handler, so two processes creating one database retry here themselves.
  for (int attempt = 0;; ++attempt) {
    const int rc = sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) break;
    if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || attempt > 1200) exec("PRAGMA journal_mode=WAL");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  exec("PRAGMA synchronous=NORMAL");
  exec("PRAGMA foreign_keys=ON");
}

Database::~Database() { sqlite3_close(db_); }

void Database::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "error";
    sqlite3_free(err);
    throw UserError(file_ + ": " + msg + " (in '" + sql.substr(0, 60) + "')");
  }
}

}  // namespace chiar::engine
