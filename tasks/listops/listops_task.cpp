// ListOps classification (10 classes). "listops" is Long Range Arena's task:
// read from LRA TSV files (train_file, valid_file, test_file) or generated
// in-process from LRA's parameters (n_train 96000, n_valid 2000, n_test 2000,
// max_depth 10, max_args 10, min_length 500, max_length 2000, data_seed 0).
// "listops_flat" is the easy variant the CHIAR paper trained on: one operator
// over 4..8 digits. Tokens as LRA: parentheses dropped, "]" closes.
#include <ATen/ATen.h>

#include <map>

#include "chiar/class_data.h"
#include "chiar/error.h"
#include "chiar/listops.h"
#include "chiar/plugin.h"
#include "chiar/text_io.h"

namespace {

using namespace chiar;

// <pad> 0, <unk> 1, digits 2..11, operators, "]".
const std::vector<std::string> kVocab = {"<pad>", "<unk>", "0", "1",    "2",    "3",    "4",   "5",     "6",
                                         "7",     "8",     "9", "[MIN", "[MAX", "[MED", "[SM", "[MEAN", "]"};

class ListOpsTask final : public ClassificationTask {
 public:
  ListOpsTask(const TaskSpec& spec, bool flat) : ClassificationTask(flat ? "listops_flat" : "listops"), flat_(flat) {
    const auto& p = spec.params;
    const std::string who = flat ? "listops_flat: " : "listops: ";
    seq_len_ = p.get_int("seq_len", flat ? 32 : 2000);
    if (seq_len_ < 1) throw UserError(who + "seq_len must be positive, found " + std::to_string(seq_len_));
    for (size_t i = 0; i < kVocab.size(); ++i) ids_[kVocab[i]] = static_cast<int64_t>(i);
    std::map<std::string, std::vector<ListOpsExample>> data;
    if (p.has("train_file") || p.has("valid_file") || p.has("test_file")) {
      source_ = "tsv";
      for (const char* split : {"train", "valid", "test"}) {
        const std::string key = std::string(split) + "_file";
        if (!p.has(key))
          throw UserError("listops: reading files needs train_file, valid_file and test_file; " + key + " is missing");
        data[split] = read_listops_tsv(resolve_path(spec.data_root, p.get_string(key, "")));
        if (data[split].empty()) throw UserError("listops: " + key + " has no examples");
      }
    } else {
      const int64_t n_train = p.get_int("n_train", 96000), n_valid = p.get_int("n_valid", 2000),
                    n_test = p.get_int("n_test", 2000);
      for (const auto& [key, n] :
           {std::make_pair("n_train", n_train), std::make_pair("n_valid", n_valid), std::make_pair("n_test", n_test)})
        if (n < 1) throw UserError(who + key + " must be positive, found " + std::to_string(n));
      const auto data_seed = static_cast<uint64_t>(p.get_int("data_seed", 0));
      std::vector<ListOpsExample> all;
      if (flat) {
        all = generate_listops_flat(n_train + n_valid + n_test, data_seed, p.get_int("min_args", 4),
                                    p.get_int("max_args", 8));
        source_ = "generated flat";
      } else {
        ListOpsOptions o;
        o.max_depth = p.get_int("max_depth", o.max_depth);
        o.max_args = p.get_int("max_args", o.max_args);
        o.min_length = p.get_int("min_length", o.min_length);
        o.max_length = p.get_int("max_length", o.max_length);
        all = generate_listops(n_train + n_valid + n_test, data_seed, o);
        source_ = "generated";
      }
      data["train"].assign(all.begin(), all.begin() + n_train);
      data["valid"].assign(all.begin() + n_train, all.begin() + n_train + n_valid);
      data["test"].assign(all.begin() + n_train + n_valid, all.end());
    }
    for (const char* split : {"train", "valid", "test"}) {
      ClassSplit s(split, 10, 0, seq_len_);
      for (const auto& e : data[split]) {
        std::vector<int32_t> ids;
        int64_t unknown = 0;
        for (const auto& t : listops_tokens(e.source)) {
          auto it = ids_.find(t);
          unknown += it == ids_.end();
          ids.push_back(static_cast<int32_t>(it == ids_.end() ? 1 : it->second));
        }
        const auto n = static_cast<int64_t>(ids.size());
        s.add(std::move(ids), e.target, n, static_cast<int64_t>(e.source.size()) + 1, unknown);
      }
      add_split(std::move(s));
    }
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(kVocab.size()); }
  int64_t n_classes() const override { return 10; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t pad_id() const override { return 0; }
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> out;
    for (const auto& t : listops_tokens(text)) {
      auto it = ids_.find(t);
      out.push_back(it == ids_.end() ? 1 : it->second);
    }
    return out;
  }
  std::string token_text(int64_t id) const override { return id >= 0 && id < vocab_size() ? kVocab[id] : "<unk>"; }
  std::string describe() const override {
    return std::string(flat_ ? "listops_flat(" : "listops(") + source_ + ", seq_len " + std::to_string(seq_len_) + ")";
  }

 private:
  bool flat_;
  std::string source_;
  int64_t seq_len_ = 0;
  std::map<std::string, int64_t> ids_;
};

// Every option the constructor reads for one variant, so the harness refuses
// a misspelt or mistyped one before a file is read or an example generated.
std::vector<PluginOption> listops_options(bool flat) {
  const ListOpsOptions lra;
  std::vector<PluginOption> options;
  const auto add = [&](const char* key, ParamKind kind, const std::string& default_value, const char* doc) {
    options.push_back({key, kind, default_value, doc});
  };
  add("train_file", ParamKind::String, "", "an LRA TSV file of training examples (with valid_file and test_file)");
  add("valid_file", ParamKind::String, "", "an LRA TSV file of validation examples");
  add("test_file", ParamKind::String, "", "an LRA TSV file of test examples");
  add("n_train", ParamKind::Int, "96000", "generated training examples");
  add("n_valid", ParamKind::Int, "2000", "generated validation examples");
  add("n_test", ParamKind::Int, "2000", "generated test examples");
  add("data_seed", ParamKind::Int, "0", "seed of the generated examples");
  add("max_args", ParamKind::Int, flat ? "8" : std::to_string(lra.max_args), "the most arguments of an operator");
  add("seq_len", ParamKind::Int, flat ? "32" : "2000", "tokens kept of each example");
  if (flat) {
    add("min_args", ParamKind::Int, "4", "the fewest digits the operator takes");
  } else {
    add("max_depth", ParamKind::Int, std::to_string(lra.max_depth), "the deepest nesting");
    add("min_length", ParamKind::Int, std::to_string(lra.min_length),
        "generated examples are longer than this (operators, digits and closing brackets)");
    add("max_length", ParamKind::Int, std::to_string(lra.max_length), "generated examples are shorter than this");
  }
  return options;
}

void register_plugin(Registrar& r) {
  r.add_task("listops", "Long Range Arena ListOps: LRA TSV files or the LRA generator, 10 classes",
             [](const TaskSpec& spec) { return std::make_unique<ListOpsTask>(spec, false); });
  r.declare_options("task", "listops", listops_options(false));
  r.add_task("listops_flat", "the CHIAR paper's flat ListOps: one operator over 4-8 digits",
             [](const TaskSpec& spec) { return std::make_unique<ListOpsTask>(spec, true); });
  r.declare_options("task", "listops_flat", listops_options(true));
}

}  // namespace

CHIAR_PLUGIN("task", register_plugin)
