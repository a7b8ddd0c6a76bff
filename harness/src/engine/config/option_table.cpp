#include "engine/config/option_table.h"

#include <sstream>

#include "engine/config/matrix.h"
#include "engine/runtime/device.h"

namespace chiar::engine {
namespace {

// A table of plugin options under the option at `path` ("model.operators"),
// `key` its path in errors ("operators.attn"). A value of a kind no plugin
// takes is refused as the option's (RefusedValue), so that the matrix names
// it where it was set: the resolved run's tables keep no positions.
Params plugin_params(const toml::table& t, const std::string& key, const std::string& path) {
  try {
    return toml_params(t, key);
  } catch (const RefusedOptionValue& e) {
    throw RefusedValue(path.substr(0, path.find('.') + 1) + e.key(), e.problem());
  }
}

// How one member type travels between TOML and the options struct.
template <class T>
struct Codec;

template <>
struct Codec<int64_t> {
  static constexpr OptionKind kind = OptionKind::Int;
  static int64_t read(const toml::node& n, const std::string&, const Locate&) { return n.as_integer()->get(); }
  static void write(toml::table& t, const std::string& key, int64_t v) { t.insert_or_assign(key, v); }
};

template <>
struct Codec<bool> {
  static constexpr OptionKind kind = OptionKind::Bool;
  static bool read(const toml::node& n, const std::string&, const Locate&) { return n.as_boolean()->get(); }
  static void write(toml::table& t, const std::string& key, bool v) { t.insert_or_assign(key, v); }
};

template <>
struct Codec<double> {
  static constexpr OptionKind kind = OptionKind::Number;
  static double read(const toml::node& n, const std::string& path, const Locate&) {
    const double v = n.is_integer() ? static_cast<double>(n.as_integer()->get()) : n.as_floating_point()->get();
    // TOML writes nan and inf; no option means anything by them, and a check
    // like `v > 0` would let inf through to the optimiser.
    if (const std::string found = non_finite_name(v); !found.empty())
      throw RefusedValue(path, "expected a finite number, found " + found);
    return v;
  }
  static void write(toml::table& t, const std::string& key, double v) { t.insert_or_assign(key, v); }
};

template <>
struct Codec<std::string> {
  static constexpr OptionKind kind = OptionKind::String;
  static std::string read(const toml::node& n, const std::string&, const Locate&) { return n.as_string()->get(); }
  static void write(toml::table& t, const std::string& key, const std::string& v) { t.insert_or_assign(key, v); }
};

template <>
struct Codec<std::vector<std::string>> {
  static constexpr OptionKind kind = OptionKind::Strings;
  static std::vector<std::string> read(const toml::node& n, const std::string&, const Locate&) {
    std::vector<std::string> out;
    for (const auto& item : *n.as_array()) out.push_back(item.as_string()->get());
    return out;
  }
  static void write(toml::table& t, const std::string& key, const std::vector<std::string>& v) {
    toml::array a;
    for (const auto& s : v) a.push_back(s);
    t.insert_or_assign(key, a);
  }
};

template <>
struct Codec<Params> {
  static constexpr OptionKind kind = OptionKind::Table;
  static Params read(const toml::node& n, const std::string& path, const Locate&) {
    return plugin_params(*n.as_table(), path.substr(path.find('.') + 1), path);
  }
  static void write(toml::table& t, const std::string& key, const Params& p) {
    toml::table values;
    for (const auto& [k, v] : p.values()) put_value(values, k, v);
    t.insert_or_assign(key, values);
  }
};

// operators = { NAME = { option = value, ... }, ... }
template <>
struct Codec<model::OperatorParams> {
  static constexpr OptionKind kind = OptionKind::Table;
  static model::OperatorParams read(const toml::node& n, const std::string& path, const Locate& where) {
    model::OperatorParams out;
    const std::string prefix = path.substr(path.find('.') + 1) + ".";
    for (const auto& [name, table] : *n.as_table()) {
      const std::string key = prefix + std::string(name.str());
      if (!table.is_table()) throw UserError(where(table, key) + ": key '" + key + "': expected a table of options");
      out[std::string(name.str())] = plugin_params(*table.as_table(), key, path);
    }
    return out;
  }
  static void write(toml::table& t, const std::string& key, const model::OperatorParams& ops) {
    toml::table all;
    for (const auto& [name, p] : ops) Codec<Params>::write(all, name, p);
    t.insert_or_assign(key, all);
  }
};

// An enum written by its name; from_string refuses other names.
template <class E, const char* (*ToString)(E), E (*FromString)(const std::string&)>
struct NamedCodec {
  static constexpr OptionKind kind = OptionKind::String;
  static E read(const toml::node& n, const std::string& path, const Locate&) {
    try {
      return FromString(n.as_string()->get());
    } catch (const UserError& e) {
      throw RefusedValue(path, e.what());
    }
  }
  static void write(toml::table& t, const std::string& key, E v) { t.insert_or_assign(key, std::string(ToString(v))); }
};
template <>
struct Codec<model::MetaRouterKind>
    : NamedCodec<model::MetaRouterKind, model::to_string, model::meta_router_from_string> {};
template <>
struct Codec<model::Execution> : NamedCodec<model::Execution, model::to_string, model::execution_from_string> {};
template <>
struct Codec<model::NormPlacement>
    : NamedCodec<model::NormPlacement, model::to_string, model::norm_placement_from_string> {};

template <class O, class T>
OptionField<O> field(const char* key, T O::*member, const char* doc, std::function<std::string(const T&)> check = {}) {
  OptionField<O> f;
  f.key = key;
  f.kind = Codec<T>::kind;
  f.doc = doc;
  f.read = [member](O& o, const toml::node& n, const std::string& path, const Locate& where) {
    o.*member = Codec<T>::read(n, path, where);
  };
  f.write = [member, key = f.key](const O& o, toml::table& t) { Codec<T>::write(t, key, o.*member); };
  if (check) f.check = [member, check](const O& o) { return check(o.*member); };
  return f;
}

// A default as a matrix would write it: 0.001, "fp32", ["a", "b|c"], {}.
std::string default_text(const toml::table& defaults, const std::string& key) {
  const toml::node& n = *defaults.get(key);
  std::ostringstream text;
  if (n.is_boolean()) {
    text << (n.as_boolean()->get() ? "true" : "false");
  } else if (n.is_integer()) {
    text << n.as_integer()->get();
  } else if (n.is_floating_point()) {
    text << n.as_floating_point()->get();  // shortest of 6 significant digits: 0.95, not 0.9499...
    if (text.str().find_first_of(".e") == std::string::npos) text << ".0";
  } else if (n.is_string()) {
    text << '"' << n.as_string()->get() << '"';
  } else if (n.is_array()) {
    text << '[';
    for (size_t i = 0; i < n.as_array()->size(); ++i)
      text << (i ? ", " : "") << '"' << n.as_array()->get(i)->value_or(std::string()) << '"';
    text << ']';
  } else if (n.is_table()) {
    text << (n.as_table()->empty() ? "{}" : "{ ... }");
  }
  return text.str();
}

// A field left out of run hashes where its member is `old`: the value every
// run stored before the option existed computed with.
template <class O, class T>
OptionField<O> field_unhashed_at(const char* key, T O::*member, T old, const char* doc,
                                 std::function<std::string(const T&)> check = {}) {
  OptionField<O> f = field(key, member, doc, std::move(check));
  toml::table as_written;
  Codec<T>::write(as_written, f.key, old);
  f.unhashed_note = "`" + default_text(as_written, f.key) +
                    "` is left out of run hashes, so runs stored before this option existed keep theirs";
  f.unhashed = [member, old = std::move(old)](const O& o) { return o.*member == old; };
  return f;
}

// The field, never part of a run's hash: it says where a run trains.
template <class O>
OptionField<O> never_hashed(OptionField<O> f) {
  f.unhashed_note = "recorded with the run, not part of its hash";
  f.unhashed = [](const O&) { return true; };
  return f;
}

std::function<std::string(const int64_t&)> at_least(int64_t low) {
  return [low](const int64_t& v) { return v >= low ? "" : "must be at least " + std::to_string(low); };
}

std::string positive(const double& v) { return v > 0 ? "" : "must be positive"; }

std::string not_negative(const double& v) { return v >= 0 ? "" : "must not be negative"; }

std::string unit_interval(const double& v) { return v >= 0 && v < 1 ? "" : "must lie in [0, 1)"; }

std::string closed_unit_interval(const double& v) { return v >= 0 && v <= 1 ? "" : "must lie in [0, 1]"; }

std::string precision_name(const std::string& v) {
  return v == "auto" || v == "fp32" || v == "bf16" ? "" : "must be \"auto\", \"fp32\" or \"bf16\"";
}

}  // namespace

bool has_kind(const toml::node& n, OptionKind kind) {
  switch (kind) {
    case OptionKind::Int: return n.is_integer();
    case OptionKind::Number: return n.is_integer() || n.is_floating_point();
    case OptionKind::String: return n.is_string();
    case OptionKind::Bool: return n.is_boolean();
    case OptionKind::Table: return n.is_table();
    case OptionKind::Strings:
    case OptionKind::Ints: {
      if (!n.is_array()) return false;
      for (const auto& item : *n.as_array())
        if (kind == OptionKind::Strings ? !item.is_string() : !item.is_integer()) return false;
      return true;
    }
  }
  return false;
}

const char* kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::Int: return "an integer";
    case OptionKind::Number: return "a number";
    case OptionKind::String: return "a string";
    case OptionKind::Bool: return "a boolean";
    case OptionKind::Table: return "a table";
    case OptionKind::Strings: return "a list of strings";
    case OptionKind::Ints: return "a list of integers";
  }
  return "?";
}

