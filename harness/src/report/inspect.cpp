#include "inspect.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>

#include <boost/filesystem.hpp>

#include "engine/config/matrix.h"
#include "engine/store/results.h"
#include "engine/training/durable_file.h"
#include "engine/training/trainer.h"
#include "chiar/error.h"

namespace chiar::report {
namespace {

// The newest <kind>-<step>.pt in a checkpoint folder (no store to vouch for
// one), or a schema-4 run's <kind>.pt.
std::string newest_in_folder(const boost::filesystem::path& folder, const std::string& kind) {
  std::string newest = (folder / (kind + ".pt")).string();
  int64_t newest_step = -1;
  boost::system::error_code ec;
  for (boost::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string prefix = kind + "-";
    if (name.size() <= prefix.size() + 3 || name.compare(0, prefix.size(), prefix) != 0 ||
        it->path().extension() != ".pt")
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 3);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
    if (const int64_t step = std::stoll(digits); step > newest_step) {
      newest_step = step;
      newest = it->path().string();
    }
  }
  return newest;
}

// The newest recorded checkpoint of a run that verifies (a corrupt one is
// reported on stderr and passed over), or "" when the store records none.
std::string newest_recorded(engine::ResultsReader& store, const std::string& hash, const std::string& kind) {
  for (const auto& c : store.checkpoints(hash, kind)) {
    try {
      engine::read_verified(c.file, c.bytes, c.checksum);
      return c.file;
    } catch (const engine::CorruptCheckpoint& e) {
      std::cerr << "warning: " << e.what() << "; trying an older checkpoint\n";
    }
  }
  return "";
}

// A checkpoint named directly (a .pt file or a checkpoint folder) is verified
// against the store beside its folder, <db>.checkpoints/<hash>/, when that
// store records it: libtorch 1.13 can crash on a damaged archive
// (tests/fuzz/crashes/checkpoint), so only verified bytes should reach it.
// Without such a record the file is loaded as it is, with a warning.
void verify_named_checkpoint(const std::string& file) {
  const boost::filesystem::path folder = boost::filesystem::absolute(file).parent_path();
  const std::string parent = folder.parent_path().string();
  const std::string suffix = ".checkpoints";
  const bool in_store_layout =
      parent.size() > suffix.size() && parent.compare(parent.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string db = in_store_layout ? parent.substr(0, parent.size() - suffix.size()) : "";
  if (!db.empty() && boost::filesystem::exists(db)) {
    if (const auto record = engine::recorded_checkpoint(db, file)) {
      try {
        engine::read_verified(file, record->bytes, record->checksum);
      } catch (const engine::CorruptCheckpoint& e) {
        throw UserError(e.what());
      }
      return;
    }
  }
  std::cerr << "warning: " << file << ": no store records this checkpoint; loading it unverified\n";
}

}  // namespace

Inspector::Inspector(const PluginRegistry& registry, const InspectOptions& o) {
  if (!boost::filesystem::exists(o.db)) throw UserError(o.db + ": no such database or checkpoint");
  // A checkpoint: its folder (or a .pt file in it) holds spec.toml.
  const boost::filesystem::path given(o.db);
  const boost::filesystem::path folder = boost::filesystem::is_directory(given) ? given : given.parent_path();
  const bool named_checkpoint = boost::filesystem::exists(folder / "spec.toml") && given.extension() != ".db";
  if (named_checkpoint) {
    std::ifstream in((folder / "spec.toml").string());
    spec_ = engine::run_spec_from_toml(std::string((std::istreambuf_iterator<char>(in)), {}));
    checkpoint_ = boost::filesystem::is_directory(given)
                      ? newest_in_folder(folder, o.checkpoint == "last" ? "state" : "best")
                      : given.string();
  } else {
    load_from_store(o);
  }
  if (!boost::filesystem::exists(checkpoint_)) throw UserError("no checkpoint " + checkpoint_);
  TaskSpec ts;
  ts.params = spec_.task_config.params;
  ts.data_root = o.data_root;
  ts.cache_dir = o.cache_dir;
  task_ = registry.make_task(spec_.task_config.plugin, ts);
  model_ = std::make_shared<model::ChiarModel>(registry, engine::model_options_for(spec_, *task_));
  if (named_checkpoint) verify_named_checkpoint(checkpoint_);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(checkpoint_, at::Device(at::kCPU));  // inspection runs on the CPU, wherever it trained
    model_->load(archive);
  } catch (const std::exception& e) {  // c10::Error, or a plain runtime_error on some damage
    if (is_out_of_memory(e)) throw;    // the machine's failure, not the file's (exit 3)
    throw UserError(checkpoint_ + ": not a checkpoint of this run's model: " + message_of(e));
  }
  model_->eval();
}

