// test_matrix: the matrix file as `chiar run` reads it. Run hashes pinned
// across releases, every shipped matrix and the options reference, the
// expansion of variants, tasks, sweeps and seeds, and the one message each
// bad config gets, at the key that set it.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <boost/filesystem.hpp>
#include <toml++/toml.h>

#include "chiar/error.h"
#include "engine/config/matrix.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

// Run hashes name finished runs in every store: a change to how specs are
// read, defaulted or serialised must leave them as they were. These values
// were computed before the option tables replaced the hand-written readers.
TEST_CASE("matrix: run hashes of existing specs are pinned", "[engine][matrix]") {
  TempDir d("pinned");
  std::ofstream(d.path() + "/pinned.toml") << R"(
[matrix]
name = "pinned"
variants = ["base", "routed", "three"]
tasks = ["lm", "cls"]
seeds = [0, 3]
[model]
d_model = 32
n_heads = 2
router = "threshold"  # the default until the harness stopped naming one; stored specs hold it
norm = "post"         # every run stored before model.norm existed; left out of the hash
[train]
steps = 12
lr = 2e-3
precision = "fp32"
[variants.base]
layers = ["attn", "attn"]
[variants.routed]
layers = ["dct", "dct|attn"]
router = "hard_ste"
router_params = { temperature = 0.5 }
meta_router = "causal"
[variants.routed.train]
warmup = 3
[variants.three]
layers = ["dct|rbf|attn"]
execution = "dense"
operators = { rbf = { features = 16 }, attention = { core = "chunked" } }
[tasks.lm]
plugin = "wikitext"
source = "synthetic"
seq_len = 16
[tasks.cls]
plugin = "listops"
seq_len = 24
[tasks.cls.train]
batch_size = 4
[sweep]
train.clip = [0.5, 1]
)";
  engine::MatrixOptions o;
  o.set = {"train.eval_every=4", "model.dropout=0.1"};
  const auto m = engine::load_matrix(d.path() + "/pinned.toml", o);
  REQUIRE(m.runs.size() == 24);
  const std::vector<std::pair<size_t, std::string>> pinned = {{0, "8fa7768bc9a69b2f"},
                                                              {5, "15f039b041759106"},
                                                              {11, "5ff2e811b1d36561"},
                                                              {17, "08ee06325994c9cc"},
                                                              {23, "d291b0af9811029a"}};
  for (const auto& [index, hash] : pinned) {
    INFO(m.runs[index].name());
    CHECK(m.runs[index].hash == hash);
  }
  // Any other placement is in the hash: the same runs, new hashes.
  o.set.push_back("model.norm=\"pre\"");
  const auto pre = engine::load_matrix(d.path() + "/pinned.toml", o);
  for (const auto& [index, hash] : pinned) CHECK(pre.runs[index].hash != hash);
  CHECK(pre.runs[0].canonical.find("\"norm\"") != std::string::npos);
  CHECK(m.runs[0].canonical.find("\"norm\"") == std::string::npos);
  // Options added after runs were stored: the value every earlier run
  // computed with is left out of the hash, so those runs keep theirs; any
  // other value is in it.
  const auto with_setting = [&](const std::string& setting) {
    engine::MatrixOptions with = o;
    with.set.back() = setting;
    return engine::load_matrix(d.path() + "/pinned.toml", with);
  };
  for (const auto& [old_value, new_value] :
       std::vector<std::pair<std::string, std::string>>{{"train.decay_embeddings=true", "train.decay_embeddings=false"},
                                                        {"model.embed_std=0.02", "model.embed_std=1.0"}}) {
    INFO(old_value << " against " << new_value);
    const auto kept = with_setting(old_value), moved = with_setting(new_value);
    for (const auto& [index, hash] : pinned) {
      CHECK(kept.runs[index].hash == hash);
      CHECK(moved.runs[index].hash != hash);
    }
  }
  CHECK(with_setting("train.decay_embeddings=false").runs[0].train.decay_embeddings == false);
  CHECK(with_setting("model.embed_std=1.0").runs[0].model.embed_std() == 1.0);
  // The shipped quickstart's first run, as the store behind reports/quickstart.* holds it.
  const auto quickstart = engine::load_matrix(CHIAR_SOURCE_DIR "/configs/quickstart.toml");
  REQUIRE(!quickstart.runs.empty());
  INFO(quickstart.runs[0].name());
  CHECK(quickstart.runs[0].hash == "f00951310e6c25e4");
}

