#include "support/synthetic_store.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include <boost/filesystem.hpp>

#include "engine/store/store.h"

namespace chiar::test {
namespace {

struct TaskShape {
  const char* name;
  const char* family;
  bool language_model;
  int64_t classes;  // classification only
};

const TaskShape kTasks[] = {
    {"listops_flat", "discrete rule following", false, 10},
    {"wikitext2", "small dataset", true, 0},
    {"imdb_bpe", "movie-review sentiment", false, 2},
    {"sotu_words", "large natural text", true, 0},
};
constexpr int64_t kTaskCount = sizeof kTasks / sizeof *kTasks;
constexpr int64_t kTokensPerSequence = 256;

const char* const kBaseVariants[] = {"baseline", "chiar_dct_attn", "chiar_threshold3", "chiar_soft", "chiar_hard"};
constexpr int64_t kBaseVariantCount = sizeof kBaseVariants / sizeof *kBaseVariants;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One run of the sweep, from its index alone: a shard and the whole store
// write the same rows for the same index.
struct SyntheticRun {
  int64_t index = 0;
  const TaskShape* task = nullptr;
  std::string variant;
  int64_t seed = 0;
  bool attention_only = false;  // the baseline: attention in every layer
  bool routed = false;          // middle layers choose among operators
  bool three_way = false;       // attention, dct and rbf (else attention and dct)
  std::string status = "done";
  std::string hash;
  double quality = 0;  // the variant's offset on the task's metric scale
};

SyntheticRun describe_run(int64_t index, const SyntheticStoreShape& shape) {
  SyntheticRun r;
  r.index = index;
  r.task = &kTasks[index % kTaskCount];
  r.seed = (index / kTaskCount) % shape.seeds;
  const int64_t v = index / (kTaskCount * shape.seeds);
  r.variant = v < kBaseVariantCount ? std::string(kBaseVariants[v]) : "chiar_threshold3_s" + std::to_string(v);
  r.attention_only = v == 0;
  r.routed = v != 0;
  r.three_way = v >= 2;
  const uint64_t h = splitmix64(static_cast<uint64_t>(index) ^ splitmix64(shape.seed));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  r.hash = hex;
  const uint64_t fate = splitmix64(h) % 1000;
  r.status = fate < 10 ? "failed" : fate < 15 ? "diverged" : "done";
  r.quality = static_cast<double>(splitmix64(h ^ 0x5eed) % 1000) / 1000.0 - 0.5;
  return r;
}

// The run's metric at a step: accuracy rises, perplexity falls.
struct Curve {
  const SyntheticRun& run;
  std::mt19937_64& rng;
  double at(int64_t step, int64_t steps) {
    std::normal_distribution<double> noise(0.0, 0.01);
    const double progress = 1.0 - std::exp(-3.0 * static_cast<double>(step) / static_cast<double>(steps));
    if (run.task->language_model)
      return std::exp(std::log(8000.0) - progress * (std::log(8000.0) - std::log(180.0 + 20.0 * run.quality)) +
                      noise(rng));
    const double chance = 1.0 / static_cast<double>(run.task->classes);
    return std::clamp(chance + progress * (0.85 + 0.05 * run.quality - chance) + noise(rng), 0.0, 1.0);
  }
};

class Writer {
 public:
  Writer(engine::Database& db, const SyntheticStoreShape& shape)
      : shape_(shape),
        run_(db.prepare(
            "INSERT INTO runs(hash, name, matrix, variant, task, seed, spec, status, error, diverged_step, step, "
            "created_at, started_at, finished_at, heartbeat, host, pid, git_commit, git_dirty, torch_version, blas, "
            "gemm_gflops, threads, device, cpu, build_type, allocator, params, train_seconds, train_tokens_per_s, "
            "eval_tokens_per_s, step_ms, peak_rss_mb, tau, calibration, spec_toml, overhead_fraction, overhead, gemm, "
            "task_family, processes) VALUES (?, ?, 'sweep', ?, ?, ?, ?, ?, ?, ?, ?, '2026-12-01T08:00:00Z', "
            "'2026-12-01T08:00:05Z', '2026-12-01T08:04:05Z', 1764576245.0, 'node017', 4242, "
            "'0123456789abcdef0123456789abcdef01234567', 0, '2.1.2', 'OpenBLAS 0.3.21', 180.5, 2, 'cpu', "
            "'AMD EPYC', 'Release', 'glibc', ?, 240.0, ?, ?, ?, 812.0, ?, ?, ?, 0.004, "
            "'{\"steps_s\": 238.1, \"store_s\": 0.6}', 'onednn: oneDNN 2.6.3 sgemm', ?, 1)")),
        metric_(db.prepare("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)")),
        log_(db.prepare("INSERT INTO train_log VALUES (?, ?, ?, ?, ?)")),
        flops_(db.prepare("INSERT INTO flops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")),
        reference_(db.prepare("INSERT INTO flops_reference VALUES (?, ?, ?)")),
        routing_(db.prepare("INSERT INTO routing VALUES (?, ?, ?, ?, ?)")),
        histogram_(db.prepare("INSERT INTO histograms VALUES (?, ?, ?, ?, ?, ?, ?)")),
        db_(db) {}

