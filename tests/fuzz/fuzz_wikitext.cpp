// WikiText reader: the wikitext task itself (tasks/wikitext, included below
// so its reader is reachable without loading the plugin), over
// core/text_io.cpp, core/tokenizer.cpp and core/lm_data.cpp. The input is
// split on "-----" lines into options ("key=value" lines: seq_len,
// eval_stride, batching, valid_fraction, tokenizer word|bytes, min_count,
// max_vocab, batch), then the train, valid and test files. Numbers are clamped
// to small values so one input stays fast; the boundaries (0, negative,
// eval_stride > seq_len) stay reachable. After reading, every split's stats,
// a few training batches and every evaluation batch are drawn. Bad input
// must surface as chiar::UserError.
#include "../../tasks/wikitext/wikitext_task.cpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "fuzz_support.h"

namespace {

int64_t clamped(const std::string& text, int64_t lo, int64_t hi) {
  return std::clamp<int64_t>(std::strtoll(text.c_str(), nullptr, 10), lo, hi);
}

chiar::Params options_of(const std::string& text, int64_t& batch) {
  chiar::Params p;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "seq_len" || key == "eval_stride")
      p.set(key, clamped(value, -2, 40));
    else if (key == "min_count" || key == "max_vocab")
      p.set(key, clamped(value, -2, 40));
    else if (key == "batch")
      batch = clamped(value, 1, 5);
    else if (key == "valid_fraction")
      p.set(key, std::strtod(value.c_str(), nullptr));
    else if (key == "batching")
      p.set(key, value);
    else if (key == "tokenizer" && (value == "word" || value == "bytes"))
      p.set(key, value);
  }
  return p;
}

void draw_batches(const chiar::Task& task, int64_t batch) {
  for (const auto& split : task.splits()) task.stats(split);
  for (int64_t step = 0; step < 3; ++step) {
    const chiar::Batch b = task.train_batch(7, step, batch);
    if (b.tokens.size(0) != batch || b.tokens.size(1) != task.seq_len())
      chiar::fuzz::contract_broken("a training batch has the wrong shape");
  }
  for (const auto& split : task.splits()) {
    const int64_t n = task.eval_batch_count(split, batch);
    for (int64_t i = 0; i < std::min<int64_t>(n, 64); ++i) task.eval_batch(split, i, batch);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chiar;
  const auto parts = fuzz::split_parts(std::string(reinterpret_cast<const char*>(data), size), 4);
  const std::string& dir = fuzz::scratch().fresh_dir();
  int64_t batch = 2;
  TaskSpec spec;
  spec.params = options_of(parts[0], batch);
  spec.params.set("path", dir).set("files", "{split}.txt");
  spec.cache_dir = dir + "/cache";
  const char* names[] = {"train", "valid", "test"};
  for (size_t i = 0; i < 3; ++i)
    fuzz::write_file(dir + "/" + names[i] + ".txt", i + 1 < parts.size() ? parts[i + 1] : std::string());
  try {
    WikiTextTask task(spec);
    draw_batches(task, batch);
  } catch (const UserError&) {
  }
  return 0;
}