// Every matrix shipped in configs/ passes `chiar run --dry-run` (plugin names,
// task options, the model probe; nothing is opened or written), so a config
// cannot rot while the code moves on; the reproduction's design, which its
// comments quote, is what the harness computes from it and its claims.
TEST_CASE("matrix: every shipped matrix passes a dry run", "[engine][matrix]") {
  int matrices = 0;
  for (const auto& entry : boost::filesystem::directory_iterator(CHIAR_SOURCE_DIR "/configs")) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".toml") continue;
    if (!toml::parse_file(path).contains("matrix")) continue;
    const auto dry = test::run_chiar({"run", path, "--dry-run", "--db", "/nonexistent/dry-run.db"});
    INFO(path << "\n" << dry.output);
    CHECK(dry.status == 0);
    ++matrices;
  }
  CHECK(matrices >= 6);
  const auto design = test::run_chiar({"run", CHIAR_SOURCE_DIR "/configs/repro.toml", "--decide",
                                       CHIAR_SOURCE_DIR "/configs/claims.toml", "--rounds", "2", "--dry-run", "--db",
                                       "/nonexistent/dry-run.db"});
  INFO(design.output);
  CHECK(design.status == 0);
  CHECK_THAT(design.output, Catch::Matchers::Contains("up to 5 seeds in 2 rounds (3, 5 seeds); alpha 0.05 / 23 "
                                                      "per comparison"));
  CHECK_THAT(design.output, Catch::Matchers::Contains("p < 4.94e-05, 0.00216; 17 comparisons"));
}

// The options reference is generated from the option tables, and the copy in
// docs/ must be what the build prints: the doc cannot drift from the code.
TEST_CASE("matrix: docs/options.md is what `chiar options` prints", "[engine][matrix]") {
  const auto printed = test::run_chiar({"options"});
  REQUIRE(printed.status == 0);
  std::ifstream in(CHIAR_SOURCE_DIR "/docs/options.md");
  REQUIRE(in.good());
  std::stringstream doc;
  doc << in.rdbuf();
  INFO("regenerate it: build/chiar options > docs/options.md");
  CHECK(doc.str() == printed.output);
  // Every [train] key appears in it, from the same table the reader uses.
  for (const char* key : {"steps", "batch_size", "precision", "fail_loss_above"})
    CHECK(printed.output.find(std::string("| `") + key + "` |") != std::string::npos);
}