void put_value(toml::table& t, const std::string& key, const Params::Value& v) {
  switch (v.index()) {
    case 0: t.insert_or_assign(key, std::get<bool>(v)); break;
    case 1: t.insert_or_assign(key, std::get<int64_t>(v)); break;
    case 2: t.insert_or_assign(key, std::get<double>(v)); break;
    case 3: t.insert_or_assign(key, std::get<std::string>(v)); break;
    default: {
      toml::array a;
      for (double x : std::get<std::vector<double>>(v)) a.push_back(x);
      t.insert_or_assign(key, a);
    }
  }
}

// Table order is the order `chiar options` lists them in. The keys and their
// default values are part of every run's hash: renaming a key or changing a
// default changes the hashes of runs that did not set it.
const std::vector<OptionField<model::ModelOptions>>& model_option_fields() {
  using M = model::ModelOptions;
  static const std::vector<OptionField<M>> fields = {
      field("d_model", &M::d_model_, "width of the residual stream", at_least(1)),
      field("n_heads", &M::n_heads_, "attention heads (d_model must be a multiple)", at_least(1)),
      field("ffn_mult", &M::ffn_mult_, "FFN hidden width as a multiple of d_model", at_least(1)),
      field("dropout", &M::dropout_, "dropout after the embedding and inside each FFN", {unit_interval}),
      field("layers", &M::layers_,
            "required: one entry per block, an operator or operators joined by '|' for a routed layer, cheapest first"),
      field("router", &M::router_, "required when a layer is routed: the router plugin of every routed layer"),
      field("router_params", &M::router_params_, "the router's options (also settable as router.KEY)"),
      field("operators", &M::operator_params_, "options per operator name, applied to every instance"),
      field("meta_router", &M::meta_router_,
            "task-level gate on layer 1: none, causal (no look-ahead) or batch_mean (the reference's)"),
      field("execution", &M::execution_, "routed layers: auto (sparse where the choice is hard), dense or sparse"),
      field_unhashed_at("norm", &M::norm_, model::NormPlacement::Post,
                        "where each sub-layer's LayerNorm sits: pre, x + f(LN x); post, LN(x + f(x)) (the paper's); "
                        "auto, pre for classification and post for language modelling"),
      field_unhashed_at("embed_std", &M::embed_std_, 0.02,
                        "standard deviation of the token embedding's initial normal draw (a language model's head "
                        "too: the two are tied)",
                        {positive}),
  };
  return fields;
}