  void write(const SyntheticRun& r) {
    std::mt19937_64 rng(splitmix64(std::hash<std::string>{}(r.hash)));
    const int64_t last = r.status == "diverged" ? shape_.steps / 2
                         : r.status == "failed" ? shape_.steps / 4
                                                : shape_.steps;
    const int64_t id = insert_run(r, last, rng);
    Curve curve{r, rng};
    std::normal_distribution<double> noise(0.0, 0.02);
    for (int64_t step = shape_.log_every; step <= last; step += shape_.log_every) {
      const double progress = static_cast<double>(step) / static_cast<double>(shape_.steps);
      const double loss = (r.task->language_model ? 5.2 : 0.4) + 3.0 * std::exp(-4.0 * progress) + noise(rng);
      log_.bind_all(id, step, loss, 2e-3 * (1.0 - 0.9 * progress), 10500.0);
      run_statement(log_);
    }
    for (int64_t step = shape_.eval_every; step <= last; step += shape_.eval_every) {
      metrics(r, id, step, "valid", "current", curve.at(step, shape_.steps), rng);
      flops(r, id, step, rng);
      if (r.routed) routing(r, id, step, rng);
    }
    if (r.status != "done") return;
    metrics(r, id, last, "test", "best", curve.at(last, shape_.steps), rng);
    metrics(r, id, last, "test", "last", curve.at(last, shape_.steps), rng);
  }

 private:
  static void run_statement(engine::Statement& s) {
    s.run();
    s.reset();
  }

  int64_t insert_run(const SyntheticRun& r, int64_t last, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> speed(9000.0, 12000.0);
    const std::string name = r.variant + "/" + r.task->name + "/seed=" + std::to_string(r.seed);
    // About the size of a real resolved spec (1.3 kB).
    std::string spec = "{\"matrix\": \"sweep\", \"variant\": \"" + r.variant + "\", \"task\": \"" + r.task->name +
                       "\", \"seed\": " + std::to_string(r.seed) + ", \"model\": {";
    while (spec.size() < 1300) spec += "\"option_" + std::to_string(spec.size()) + "\": 0.5, ";
    spec += "\"end\": 0}}";
    const std::string tau = r.routed ? "{\"layer2\": [0.80, 0.83], \"layer3\": [0.80, 0.835]}" : std::string("{}");
    run_.bind_all(r.hash, name, r.variant, std::string(r.task->name), r.seed, spec, r.status);
    if (r.status == "failed")
      run_.bind(8, std::string("chiar: synthetic failure: the node's disk filled up"));
    else
      run_.bind_null(8);
    if (r.status == "diverged")
      run_.bind(9, last);
    else
      run_.bind_null(9);
    const double tps = speed(rng);
    run_.bind(10, last)
        .bind(11, int64_t{3'400'000})
        .bind(12, tps)
        .bind(13, 3.0 * tps)
        .bind(14, 1000.0 * 8 * kTokensPerSequence / tps)
        .bind(15, tau)
        .bind(16, std::string(r.routed ? "{\"batches\": 4, \"tokens\": 1016}" : ""))
        .bind(17, spec)
        .bind(18, std::string(r.task->family));
    run_statement(run_);
    return db_.last_insert_id();
  }

  void metric(int64_t id, int64_t step, const char* split, const char* checkpoint, const std::string& name,
              double value) {
    metric_.bind_all(id, step, std::string(split), std::string(checkpoint), name, value);
    run_statement(metric_);
  }

  // The names a task of this kind records (engine/training/trainer.cpp's evaluations).
  void metrics(const SyntheticRun& r, int64_t id, int64_t step, const char* split, const char* checkpoint, double value,
               std::mt19937_64& rng) {
    const TaskShape& t = *r.task;
    metric(id, step, split, checkpoint, "full_split", 1.0);
    if (t.language_model) {
      const double tokens = 240000, nll = tokens * std::log(value);
      metric(id, step, split, checkpoint, "token_ppl", value);
      metric(id, step, split, checkpoint, "nll", nll);
      metric(id, step, split, checkpoint, "tokens", tokens);
      metric(id, step, split, checkpoint, "word_ppl", value * 1.3);
      metric(id, step, split, checkpoint, "bits_per_byte", std::log2(value) / 5.6);
      return;
    }
    std::uniform_real_distribution<double> spread(-0.05, 0.05);
    metric(id, step, split, checkpoint, "accuracy", value);
    metric(id, step, split, checkpoint, "examples", 2000);
    metric(id, step, split, checkpoint, "loss", -std::log(std::max(value, 1e-3)));
    metric(id, step, split, checkpoint, "majority_rate", 1.0 / static_cast<double>(t.classes));
    for (int64_t k = 0; k < t.classes; ++k)
      metric(id, step, split, checkpoint, "accuracy_class_" + std::to_string(k),
             std::clamp(value + spread(rng), 0.0, 1.0));
  }

