#include "sqlite.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "chiar/error.h"

namespace chiar::engine {

namespace {

constexpr int kBusyTimeoutMs = 60000;

// Failures of the machine rather than of the request: the same command
// succeeds once there is room, the disk works or the folder is writable.
bool is_environment_failure(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_NOMEM: return true;
    default: return false;
  }
}

// "<file>: <what was being done>: <SQLite's message>[ (<strerror>)]".
// os_errno: the cause when the caller knows it better than SQLite (0: ask SQLite).
[[noreturn]] void fail(sqlite3* db, int rc, const std::string& file, const std::string& doing, int os_errno = 0) {
  std::string cause = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (!is_environment_failure(rc)) throw UserError(file + ": " + doing + ": " + cause);
  // SQLite keeps the errno of the failing system call only for I/O and open
  // errors; elsewhere it may be stale, so it is not shown.
  const int primary = rc & 0xff;
  if (os_errno == 0 && db && (primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN))
    os_errno = sqlite3_system_errno(db);
  if (os_errno != 0) cause += std::string(" (") + std::strerror(os_errno) + ")";
  throw EnvironmentError(file + ": " + doing + ": " + cause);
}

std::string sql_start(const std::string& sql) {
  std::string quoted = "'";
  quoted.append(sql, 0, 60);
  quoted += sql.size() > 60 ? "...'" : "'";
  return quoted;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Why a database cannot be opened for writing: SQLite retries a refused
// read-write open read-only, and its errno is then that retry's (ENOENT for a
// file it could not create). 0 when access() sees nothing wrong.
int why_not_writable(const std::string& file) {
  if (file_exists(file)) return ::access(file.c_str(), R_OK | W_OK) == 0 ? 0 : errno;
  const std::string::size_type slash = file.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  return ::access(folder.c_str(), W_OK | X_OK) == 0 ? 0 : errno;
}

// Whether the file's header says WAL mode (read and write versions 2).
bool header_says_wal(const std::string& file) {
  std::array<char, 100> header{};
  std::ifstream in(file, std::ios::binary);
  if (!in.read(header.data(), header.size())) return false;
  return std::memcmp(header.data(), "SQLite format 3", 16) == 0 && header[18] == 2 && header[19] == 2;
}

// A file: URI for the path (RFC 3986 percent-encoding of all but the
// unreserved characters and '/').
std::string file_uri(const std::string& path, const std::string& query) {
  static const char* const kHex = "0123456789ABCDEF";
  std::string uri = "file:";
  for (const unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '.' || c == '_' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      uri += '%';
      uri += kHex[c >> 4];
      uri += kHex[c & 15];
    }
  }
  return uri + "?" + query;
}

}  // namespace

Statement::Statement(sqlite3* db, const std::string& sql, const std::string& file)
    : db_(db), file_(file), sql_(sql_start(sql)) {
  const int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  if (rc != SQLITE_OK) fail(db, rc, file, "preparing " + sql_);
}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), file_(std::move(other.file_)), sql_(std::move(other.sql_)) {
  other.stmt_ = nullptr;
}

Statement::~Statement() { sqlite3_finalize(stmt_); }  // finalizing nullptr is a no-op

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
Statement& Statement::bind_column(int i, const Statement& from, int col) {
  sqlite3_bind_value(stmt_, i, sqlite3_column_value(from.stmt_, col));
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  fail(db_, rc, file_, "running " + sql_);
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

Database::Database(const std::string& file, OpenMode mode) : file_(file), mode_(mode) {
  // SQLite reports a folder as a disk I/O error.
  struct stat st {};
  if (::stat(file_.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw UserError(file_ + ": is a folder; a store is a file (results/NAME.db)");
  if (mode == OpenMode::ReadOnly)
    open_read_only();
  else
    open_read_write();
}

void Database::open_read_write() {
  const int rc = sqlite3_open_v2(file_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    // The connection (when there is one) holds the message; close it after.
    try {
      fail(db_, rc, file_, "creating or opening the database",
           (rc & 0xff) == SQLITE_CANTOPEN ? why_not_writable(file_) : 0);
    } catch (...) {
      sqlite3_close_v2(db_);
      db_ = nullptr;
      throw;
    }
  }
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  try {
    // SQLite opens a file it may not write read-only, without a word.
    if (sqlite3_db_readonly(db_, "main") == 1) {
      const int cause = why_not_writable(file_);
      throw EnvironmentError(file_ + ": opening the database for writing: " + std::strerror(cause ? cause : EACCES));
    }
    switch_to_wal();
    exec("PRAGMA synchronous=NORMAL");
    exec("PRAGMA foreign_keys=ON");
  } catch (...) {
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw;
  }
}

void Database::open_read_only() {
  struct stat st {};
  if (::stat(file_.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw UserError(file_ + ": no such database");
    throw EnvironmentError(file_ + ": opening the database: " + std::strerror(errno));
  }
  // A WAL database nobody has open has no -wal file; a read-only connection
  // would create -wal and -shm beside it (and, unable to checkpoint, leave
  // them). Opened immutable it reads the file alone, which then holds every
  // committed transaction, and works in a read-only folder too. With a -wal
  // present a writer may be live: read through its WAL, under locks.
  const bool immutable = header_says_wal(file_) && !file_exists(file_ + "-wal");
  const std::string name = immutable ? file_uri(file_, "immutable=1") : file_;
  const int flags = SQLITE_OPEN_READONLY | (immutable ? SQLITE_OPEN_URI : 0);
  const int rc = sqlite3_open_v2(name.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    const std::string cause = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close_v2(db_);
    db_ = nullptr;
    // The file exists: what it is not is the user's to fix (a folder, say).
    throw UserError(file_ + ": opening the database: " + cause);
  }
  sqlite3_extended_result_codes(db_, 1);
  // A reader waits for a writer initialising the store (rollback mode then).
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
}

// Switching to WAL takes an exclusive lock without consulting the busy
// handler, so processes creating one database together retry here.
void Database::switch_to_wal() {
  constexpr int kAttempts = kBusyTimeoutMs / 50;
  for (int attempt = 0;; ++attempt) {
    const int rc = sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return;
    const int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || attempt >= kAttempts)
      fail(db_, rc, file_, "switching to WAL");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Database::~Database() { sqlite3_close_v2(db_); }

void Database::exec(const std::string& sql) {
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) fail(db_, rc, file_, "running " + sql_start(sql));
}

void Database::rollback_quietly() noexcept {
  // A failed COMMIT may have ended the transaction already (SQLite rolls back
  // after an I/O error); one still open is rolled back.
  if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

}  // namespace chiar::engine