void Inspector::load_from_store(const InspectOptions& o) {
  if (o.run.empty()) throw UserError(o.db + ": a database needs --run (id, name or hash; `chiar show` lists them)");
  engine::ResultsReader store(o.db);  // refuses a database that is not a store
  const auto run = store.find_run(o.run);
  if (!run) throw UserError(o.db + ": no run '" + o.run + "' (give its id, name or hash; `chiar show` lists them)");
  const std::string &hash = run->hash, &status = run->status, &toml = run->spec_toml;
  if (toml.empty()) throw UserError(o.db + ": run '" + o.run + "' has no stored spec");
  spec_ = engine::run_spec_from_toml(toml);
  if (o.checkpoint != "best" && o.checkpoint != "last")
    throw UserError("--checkpoint: expected best or last, found '" + o.checkpoint + "'");
  const std::string dir = boost::filesystem::absolute(o.db).string() + ".checkpoints/" + hash;
  checkpoint_ = newest_recorded(store, hash, o.checkpoint == "best" ? "best" : "state");
  if (checkpoint_.empty()) checkpoint_ = dir + (o.checkpoint == "best" ? "/best.pt" : "/state.pt");  // schema 4
  if (!boost::filesystem::exists(checkpoint_))
    throw UserError("run '" + o.run + "' (" + status + ") has no checkpoint " + checkpoint_);
}

Inspector::~Inspector() = default;

std::vector<std::string> Inspector::global_mixing() const {
  std::vector<std::string> out;
  for (const auto& layer : model_->mixing_layers()) {
    if (!layer->routed()) continue;
    for (size_t k = 0; k < layer->operators().size(); ++k) {
      const std::string& name = layer->operator_names()[k];
      if (layer->operators()[k]->traits().role == OperatorRole::GlobalMixing &&
          std::find(out.begin(), out.end(), name) == out.end())
        out.push_back(name);
    }
  }
  return out;
}

Inspection Inspector::inspect(const std::string& text) {
  at::NoGradGuard no_grad;
  Inspection out;
  for (const auto& layer : model_->mixing_layers())
    if (layer->routed()) {
      out.layers.push_back(static_cast<int64_t>(&layer - &model_->mixing_layers()[0]));
      out.operators.push_back(layer->operator_names());
      out.roles.emplace_back();
      for (const auto& op : layer->operators()) out.roles.back().push_back(op->traits().role);
    }
  const auto ids = task_->encode(text);
  const auto T = static_cast<size_t>(task_->seq_len());
  for (size_t start = 0; start < ids.size(); start += T) {
    const size_t n = std::min(T, ids.size() - start);
    auto tokens = at::tensor(std::vector<int64_t>(ids.begin() + start, ids.begin() + start + n),
                             at::TensorOptions().dtype(at::kLong))
                      .view({1, -1});
    const auto result = model_->forward(tokens);
    for (size_t i = 0; i < n; ++i) {
      TokenRoute t;
      t.id = ids[start + i];
      t.text = task_->token_text(t.id);
      for (const auto& r : result.routing) {
        t.entropy.push_back(r.entropy[0][static_cast<int64_t>(i)].item<double>());
        t.route.push_back(r.choice[0][static_cast<int64_t>(i)].item<int64_t>());
      }
      out.tokens.push_back(std::move(t));
    }
  }
  return out;
}

std::pair<std::vector<TokenRate>, std::vector<TokenRate>> Inspector::corpus(const std::vector<std::string>& lines,
                                                                            int64_t max_tokens, int64_t top,
                                                                            int64_t min_count) {
  std::string text;
  int64_t words = 0;
  for (const auto& line : lines) {
    text += line + "\n";
    words += static_cast<int64_t>(std::count(line.begin(), line.end(), ' ')) + 1;
    if (words >= max_tokens) break;
  }
  const Inspection all = inspect(text);
  std::map<int64_t, TokenRate> rates;
  for (const auto& t : all.tokens) {
    auto& r = rates[t.id];
    r.text = t.text;
    ++r.count;
    double to_global = 0;
    for (size_t l = 0; l < t.route.size(); ++l) to_global += all.roles[l][t.route[l]] == OperatorRole::GlobalMixing;
    r.global += t.route.empty() ? 0 : to_global / static_cast<double>(t.route.size());
  }
  std::vector<TokenRate> frequent;
  for (auto& [id, r] : rates)
    if (r.count >= min_count) {
      r.global /= static_cast<double>(r.count);
      frequent.push_back(r);
    }
  std::sort(frequent.begin(), frequent.end(), [](const TokenRate& a, const TokenRate& b) {
    return a.global != b.global ? a.global > b.global : a.count > b.count;
  });
  const auto k = static_cast<size_t>(std::min<int64_t>(top, static_cast<int64_t>(frequent.size())));
  std::vector<TokenRate> most(frequent.begin(), frequent.begin() + k);
  std::vector<TokenRate> least(frequent.rbegin(), frequent.rbegin() + k);
  return {most, least};
}

}  // namespace chiar::report