  // Per layer and operator, FLOPs per sequence: the head, then each layer's mixers and FFN.
  void flops(const SyntheticRun& r, int64_t id, int64_t step, std::mt19937_64& rng) {
    const double T = kTokensPerSequence;
    const auto row = [&](int64_t layer, const std::string& op, double tokens, double per_token) {
      // As the in-tree plugins' traits flag them: attention counts as attention.
      flops_.bind_all(id, step, layer, op, tokens, tokens * per_token, tokens * per_token, 3 * tokens * per_token,
                      3 * tokens * per_token, int64_t{op == "attention"});
      run_statement(flops_);
    };
    std::uniform_real_distribution<double> share(0.2, 0.5);
    row(-1, "head", T, 4.2e6);
    for (int64_t layer = 0; layer < shape_.layers; ++layer) {
      const bool middle = layer > 0 && layer + 1 < shape_.layers;
      if (r.attention_only || layer + 1 == shape_.layers) {
        row(layer, "attention", T, 1.6e5);
      } else if (!middle) {
        row(layer, "dct", T, 2.0e4);
      } else {
        const double attention = share(rng) * T;
        row(layer, "router", T, 8.0e3);
        row(layer, "attention", attention, 1.6e5);
        if (r.three_way) {
          row(layer, "dct", (T - attention) / 2, 2.0e4);
          row(layer, "rbf", (T - attention) / 2, 2.2e5);
        } else {
          row(layer, "dct", T - attention, 2.0e4);
        }
      }
      row(layer, "ffn", T, 6.8e5);
    }
    reference_.bind_all(id, step, static_cast<double>(shape_.layers) * T * 1.6e5);
    run_statement(reference_);
  }

  void routing(const SyntheticRun& r, int64_t id, int64_t step, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int64_t layer = 1; layer + 1 < shape_.layers; ++layer) {
      const double attention = 0.2 + 0.3 * unit(rng);
      std::vector<std::pair<std::string, double>> shares{{"attention", attention}};
      if (r.three_way)
        shares.insert(shares.end(), {{"dct", (1 - attention) / 2}, {"rbf", (1 - attention) / 2}});
      else
        shares.emplace_back("dct", 1 - attention);
      for (const auto& [op, s] : shares) {
        routing_.bind_all(id, step, layer, op, s);
        run_statement(routing_);
      }
      const double width = 1.0 / static_cast<double>(shape_.histogram_bins);
      for (int64_t b = 0; b < shape_.histogram_bins; ++b) {
        const double centre = (static_cast<double>(b) + 0.5) * width;
        const auto count = static_cast<int64_t>(4000.0 * std::exp(-50.0 * (centre - 0.8) * (centre - 0.8)));
        histogram_.bind_all(id, step, layer, b, b * width, (b + 1) * width, count);
        run_statement(histogram_);
      }
    }
  }

 private:
  const SyntheticStoreShape& shape_;
  engine::Statement run_, metric_, log_, flops_, reference_, routing_, histogram_;
  engine::Database& db_;
};

}  // namespace

void write_synthetic_store(const std::string& file, const SyntheticStoreShape& shape) {
  if (boost::filesystem::exists(file)) throw std::logic_error(file + ": a synthetic store needs a new file");
  if (shape.runs < 0 || shape.seeds < 1 || shape.steps < 1 || shape.log_every < 1 || shape.eval_every < 1 ||
      shape.layers < 3 || shape.histogram_bins < 1)
    throw std::logic_error("synthetic store: a shape needs seeds, steps, intervals and bins >= 1 and 3 layers");
  engine::Store store(file, engine::StoreAccess::ReadWrite);
  engine::Database& db = store.db();
  db.transaction([&] {
    Writer writer(db, shape);
    for (int64_t i = 0; i < shape.runs; ++i) {
      writer.write(describe_run(shape.first_run + i, shape));
    }
  });
}

int64_t synthetic_done_runs(const SyntheticStoreShape& shape) {
  int64_t done = 0;
  for (int64_t i = 0; i < shape.runs; ++i) done += describe_run(shape.first_run + i, shape).status == "done";
  return done;
}

}  // namespace chiar::test