TEST_CASE("matrix: expansion, sweeps, --set, --only, --shard, stable hashes", "[engine][matrix]") {
  TempDir d("matrix");
  test::write_e2e_matrix(d);
  const auto m = engine::load_matrix(d.path() + "/m.toml");
  REQUIRE(m.runs.size() == 8);
  CHECK(m.runs[0].name() == "base/lm/seed=0");
  CHECK(m.runs[7].name() == "routed/flat/seed=1");
  CHECK(m.runs[0].train.steps == 6);
  CHECK(m.runs[0].train.lr == Approx(1e-3));  // a built-in default, resolved into the spec
  CHECK(m.runs[4].model.layers() == std::vector<std::string>{"dct", "dct|attn"});
  CHECK(m.runs[0].canonical.find("\"weight_decay\"") != std::string::npos);
  CHECK(engine::load_matrix(d.path() + "/m.toml").runs[3].hash == m.runs[3].hash);
  std::set<std::string> hashes;
  for (const auto& r : m.runs) hashes.insert(r.hash);
  CHECK(hashes.size() == 8);

  engine::MatrixOptions o;
  o.set = {"train.steps=9", "model.d_model=32"};
  const auto set = engine::load_matrix(d.path() + "/m.toml", o);
  CHECK(set.runs[0].train.steps == 9);
  CHECK(set.runs[0].model.d_model() == 32);
  CHECK(set.runs[0].hash != m.runs[0].hash);
  // Lists of strings and inline tables are written as TOML; a list of
  // numbers keeps the type it always had (floats), and so its runs' hashes.
  o.set = {"model.layers=[\"dct\", \"attn\"]", "model.operators={ attn = { block = 4 } }", "router.shares=[1, 0]"};
  const auto lists = engine::load_matrix(d.path() + "/m.toml", o);
  CHECK(lists.runs[0].model.layers() == std::vector<std::string>{"dct", "attn"});
  CHECK(lists.runs[0].model.operator_params().at("attn").describe() == "block=4");
  std::string canonical = lists.runs[0].canonical;
  canonical.erase(std::remove_if(canonical.begin(), canonical.end(),
                                 [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }),
                  canonical.end());
  CHECK(canonical.find("\"shares\":[1.0,0.0]") != std::string::npos);
  o.set = {"model.layers=[dct, attn]"};
  CHECK_THROWS_WITH(
      engine::load_matrix(d.path() + "/m.toml", o),
      Catch::Matchers::StartsWith("--set model.layers: [dct, attn] is not a TOML value (") &&
          Catch::Matchers::EndsWith("); quote the strings of a list: model.layers=[\"dct\", \"dct|attn\"]"));
  // A plugin's options hold no lists of strings or tables.
  o.set = {"task.note=[\"a\"]"};
  CHECK_THROWS_WITH(engine::load_matrix(d.path() + "/m.toml", o),
                    "--set task.note: 'task.note': expected a boolean, number, string or list of numbers");
  o = {};
  o.only = "routed/*";
  CHECK(engine::load_matrix(d.path() + "/m.toml", o).runs.size() == 4);
  std::set<std::string> union_of_shards;
  for (int k = 1; k <= 3; ++k) {
    o = {};
    o.shard_index = k;
    o.shard_count = 3;
    for (const auto& r : engine::load_matrix(d.path() + "/m.toml", o).runs)
      CHECK(union_of_shards.insert(r.hash).second);
  }
  CHECK(union_of_shards == hashes);

  std::ofstream(d.path() + "/m.toml", std::ios::app)
      << "\n[sweep]\nmodel.d_model = [16, 32]\ntrain.lr = [0.001, 0.01, 0.1]\n";
  const auto swept = engine::load_matrix(d.path() + "/m.toml");
  CHECK(swept.runs.size() == 8 * 6);
  CHECK(swept.runs[0].name() == "base/lm/seed=0,d_model=16,lr=0.001");
  // A list's items joined by '+', a table by its place: every point's runs
  // have names of their own.
  d.write("lists.toml",
          "include = [\"m.toml\"]\n[matrix]\nvariants = [\"base\"]\ntasks = [\"flat\"]\n"
          "seeds = [0]\n[sweep]\nmodel.layers = [[\"attn\"], [\"dct\", \"attn\"]]\n"
          "model.operators = [{}, { attn = { dropout = 0.1 } }]\n");
  std::vector<std::string> names;
  for (const auto& r : engine::load_matrix(d.path() + "/lists.toml").runs) names.push_back(r.name());
  REQUIRE(names.size() == 2 * 2 * 2 * 3);  // with m.toml's d_model and lr axes
  CHECK(names[0] == "base/flat/seed=0,d_model=16,layers=attn,operators=#1,lr=0.001");
  CHECK(names[2] == "base/flat/seed=0,d_model=16,layers=dct+attn,operators=#1,lr=0.001");
  CHECK(names[4] == "base/flat/seed=0,d_model=16,layers=attn,operators=#2,lr=0.001");
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
}

