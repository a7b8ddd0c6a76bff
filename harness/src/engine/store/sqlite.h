#pragma once
// A thin RAII layer over the SQLite C API: one connection, prepared
// statements with positional binding. A failure names the file and what was
// being done; a failing environment (full disk, I/O error, read-only file or
// folder, out of memory) is a chiar::EnvironmentError, anything else a
// chiar::UserError. Destructors never throw.
#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/runtime/failpoint.h"

namespace chiar::engine {

class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql, const std::string& file);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  // Moved, the statement changes owner; the moved-from one holds none.
  Statement(Statement&& other) noexcept;

  Statement& bind(int i, int64_t v);
  Statement& bind(int i, double v);
  Statement& bind(int i, const std::string& v);
  Statement& bind_null(int i);
  // Binds `values` to parameters 1, 2, ... in order (int64_t, double or
  // std::string each, as bind takes them).
  template <class... Values>
  Statement& bind_all(const Values&... values) {
    int i = 0;
    (bind(++i, values), ...);
    return *this;
  }
  // Parameter i takes column col of another statement's current row, of
  // whatever type it holds (a row copied between databases unchanged).
  Statement& bind_column(int i, const Statement& from, int col);
  bool step();  // true while a row is available
  void run();   // step to completion
  void reset();

  int64_t integer(int col) const;
  double real(int col) const;
  std::string text(int col) const;
  bool is_null(int col) const;
  int columns() const;
  std::string column_name(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string file_;
  std::string sql_;  // its start, for messages
};

enum class OpenMode {
  // Creates the file, switches it to WAL, 60 s busy timeout: `chiar run`
  // (through Store) and test fixtures.
  ReadWrite,
  // Changes nothing on disk: no journal-mode switch, and no -wal or -shm file
  // is created next to a database that has none (it is then opened
  // immutable: no writer holds it). Refuses a missing file.
  ReadOnly,
};

class Database {
 public:
  explicit Database(const std::string& file, OpenMode mode = OpenMode::ReadWrite);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  void exec(const std::string& sql);
  Statement prepare(const std::string& sql) { return Statement(db_, sql, file_); }
  int64_t last_insert_id() const { return sqlite3_last_insert_rowid(db_); }
  const std::string& file() const { return file_; }
  OpenMode mode() const { return mode_; }
  // The primary result code of the connection's latest failure (SQLITE_NOTADB...).
  int last_error() const { return sqlite3_errcode(db_) & 0xff; }

  // BEGIN IMMEDIATE ... COMMIT, rolled back if the body or the commit throws.
  // IMMEDIATE takes the write lock up front, under the busy timeout: a read
  // transaction upgraded to a write later would fail at once when another
  // process wrote in between (WAL's SQLITE_BUSY_SNAPSHOT).
  template <class F>
  void transaction(F&& body) {
    exec("BEGIN IMMEDIATE");
    try {
      body();
      failpoint("store.commit");  // a crash here must lose the transaction, nothing else
      exec("COMMIT");
    } catch (...) {
      rollback_quietly();
      throw;
    }
  }

 private:
  void open_read_write();
  void open_read_only();
  void switch_to_wal();
  void rollback_quietly() noexcept;

  sqlite3* db_ = nullptr;
  std::string file_;
  OpenMode mode_;
};

}  // namespace chiar::engine
