#pragma once
// A thin RAII layer over the SQLite C API: one connection, prepared
// statements with positional binding, errors as UserError naming the file.
#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>


namespace chiar::engine {

class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql, const std::string& file);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, int64_t v);
  Statement& bind(int i, double v);
  Statement& bind(int i, const std::string& v);
  Statement& bind_null(int i);
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
};

class Database {
 public:
  explicit Database(const std::string& file);  // creates the file; WAL; 60 s busy timeout
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  void exec(const std::string& sql);
  Statement prepare(const std::string& sql) { return Statement(db_, sql, file_); }
  int64_t last_insert_id() const { return sqlite3_last_insert_rowid(db_); }
  const std::string& file() const { return file_; }

  // BEGIN IMMEDIATE ... COMMIT, rolled back if the body throws.
  template <class F>
  void transaction(F&& body) {
    exec("BEGIN IMMEDIATE");
    try {
      body();
    } catch (...) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
    exec("COMMIT");
  }

 private:
  sqlite3* db_ = nullptr;
  std::string file_;
};

}  // namespace chiar::engine
