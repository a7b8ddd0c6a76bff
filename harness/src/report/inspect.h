#pragma once
// Per-token spectral entropy and route of a finished run, from its store and
// checkpoint: what `chiar inspect` shows.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "chiar/registry.h"
#include "engine/config/run_spec.h"
#include "chiar/task.h"

namespace chiar::report {

struct InspectOptions {
  std::string db;                   // a results database, or a run's checkpoint folder or .pt file
  std::string run;                  // with a database: run id, name or hash
  std::string checkpoint = "best";  // "best" (best validation) or "last"
  std::string data_root, cache_dir;
};

struct TokenRoute {
  int64_t id = 0;
  std::string text;
  std::vector<double> entropy;  // per routed layer
  std::vector<int64_t> route;   // operator index per routed layer
};

struct Inspection {
  std::vector<int64_t> layers;                      // routed layer indices (0-based)
  std::vector<std::vector<std::string>> operators;  // per routed layer, by index
  std::vector<std::vector<OperatorRole>> roles;     // the same, their traits' roles
  std::vector<TokenRoute> tokens;
};

struct TokenRate {
  std::string text;
  int64_t count = 0;
  double global = 0;  // share of its occurrences sent to a GlobalMixing operator, over routed layers
};

class Inspector {
 public:
  Inspector(const PluginRegistry& registry, const InspectOptions& options);
  ~Inspector();
  // Routes of every token of text, in windows of the task's sequence length.
  Inspection inspect(const std::string& text);
  // Over a corpus sample: the tokens most and least often sent to a
  // GlobalMixing operator (tokens seen at least min_count times).
  std::pair<std::vector<TokenRate>, std::vector<TokenRate>> corpus(const std::vector<std::string>& lines,
                                                                   int64_t max_tokens, int64_t top, int64_t min_count);
  // The registered names of the routed layers' GlobalMixing operators, once each.
  std::vector<std::string> global_mixing() const;
  const engine::RunSpec& spec() const { return spec_; }
  const std::string& checkpoint_file() const { return checkpoint_; }

 private:
  void load_from_store(const InspectOptions& o);  // spec and checkpoint of a run in a database

  engine::RunSpec spec_;
  std::shared_ptr<Task> task_;
  std::shared_ptr<model::ChiarModel> model_;
  std::string checkpoint_;
};

}  // namespace chiar::report