TEST_CASE("matrix: bad configs give one message at file:line:column", "[engine][matrix][errors]") {
  TempDir d("matrix-bad");
  test::write_e2e_matrix(d);
  const std::string m = d.path() + "/m.toml";
  auto with = [&](const std::string& extra) {
    d.write("bad.toml", "include = [\"m.toml\"]\n" + extra);
    return d.path() + "/bad.toml";
  };
  CHECK_THROWS_WITH(engine::load_matrix(with("[train]\nstpes = 3\n")),
                    d.path() + "/bad.toml:3:9: key 'train.stpes': unknown key (did you mean 'steps'?)");
  CHECK_THROWS_WITH(engine::load_matrix(with("[train]\nlr = \"fast\"\n")),
                    d.path() + "/bad.toml:3:6: key 'train.lr': expected a number");
  CHECK_THROWS_WITH(
      engine::load_matrix(with("[matrix]\nvariants = [\"based\"]\n")),
      Catch::Matchers::EndsWith("key 'matrix.variants': no variant 'based' is defined (did you mean 'base'?)"));
  // Names that a '.' or a '/' would split, where a lookup would then say
  // "no variant 'v1.5' is defined (did you mean 'v1.5'?)".
  CHECK_THROWS_WITH(engine::load_matrix(with("[matrix]\nvariants = [\"v1.5\"]\n[variants.\"v1.5\"]\nlayers = "
                                             "[\"attn\"]\n")),
                    d.path() +
                        "/bad.toml:3:12: key 'matrix.variants': a variant name takes letters, digits, '_' and "
                        "'-' (it is part of key paths and of run names), found 'v1.5'");
  CHECK_THROWS_WITH(engine::load_matrix(with("[matrix]\ntasks = [\"lm/small\"]\n")),
                    d.path() +
                        "/bad.toml:3:9: key 'matrix.tasks': a task name takes letters, digits, '_' and '-' "
                        "(it is part of key paths and of run names), found 'lm/small'");
  CHECK_THROWS_WITH(engine::load_matrix(with("[variants.routed]\nlayrs = [\"dct\"]\n")),
                    d.path() + "/bad.toml:3:9: key 'variants.routed.layrs': unknown key (did you mean 'layers'?)");
  CHECK_THROWS_WITH(engine::load_matrix(with("[train]\nprecision = \"fp8\"\n")),
                    d.path() + "/bad.toml:3:13: key 'train.precision': must be \"auto\", \"fp32\" or \"bf16\"");
  engine::MatrixOptions o;
  o.set = {"train.stepz=4"};
  CHECK_THROWS_WITH(engine::load_matrix(m, o), "--set train.stepz: 'train.stepz': unknown key (did you mean 'steps'?)");
  CHECK_THROWS_WITH(engine::load_matrix(d.path() + "/none.toml"), d.path() + "/none.toml: cannot open the file");
  // Plugin options of a kind no plugin takes, at their own key: the run
  // tables they are read from keep no positions, the matrix's files do.
  CHECK_THROWS_WITH(
      engine::load_matrix(with("[variants.base]\noperators = { attn = { chunk_mib = [1, \"a\"] } }\n")),
      d.path() + "/bad.toml:3:36: key 'variants.base.operators.attn.chunk_mib': expected a list of numbers");
  CHECK_THROWS_WITH(engine::load_matrix(with("[tasks.flat]\nn_train = [1, \"a\"]\n")),
                    d.path() + "/bad.toml:3:11: key 'tasks.flat.n_train': expected a list of numbers");
  CHECK_THROWS_WITH(engine::load_matrix(with("[sweep]\nmodel.operators = [{ attn = { chunk_mib = [1, \"a\"] } }]\n")),
                    d.path() + "/bad.toml:3:19: key 'sweep.model.operators': expected a list of numbers");
  engine::MatrixOptions table_set;
  table_set.set = {"model.operators={ attn = { chunk_mib = [1, \"a\"] } }"};
  CHECK_THROWS_WITH(engine::load_matrix(m, table_set), "--set model.operators: expected a list of numbers");
  // An include that cannot be read, named at the entry that includes it.
  const std::string inc = d.write("inc.toml", "include = [\"m.toml\", \"nope.toml\"]\n");
  CHECK_THROWS_WITH(engine::load_matrix(inc), inc + ":1:22: key 'include': cannot open '" + d.path() + "/nope.toml'");
  const std::string self = d.write("self.toml", "include = [\"self.toml\"]\n");
  CHECK_THROWS_WITH(engine::load_matrix(self),
                    self + ":1:12: key 'include': '" + self + "' includes this file again (an include cycle)");
  // The default store is results/NAME.db.
  const std::string named = d.write("named.toml", "include = [\"m.toml\"]\n[matrix]\nname = \"../../escape\"\n");
  CHECK_THROWS_WITH(engine::load_matrix(named),
                    named +
                        ":3:8: key 'matrix.name': a matrix name may not contain '/' or begin with '.' (the "
                        "default store is results/NAME.db), found '../../escape'");
  // Any other name stays: it is part of every run's hash.
  d.write("named.toml", "include = [\"m.toml\"]\n[matrix]\nname = \"slurm tiny+lr v2\"\n");
  CHECK(engine::load_matrix(named).name == "slurm tiny+lr v2");
  // Seeds feed unsigned generators; no list is a matrix of nothing.
  CHECK_THROWS_WITH(engine::load_matrix(with("[matrix]\nseeds = [0, -1]\n")),
                    d.path() + "/bad.toml:3:9: key 'matrix.seeds': a seed must not be negative");
  CHECK_THROWS_WITH(engine::load_matrix(with("[matrix]\nvariants = []\n")),
                    d.path() + "/bad.toml:3:12: key 'matrix.variants': expected at least one name");
  engine::MatrixOptions none;
  none.only = "bsae/*";
  CHECK_THROWS_WITH(engine::load_matrix(m, none), "--only 'bsae/*': no run of " + m +
                                                      " has a matching name (VARIANT/TASK/seed=N; `chiar run " + m +
                                                      " --dry-run` lists them)");
  // A glob that names runs of other shards only is not a mistake.
  none.only = "base/lm/seed=0";
  none.shard_index = 2;
  none.shard_count = 8;
  CHECK(engine::load_matrix(m, none).runs.empty());
}

