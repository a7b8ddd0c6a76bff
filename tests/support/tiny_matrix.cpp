#include "tiny_matrix.h"

#include "engine/store/sqlite.h"

namespace chiar::test {

const std::string kTinyModelTable = "[model]\nd_model = 16\nn_heads = 2\n";

const std::string kTinyBaseVariant = R"([variants.base]
layers = ["attn", "attn"]
)";

const std::string kTinyRoutedVariant = R"([variants.routed]
layers = ["dct", "dct|attn"]
router = "threshold"
router_params = { shares = [0.5, 0.5] }
)";

const std::string kTinyLmTask = R"([tasks.lm]
plugin = "wikitext"
path = "corpus"
seq_len = 8
)";

const std::string kTinyFlatTask = R"([tasks.flat]
plugin = "listops_flat"
n_train = 64
n_valid = 16
n_test = 16
)";

std::string tiny_train_body(int64_t steps, int64_t eval_every, int64_t checkpoint_every) {
  return "steps = " + std::to_string(steps) +
         "\nbatch_size = 4\nwarmup = 2\neval_every = " + std::to_string(eval_every) +
         "\ncheckpoint_every = " + std::to_string(checkpoint_every) +
         "\neval_batch_size = 8\ncalibration_batches = 1\nthreads = 1\n";
}

std::string tiny_train_body() { return tiny_train_body(6, 3, 3); }

void write_tiny_corpus(const TempDir& d) {
  write_word_corpus(d, {"the", "route", "of", "a", "token", "is", "cheap", "or", "not", "dct", "attention", "entropy"},
                    9, 300, 60);
}

void write_tiny_matrix(const TempDir& d, const std::string& matrix_body, const std::string& train_body,
                       const std::string& extra) {
  write_tiny_corpus(d);
  d.write("m.toml", "[matrix]\n" + matrix_body + "\n" + kTinyModelTable + "\n[train]\n" + train_body + "\n" +
                        kTinyBaseVariant + "\n" + kTinyRoutedVariant + "\n" + kTinyLmTask + "\n" + kTinyFlatTask +
                        extra);
}

void write_e2e_matrix(const TempDir& d, const std::string& train_extra, const std::string& extra) {
  write_tiny_matrix(d, R"(name = "e2e"
variants = ["base", "routed"]
tasks = ["lm", "flat"]
seeds = [0, 1]
)",
                    tiny_train_body() + train_extra, extra);
}

void write_one_run_matrix(const TempDir& d, const std::string& name, const std::string& train_body) {
  write_tiny_matrix(d, "name = \"" + name + "\"\nvariants = [\"base\"]\ntasks = [\"flat\"]\nseeds = [0]\n", train_body);
}

std::vector<std::string> tiny_run_args(const TempDir& d, const std::string& db) {
  return {"run", d.path() + "/m.toml", "--db", db, "--data-root", d.path(), "--cache-dir", d.path() + "/cache"};
}

int64_t query_integer(const std::string& db, const std::string& sql) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(sql);
  return q.step() ? q.integer(0) : -1;
}

std::vector<double> test_split_metrics(const std::string& db, const std::string& run_glob) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(
      "SELECT m.value FROM metrics m JOIN runs r ON r.id = m.run_id WHERE r.name GLOB ? AND m.split = 'test' "
      "ORDER BY r.name, m.checkpoint, m.name");
  q.bind(1, run_glob);
  std::vector<double> out;
  while (q.step()) out.push_back(q.real(0));
  return out;
}

std::vector<TrainLogRow> train_logs(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(
      "SELECT r.name, t.step, t.loss, t.lr FROM train_log t JOIN runs r ON r.id = t.run_id "
      "ORDER BY r.name, t.step");
  std::vector<TrainLogRow> rows;
  while (q.step()) rows.push_back({q.text(0), q.integer(1), q.real(2), q.real(3)});
  return rows;
}

std::ostream& operator<<(std::ostream& out, const TrainLogRow& row) {
  const auto precision = out.precision(17);
  out << row.run << " step " << row.step << " loss " << row.loss << " lr " << row.lr;
  out.precision(precision);
  return out;
}

}  // namespace chiar::test
