// chiar_store_scale: how the store's commands grow with the number of runs.
// Writes synthetic stores (support/synthetic_store.h) of each size, times
// `chiar show`, `chiar export --csv` and `chiar report` on them as child
// processes (wall clock and peak resident set), then merges shard stores into
// one twice (the repeat must add nothing) and prints a Markdown table.
//
//   chiar_store_scale [--sizes 100,1000,10000] [--shards 100] [--shard-runs 100] [--work DIR]
//
// A benchmark, not a test: nothing here has a time limit. The figures are in
// docs/performance.md.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/filesystem.hpp>

#include "support/faults.h"
#include "support/process.h"
#include "support/synthetic_store.h"
#include "support/temp_dir.h"

namespace fs = boost::filesystem;
using chiar::test::Measured;
using chiar::test::read_text;

namespace {

struct Options {
  std::vector<int64_t> sizes{100, 1000, 10000};
  int64_t shards = 100, shard_runs = 100;
  std::string work;  // a temporary folder when empty
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "chiar_store_scale: " << why
            << "\nusage: chiar_store_scale [--sizes 100,1000,10000] [--shards 100] [--shard-runs 100] [--work DIR]\n";
  std::exit(2);
}

int64_t positive(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1) usage(flag + " takes positive whole numbers, not '" + text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--sizes") {
      o.sizes.clear();
      std::stringstream items(value);
      for (std::string item; std::getline(items, item, ',');) o.sizes.push_back(positive(item, flag));
    } else if (flag == "--shards") {
      o.shards = positive(value, flag);
    } else if (flag == "--shard-runs") {
      o.shard_runs = positive(value, flag);
    } else if (flag == "--work") {
      o.work = value;
    } else {
      usage("unknown option " + flag);
    }
  }
  return o;
}

double megabytes(const std::string& file) { return static_cast<double>(fs::file_size(file)) / (1024.0 * 1024.0); }

// Runs one command; a failure ends the benchmark with its log.
Measured measured(const std::vector<std::string>& args, const std::string& log) {
  const Measured m = chiar::test::run_chiar_measured(args, log);
  if (m.status != 0) {
    std::cerr << "chiar_store_scale: `chiar";
    for (const auto& a : args) std::cerr << ' ' << a;
    std::cerr << "` exited " << m.status << ":\n" << read_text(log);
    std::exit(1);
  }
  return m;
}

std::string cell(const Measured& m) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f s, %.0f MB", m.seconds, m.peak_rss_mb);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void measure_size(const std::string& dir, int64_t runs, const std::string& claims) {
  const std::string db = dir + "/store-" + std::to_string(runs) + ".db";
  chiar::test::SyntheticStoreShape shape;
  shape.runs = runs;
  const auto start = std::chrono::steady_clock::now();
  chiar::test::write_synthetic_store(db, shape);
  const double written = seconds_since(start);
  const std::string log = dir + "/command.log";
  const Measured show = measured({"show", db}, log);
  const Measured csv = measured({"export", db, "--csv", "--out", dir + "/results.csv"}, log);
  const Measured report =
      measured({"report", db, "--claims", claims, "--out", dir + "/report-" + std::to_string(runs)}, log);
  char size[32];
  std::snprintf(size, sizeof size, "%.0f MB", megabytes(db));
  std::cout << "| " << runs << " | " << size << " (" << static_cast<int>(written + 0.5) << " s to write) | "
            << cell(show) << " | " << cell(csv) << " | " << cell(report) << " |" << std::endl;
}

void measure_merge(const std::string& dir, int64_t shards, int64_t shard_runs) {
  const std::string folder = dir + "/shards";
  fs::create_directories(folder);
  for (int64_t k = 0; k < shards; ++k) {
    chiar::test::SyntheticStoreShape shape;
    shape.runs = shard_runs;
    shape.first_run = k * shard_runs;
    chiar::test::write_synthetic_store(folder + "/shard-" + std::to_string(k) + ".db", shape);
  }
  const std::string out = dir + "/merged.db", log = dir + "/merge.log";
  const Measured first = measured({"merge", out, folder}, log);
  const std::string first_said = read_text(log);
  const Measured again = measured({"merge", out, folder}, log);
  const std::string again_said = read_text(log);
  const auto last_line = [](std::string s) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
  };
  std::cout << "\n| merge of " << shards << " shard stores of " << shard_runs << " runs | time, peak RSS | it said |\n"
            << "|---|---|---|\n"
            << "| into a new store | " << cell(first) << " | " << last_line(first_said) << " |\n"
            << "| again, into the merged store | " << cell(again) << " | " << last_line(again_said) << " |"
            << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::unique_ptr<chiar::test::TempDir> temp;
  std::string dir = o.work;
  if (dir.empty()) {
    temp = std::make_unique<chiar::test::TempDir>("store-scale");
    dir = temp->path();
  }
  fs::create_directories(dir);
  const std::string claims = std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml";
  std::cout << "| runs | store | chiar show | chiar export --csv | chiar report |\n|---|---|---|---|---|" << std::endl;
  for (int64_t runs : o.sizes) measure_size(dir, runs, claims);
  measure_merge(dir, o.shards, o.shard_runs);
  return 0;
}