const std::vector<OptionField<TrainOptions>>& train_option_fields() {
  using T = TrainOptions;
  static const std::vector<OptionField<T>> fields = {
      field("steps", &T::steps, "optimizer steps", at_least(1)),
      field("batch_size", &T::batch_size, "sequences per micro-batch", at_least(1)),
      field("grad_accum", &T::grad_accum, "micro-batches per optimizer step", at_least(1)),
      field("lr", &T::lr, "peak learning rate", {positive}),
      field("min_lr_ratio", &T::min_lr_ratio, "the cosine schedule decays to lr * min_lr_ratio",
            {closed_unit_interval}),
      field("warmup", &T::warmup, "linear warm-up steps", at_least(0)),
      field("weight_decay", &T::weight_decay, "AdamW weight decay, on matrices only", {not_negative}),
      field_unhashed_at("decay_embeddings", &T::decay_embeddings, true,
                        "whether weight decay applies to the token embedding (tied with the LM head) as to the "
                        "other matrices"),
      field("beta1", &T::beta1, "AdamW beta1", {unit_interval}),
      field("beta2", &T::beta2, "AdamW beta2", {unit_interval}),
      field("clip", &T::clip, "global gradient-norm clip; 0 = off", {not_negative}),
      field("eval_every", &T::eval_every, "steps between validation evaluations (and one at the end)", at_least(1)),
      field("eval_batches", &T::eval_batches, "batches per intermediate evaluation; 0 = the whole split", at_least(0)),
      field("eval_batch_size", &T::eval_batch_size, "sequences per evaluation batch", at_least(1)),
      field("checkpoint_every", &T::checkpoint_every, "steps between checkpoints", at_least(1)),
      field("calibration_batches", &T::calibration_batches, "training batches whose entropies calibrate the routers",
            at_least(0)),
      field("threads", &T::threads, "intra-op threads; 0 = all cores", at_least(0)),
      field("log_every", &T::log_every, "steps between training-loss records", at_least(1)),
      field("precision", &T::precision,
            "auto (bf16 on a GPU, fp32 on the CPU; resolved before the run is hashed), fp32, or bf16 (autocast, fp32 "
            "master weights)",
            {precision_name}),
      never_hashed(field("device", &T::device,
                         "auto (the first GPU in a build with -DCHIAR_CUDA_TRAINING=ON and a CUDA libtorch, else the "
                         "CPU), cpu, cuda or cuda:N",
                         {device_name_problem})),
      field("fail_loss_above", &T::fail_loss_above, "testing aid: a loss above this counts as divergence; 0 = off",
            {not_negative}),
  };
  return fields;
}

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

namespace {

template <class Options>
void reference_table(std::ostringstream& out, const std::string& section,
                     const std::vector<OptionField<Options>>& fields) {
  const toml::table defaults = option_defaults(fields);
  out << "| `" << section << ".KEY` | kind | default | meaning |\n|---|---|---|---|\n";
  for (const auto& f : fields)
    out << "| `" << f.key << "` | " << kind_name(f.kind) << " | `" << markdown_cell(default_text(defaults, f.key))
        << "` | " << markdown_cell(f.unhashed_note.empty() ? f.doc : f.doc + "; " + f.unhashed_note) << " |\n";
}

}  // namespace

std::string options_reference() {
  std::ostringstream out;
  out << "## [model]\n\n";
  reference_table(out, "model", model_option_fields());
  out << "\n## [train]\n\n";
  reference_table(out, "train", train_option_fields());
  return out.str();
}

}  // namespace chiar::engine