// A value of the right kind that its option refuses is reported where the
// value a run got was set: the matrix applies --set last, then sweeps, the
// task's table, the variant's, then [train] and [model].
TEST_CASE("matrix: a refused value is reported at the key that set it", "[engine][matrix][errors]") {
  TempDir d("matrix-refused");
  test::write_e2e_matrix(d);
  const std::string bad = d.path() + "/bad.toml";
  auto load = [&](const std::string& extra, std::vector<std::string> set = {}, const std::string& device = "") {
    d.write("bad.toml", "include = [\"m.toml\"]\n" + extra);
    engine::MatrixOptions o;
    o.set = std::move(set);
    o.device = device;
    return engine::load_matrix(bad, o);
  };
  CHECK_THROWS_WITH(load("[train]\nsteps = 0\n"), bad + ":3:9: key 'train.steps': must be at least 1");
  CHECK_THROWS_WITH(load("[train]\nsteps = 0\n", {"train.steps=0"}), "--set train.steps: must be at least 1");
  CHECK(load("[train]\nsteps = 0\n", {"train.steps=5"}).runs.at(0).train.steps == 5);
  // base/lm takes the task's lr; base/flat the variant's, which is refused.
  CHECK_THROWS_WITH(load("[variants.base.train]\nlr = -1.0\n[tasks.lm.train]\nlr = 0.01\n"),
                    bad + ":3:6: key 'variants.base.train.lr': must be positive");
  CHECK_THROWS_WITH(load("[model]\nembed_std = 0.0\n"), bad + ":3:13: key 'model.embed_std': must be positive");
  CHECK_THROWS_WITH(load("[tasks.flat.train]\nbeta1 = 1.5\n"),
                    bad + ":3:9: key 'tasks.flat.train.beta1': must lie in [0, 1)");
  CHECK_THROWS_WITH(
      load("[variants.routed]\nexecution = \"fast\"\n"),
      bad + ":3:13: key 'variants.routed.execution': unknown execution 'fast' (known: auto, dense, sparse)");
  CHECK_THROWS_WITH(
      load("[variants.routed.model]\nmeta_router = \"global\"\n[variants.routed]\nexecution = \"dense\"\n"),
      bad +
          ":3:15: key 'variants.routed.model.meta_router': unknown meta_router 'global' (known: none, "
          "causal, batch_mean)");
  CHECK_THROWS_WITH(load("", {"model.execution=fast"}),
                    "--set model.execution: unknown execution 'fast' (known: auto, dense, sparse)");
  CHECK_THROWS_WITH(load("[sweep]\ntrain.lr = [0.001, -0.5]\n"), bad + ":3:12: key 'sweep.train.lr': must be positive");
  // nan and inf pass no option: `lr > 0` alone would let inf reach the optimiser.
  CHECK_THROWS_WITH(load("[train]\nlr = inf\n"), bad + ":3:6: key 'train.lr': expected a finite number, found inf");
  CHECK_THROWS_WITH(load("[train]\nweight_decay = nan\n"),
                    bad + ":3:16: key 'train.weight_decay': expected a finite number, found nan");
  CHECK_THROWS_WITH(load("", {"train.lr=inf"}), "--set train.lr: 'train.lr': expected a number");
  CHECK_THROWS_WITH(load("", {"task.seq_len=[1, nan]"}),
                    "--set task.seq_len: 'task.seq_len': expected finite numbers, found nan");
  // Ranges every option states.
  CHECK_THROWS_WITH(load("[model]\ndropout = 1.5\n"), bad + ":3:11: key 'model.dropout': must lie in [0, 1)");
  CHECK_THROWS_WITH(load("", {"model.ffn_mult=0"}), "--set model.ffn_mult: must be at least 1");
  CHECK_THROWS_WITH(load("", {"train.min_lr_ratio=-1"}), "--set train.min_lr_ratio: must lie in [0, 1]");
  CHECK_THROWS_WITH(load("", {"train.warmup=-1"}), "--set train.warmup: must be at least 0");
  CHECK_THROWS_WITH(load("", {"train.weight_decay=-0.1"}), "--set train.weight_decay: must not be negative");
  CHECK_THROWS_WITH(load("", {"train.clip=-1"}), "--set train.clip: must not be negative");
  CHECK_THROWS_WITH(load("", {"train.threads=-2"}), "--set train.threads: must be at least 0");
  CHECK_THROWS_WITH(load("", {"train.calibration_batches=-1"}), "--set train.calibration_batches: must be at least 0");
  CHECK(
      load("", {"train.clip=0", "train.warmup=0", "train.min_lr_ratio=1", "train.calibration_batches=0"}).runs.size() ==
      8);
  // Checked at load, as a run checks it, so that --dry-run refuses it too.
  CHECK_THROWS_WITH(load("", {}, "gpu"), "--device: \"gpu\" must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
  CHECK_THROWS_WITH(load("[model]\nn_heads = 3\n"),
                    bad + ":3:11: key 'model.n_heads': model: d_model (16) must be a positive multiple of n_heads (3)");
}
