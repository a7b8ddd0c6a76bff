#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/run_spec.h"

namespace chiar::engine {

struct MatrixOptions {
  std::vector<std::string> set;          // --set key=value: model.X, train.X, task.X, router.X
  std::string only;                      // glob on run names; empty = all
  int shard_index = 1, shard_count = 1;  // --shard K/N
  // --device, and whether the runs train in a data-parallel process group:
  // they decide what precision "auto" is (engine/runtime/device.h), and so the hash.
  std::string device;
  bool host_only = false;
};

struct MatrixSources;  // the matrix's files as parsed, with source positions, and its --set keys

struct Matrix {
  std::string name;
  std::string file;
  std::vector<RunSpec> runs;                 // expansion order: variant, task, sweep point, seed
  std::map<std::string, std::string> where;  // "variants.X" / "tasks.X" -> "file:line:column"
  std::shared_ptr<const MatrixSources> sources;

  // Where `run`'s value of the option at `path` ("train.steps", "model.layers",
  // "task.n_train") was set, as an error's prefix, in the order the matrix
  // applies values, last first: "--set train.steps"; else its sweep axis, the
  // task's table, the variant's, then [train] or [model], in whichever of the
  // files holds it ("m.toml:14:9: key 'variants.fast.train.lr'"); "" for a
  // default.
  std::string origin_of(const RunSpec& run, const std::string& path) const;
};

// Reads a matrix file (and its includes), expands and resolves every run.
// Every error is a UserError at file:line:column naming the key path, with a
// suggestion for a misspelt key.
Matrix load_matrix(const std::string& file, const MatrixOptions& options = {});

// Every [model] and [train] option a matrix may set: key, kind, default and
// meaning, as Markdown tables (`chiar options`, docs/options.md).
std::string options_reference();

// Text for a Markdown table cell: a '|' inside one would end it.
std::string markdown_cell(const std::string& text);

// A run back from its resolved TOML (as the store keeps it), e.g. to rebuild
// its model for inspection.
RunSpec run_spec_from_toml(const std::string& text);

}  // namespace chiar::engine
