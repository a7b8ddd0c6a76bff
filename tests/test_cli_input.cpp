// test_cli_input: what the command line accepts and how it refuses input.
// Global options after the command, task options checked before any data
// file is read, the exit status of each kind of failure, and the BLAS
// diagnosis the CLI prints at start-up.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "chiar/error.h"
#include "engine/runtime/runtime.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::run_chiar;
using test::TempDir;

namespace {

const std::string kExtraPlugins = std::string(CHIAR_TEST_PLUGIN_DIR) + "/shade";  // one operator: shade

// What every refusal of a wikitext option lists when nothing is close.
const std::string kWikitextKeys =
    "batching, eval_lines, eval_stride, files, max_vocab, min_count, path, seq_len, test_file, tokenizer, train_file, "
    "valid_file, valid_fraction, vocab_size";

// A matrix of one tiny run on wikitext whose [tasks.wt] table ends with
// `task_lines`; the corpus folder "corpus" does not exist.
std::string write_matrix(const TempDir& d, const std::string& task_lines) {
  return d.write("m.toml",
                 "[matrix]\nname = \"m\"\nvariants = [\"base\"]\ntasks = [\"wt\"]\n\n"
                 "[model]\nd_model = 16\nn_heads = 2\n\n[train]\nsteps = 2\nbatch_size = 2\n\n"
                 "[variants.base]\nlayers = [\"attn\"]\n\n"
                 "[tasks.wt]\nplugin = \"wikitext\"\npath = \"corpus\"\n" +
                     task_lines);
}

}  // namespace

TEST_CASE("CLI: global options are accepted before and after the command", "[cli]") {
  SECTION("plugins --plugin-dir D, as --plugin-dir D plugins") {
    const auto after = run_chiar({"plugins", "--plugin-dir", kExtraPlugins});
    const auto before = run_chiar({"--plugin-dir", kExtraPlugins, "plugins"});
    CHECK(after.status == 0);
    CHECK_THAT(after.output, Catch::Matchers::Contains("shade"));
    CHECK(after.output == before.output);
    // Parsed, not ignored: a folder that is not there is refused.
    const auto missing = run_chiar({"plugins", "--plugin-dir", "/nonexistent-chiar-plugins"});
    CHECK(missing.status == 2);
    CHECK(missing.output == "chiar: plugin folder '/nonexistent-chiar-plugins' does not exist or is not a folder\n");
  }
  SECTION("a subcommand of a subcommand: data stats ... --plugin-dir D") {
    const auto missing =
        run_chiar({"data", "stats", "--task", "wikitext", "--plugin-dir", "/nonexistent-chiar-plugins"});
    CHECK(missing.status == 2);
    CHECK(missing.output == "chiar: plugin folder '/nonexistent-chiar-plugins' does not exist or is not a folder\n");
  }
  SECTION("info --threads 1 --gemm blas") {
    const auto info = run_chiar({"info", "--threads", "1", "--gemm", "blas"});
    CHECK(info.status == 0);
    CHECK_THAT(info.output, Catch::Matchers::Contains("threads    1\n"));
    CHECK_THAT(info.output, Catch::Matchers::Contains("products   blas (libtorch's path)\n"));
  }
  SECTION("run M.toml --threads 2, checked as before the command") {
    TempDir d("cli-global-run");
    const std::string matrix = write_matrix(d, "seq_len = 4\n");
    const auto dry = run_chiar({"run", matrix, "--dry-run", "--db", d.path() + "/r.db", "--threads", "2"});
    CHECK(dry.status == 0);
    CHECK_THAT(dry.output, Catch::Matchers::Contains("1 runs in matrix 'm'"));
    const auto bad = run_chiar({"run", matrix, "--dry-run", "--threads", "many"});
    CHECK(bad.status == 2);
    CHECK(bad.output == "chiar: --threads: expected an integer, found 'many'\n");
  }
  SECTION("integer options say their bound") {
    const auto threads = run_chiar({"info", "--threads", "-1"});
    CHECK(threads.status == 2);
    CHECK(threads.output == "chiar: --threads: must be at least 0, found -1\n");
    const auto nproc = run_chiar({"run", "m.toml", "--nproc", "0"});
    CHECK(nproc.status == 2);
    CHECK(nproc.output == "chiar: --nproc: must be at least 1, found 0\n");
    const auto top = run_chiar({"inspect", "x.db", "--run", "1", "--top", "0"});
    CHECK(top.status == 2);
    CHECK(top.output == "chiar: --top: must be at least 1, found 0\n");
    const auto color = run_chiar({"inspect", "x.db", "--run", "1", "--color", "sometimes"});
    CHECK(color.status == 2);
    CHECK(color.output == "chiar: --color: sometimes not in {auto,always,never}\n");
  }
  SECTION("what no level knows is still refused") {
    const auto extra = run_chiar({"plugins", "--no-such-option"});
    CHECK(extra.status == 2);
    CHECK(extra.output == "chiar: The following argument was not expected: --no-such-option\n");
  }
}

TEST_CASE("CLI: data stats refuses an unknown or mistyped task option before reading a file", "[cli]") {
  TempDir d("cli-task-options");  // an empty data root: any file access would fail
  const auto stats = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"data", "stats", "--data-root", d.path(), "--cache-dir", d.path() + "/cache"});
    return run_chiar(args);
  };
  const auto unknown = stats({"--task", "wikitext", "--set", "train=x"});
  CHECK(unknown.status == 2);
  CHECK(unknown.output == "chiar: --set train: unknown option of task 'wikitext' (known: " + kWikitextKeys + ")\n");

  const auto misspelt = stats({"--task", "wikitext", "--set", "seq_lne=4"});
  CHECK(misspelt.status == 2);
  CHECK(misspelt.output == "chiar: --set seq_lne: unknown option of task 'wikitext' (did you mean 'seq_len'?)\n");

  const auto mistyped = stats({"--task", "wikitext", "--set", "seq_len=abc"});
  CHECK(mistyped.status == 2);
  CHECK(mistyped.output == "chiar: --set seq_len: expected an integer, found a string (\"abc\")\n");

  // The other task plugins declare theirs too.
  const auto imdb = stats({"--task", "imdb", "--set", "valid_fraction=most"});
  CHECK(imdb.status == 2);
  CHECK(imdb.output == "chiar: --set valid_fraction: expected a number, found a string (\"most\")\n");
  const auto listops = stats({"--task", "listops", "--set", "train_fil=a.tsv"});
  CHECK(listops.status == 2);
  CHECK(listops.output == "chiar: --set train_fil: unknown option of task 'listops' (did you mean 'train_file'?)\n");
  const auto flat = stats({"--task", "listops_flat", "--set", "max_depth=3"});
  CHECK(flat.status == 2);
  CHECK(flat.output ==
        "chiar: --set max_depth: unknown option of task 'listops_flat' (known: data_seed, max_args, min_args, n_test, "
        "n_train, n_valid, seq_len, test_file, train_file, valid_file)\n");

  // Right keys and kinds: only then the missing corpus.
  const auto valid = stats({"--task", "wikitext", "--set", "seq_len=4"});
  CHECK(valid.status == 2);
  CHECK_THAT(valid.output, Catch::Matchers::EndsWith("/wikitext-2/wiki.train.tokens: cannot open the file\n"));

  SECTION("a task table in a TOML file: file:line:column and the key") {
    const std::string file = d.write("tasks.toml", "[tasks.wt]\nplugin = \"wikitext\"\ntrian_file = \"x\"\n");
    const auto toml = stats({file, "--table", "tasks.wt"});
    CHECK(toml.status == 2);
    CHECK(toml.output == "chiar: " + file +
                             ":3:14: key 'tasks.wt.trian_file': unknown option of task 'wikitext' (did you mean "
                             "'train_file'?)\n");
    // --set on top of the table is named as --set.
    const std::string good = d.write("good.toml", "[tasks.wt]\nplugin = \"wikitext\"\nseq_len = 4\n");
    const auto set = stats({good, "--table", "tasks.wt", "--set", "eval_stride=half"});
    CHECK(set.status == 2);
    CHECK(set.output == "chiar: --set eval_stride: expected an integer, found a string (\"half\")\n");
  }
}

TEST_CASE("CLI: chiar run refuses an unknown or mistyped task option at file:line:key", "[cli]") {
  TempDir d("cli-run-options");
  const std::string db = d.path() + "/r.db";
  const auto run = [&](const std::string& matrix, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"run",         matrix,   "--db",        db,
                                     "--data-root", d.path(), "--cache-dir", d.path() + "/cache"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_chiar(args);
  };
  SECTION("an unknown key") {
    const std::string matrix = write_matrix(d, "seq_len = 4\ntrian_file = \"wiki.valid.tokens\"\n");
    const auto r = run(matrix);
    CHECK(r.status == 2);
    CHECK(r.output == "chiar: " + matrix +
                          ":21:14: key 'tasks.wt.trian_file': unknown option of task 'wikitext' (did you mean "
                          "'train_file'?)\n");
  }
  SECTION("a value of another kind") {
    const std::string matrix = write_matrix(d, "seq_len = \"long\"\n");
    const auto r = run(matrix);
    CHECK(r.status == 2);
    CHECK(r.output ==
          "chiar: " + matrix + ":20:11: key 'tasks.wt.seq_len': expected an integer, found a string (\"long\")\n");
  }
  SECTION("from --set task.KEY") {
    const std::string matrix = write_matrix(d, "seq_len = 4\n");
    const auto r = run(matrix, {"--set", "task.seq_len=abc"});
    CHECK(r.status == 2);
    CHECK(r.output == "chiar: --set task.seq_len: expected an integer, found a string (\"abc\")\n");
  }
  SECTION("from an included file") {
    d.write("tasks.toml", "[tasks.wt]\nvalid_fraction = \"tenth\"\n");
    std::ifstream plain(write_matrix(d, ""));
    std::stringstream text;
    text << plain.rdbuf();
    const std::string matrix = d.write("inc.toml", "include = [\"tasks.toml\"]\n" + text.str());
    const auto r = run(matrix);
    CHECK(r.status == 2);
    CHECK(r.output == "chiar: " + d.path() +
                          "/tasks.toml:2:18: key 'tasks.wt.valid_fraction': expected a number, found a string "
                          "(\"tenth\")\n");
  }
  // Refused before anything is written.
  CHECK_FALSE(boost::filesystem::exists(db));
}

TEST_CASE("CLI: a dry run and chiar slurm refuse an operator's or router's option where it was set", "[cli]") {
  TempDir d("cli-layer-options");
  const std::string db = d.path() + "/r.db";
  const std::string matrix =
      d.write("m.toml",
              "[matrix]\nname = \"m\"\nvariants = [\"base\", \"routed\"]\ntasks = [\"wt\"]\n\n"
              "[model]\nd_model = 16\nn_heads = 2\n\n[train]\nsteps = 2\nbatch_size = 2\n\n"
              "[variants.base]\nlayers = [\"attn\"]\noperators = { attn = { colour = \"blue\" } }\n\n"
              "[variants.routed]\nlayers = [\"dct|attn\"]\nrouter = \"threshold\"\n\n"
              "[tasks.wt]\nplugin = \"wikitext\"\npath = \"corpus\"\n");
  const std::string plugins = std::string(CHIAR_PLUGIN_DIR) + "/";
  const auto dry_run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", matrix, "--dry-run", "--db", db};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_chiar(args);
  };
  // An operator's option, in the variant's table, named at its key (its
  // value's column: toml++ keeps no key positions) with the keys the
  // operator declares.
  const auto op = dry_run({});
  CHECK(op.status == 2);
  const std::string unknown_colour =
      "key 'variants.base.operators.attn.colour': unknown option of operator "
      "'attention' (known: block, chunk_mib, core, heads, recompute_mib, rope, "
      "rope_base)\n";
  CHECK(op.output == "chiar: " + matrix + ":16:33: " + unknown_colour);
  const auto slurm = run_chiar({"slurm", matrix, "--tasks", "2", "--dir", d.path() + "/shards"});
  CHECK(slurm.status == 2);
  CHECK(slurm.output == op.output);
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/shards"));
  // --set replaces the table: the run is then fine.
  CHECK(dry_run({"--only", "base/*", "--set", "model.operators={}"}).status == 0);
  // Options for an operator no plugin provides would apply to nothing.
  const auto nosuch = dry_run({"--only", "base/*", "--set", "model.operators={ nosuch = { x = 1 } }"});
  CHECK(nosuch.status == 2);
  CHECK_THAT(nosuch.output,
             Catch::Matchers::StartsWith("chiar: --set model.operators: unknown operator 'nosuch' (known: attention"));

  // A router's option from --set, unknown or refused by the router.
  const auto colour = dry_run({"--only", "routed/*", "--set", "router.colour=1"});
  CHECK(colour.status == 2);
  CHECK(colour.output == "chiar: --set router.colour: unknown option of router 'threshold' (known: shares, tau)\n");
  const auto kind = dry_run({"--only", "routed/*", "--set", "router.tau=true"});
  CHECK(kind.status == 2);
  CHECK(kind.output ==
        "chiar: --set router.tau: router 'threshold' takes a list of numbers or \"auto\", found a boolean (true)\n");
  const auto tau = dry_run({"--only", "routed/*", "--set", "router.tau=[0.1, 0.2, 0.3]"});
  CHECK(tau.status == 2);
  CHECK(tau.output == "chiar: --set router.tau: router 'threshold' (" + plugins +
                          "libchiar_threshold.so): threshold: 2 operators need 1 thresholds, found 3\n");
  // Target shares as calibration would refuse them, before any run.
  const auto shares = dry_run({"--only", "routed/*", "--set", "router.shares=[0.5, 0.6]"});
  CHECK(shares.status == 2);
  CHECK(shares.output == "chiar: --set router.shares: router 'threshold' (" + plugins +
                             "libchiar_threshold.so): threshold: 'shares' must sum to 1, found 1.100000\n");
  CHECK_FALSE(boost::filesystem::exists(db));
}

TEST_CASE("CLI: a typo in a router's options fails the dry run at its line, with a did-you-mean", "[cli]") {
  TempDir d("cli-router-typo");
  const std::string matrix = d.write("m.toml",
                                     "[matrix]\nname = \"m\"\nvariants = [\"routed\"]\ntasks = [\"wt\"]\n\n"
                                     "[model]\nd_model = 16\nn_heads = 2\n\n"
                                     "[variants.routed]\nlayers = [\"dct|attn\"]\nrouter = \"threshold\"\n"
                                     "router_params = { tua = \"auto\" }\n\n"
                                     "[tasks.wt]\nplugin = \"wikitext\"\npath = \"corpus\"\n");
  const auto typo = run_chiar({"run", matrix, "--dry-run", "--db", d.path() + "/r.db"});
  CHECK(typo.status == 2);
  CHECK(typo.output == "chiar: " + matrix +
                           ":13:25: key 'variants.routed.router_params.tua': unknown option of router 'threshold' "
                           "(did you mean 'tau'?)\n");
  const auto slurm = run_chiar({"slurm", matrix, "--tasks", "2", "--dir", d.path() + "/shards"});
  CHECK(slurm.status == 2);
  CHECK(slurm.output == typo.output);
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/r.db"));
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/shards"));
}

TEST_CASE("CLI: an output the system refuses is an environment failure, exit 3", "[cli]") {
  TempDir d("cli-environment");
  const std::string file = d.write("plain", "a regular file, not a folder\n");
  const auto listops = run_chiar({"data", "listops", "--n", "10", "--out", file + "/out.tsv"});
  CHECK(listops.status == 3);
  CHECK(listops.output == "chiar: " + file + "/out.tsv: cannot write the file: Not a directory\n");

  d.write("speeches/1990_Bush_Republican.txt", "We the people .\n");
  const auto sotu = run_chiar({"data", "sotu", "--from", d.path() + "/speeches", "--out", file + "/sotu"});
  CHECK(sotu.status == 3);
  CHECK(sotu.output == "chiar: sotu: cannot create '" + file + "/sotu': Not a directory\n");

  // Memory running out is the machine's failure too. 8e14 bytes of tokens,
  // beyond any process's address space: refused by every allocator, whatever
  // the machine's overcommit policy.
  const auto model = run_chiar({"model", "--layers", "dct", "--batch", "10000000", "--seq", "10000000"});
  CHECK(model.status == 3);
  CHECK_THAT(model.output, Catch::Matchers::EndsWith(
                               "chiar: out of memory: can't allocate memory: you tried to allocate 800000000000000 "
                               "bytes. Error code 12 (Cannot allocate memory)\n"));
  // In a plugin's factory: an attention operator 2^24 wide (its first (d, d)
  // projection, 2^50 bytes), after an embedding of one token (64 MiB).
  const auto wide = run_chiar({"model", "--layers", "attn", "--vocab", "1", "--d-model", "16777216", "--heads", "1"});
  CHECK(wide.status == 3);
  // (EndsWith: on a loaded machine the runtime probe may warn of a slow BLAS first.)
  CHECK_THAT(wide.output, Catch::Matchers::EndsWith(
                              "chiar: out of memory: can't allocate memory: you tried to allocate 1125899906842624 "
                              "bytes. Error code 12 (Cannot allocate memory)\n"));
}

TEST_CASE("CLI: out-of-memory errors are told apart from the others", "[cli]") {
  const auto thrown_by = [](const auto& throw_it) -> std::pair<bool, std::string> {
    try {
      throw_it();
    } catch (const std::exception& e) {
      return {is_out_of_memory(e), is_out_of_memory(e) ? out_of_memory_message(e) : ""};
    }
    return {false, "nothing thrown"};
  };
  // libtorch's CPU allocator: a plain c10::Error, told by its words.
  const auto cpu = thrown_by([] { (void)at::empty({int64_t{1} << 46}, at::kFloat); });
  CHECK(cpu.first);
  CHECK(cpu.second ==
        "can't allocate memory: you tried to allocate 281474976710656 bytes. Error code 12 (Cannot "
        "allocate memory)");
  // The CUDA allocator's type.
  const auto cuda =
      thrown_by([] { TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB"); });
  CHECK(cuda == std::make_pair(true, std::string("CUDA out of memory. Tried to allocate 2.00 GiB")));
  CHECK(thrown_by([] { throw std::bad_alloc(); }) ==
        std::make_pair(true, std::string("a host allocation failed (std::bad_alloc)")));
  // The CUDA runtime's and libraries' statuses, as libtorch words them.
  for (const std::string words : {"CUDA error: out of memory", "cuFFT error: CUFFT_ALLOC_FAILED",
                                  "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"}) {
    INFO(words);
    CHECK(thrown_by([&] { TORCH_CHECK(false, words); }) == std::make_pair(true, words));
  }
  // A bad length is a bug, not the machine.
  CHECK_FALSE(thrown_by([] { throw std::bad_array_new_length(); }).first);
  // Other libtorch errors, and ours, are not.
  CHECK_FALSE(thrown_by([] { (void)at::ones({2, 3}).matmul(at::ones({2, 3})); }).first);
  CHECK_FALSE(thrown_by([] { throw UserError("can't allocate memory"); }).first);
}

TEST_CASE("runtime: the BLAS warning names the real cause", "[runtime][cli]") {
  engine::RuntimeInfo prescott;
  prescott.blas =
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3 (OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH "
      "NO_AFFINITY USE_OPENMP Prescott MAX_THREADS=64)";
  prescott.blas_core = "Prescott";
  prescott.cpu = "Intel(R) Xeon(R) Platinum 8480+";
  prescott.cpu_flags = {"fpu", "sse2", "avx", "fma", "avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl"};
  prescott.blas_gflops = 39;
  prescott.gemm_gflops = 39;
  prescott.gemm_size = 512;
  SECTION("generic kernels on an AVX-512 processor: set OPENBLAS_CORETYPE, whatever the rate") {
    const std::string expected =
        "warning: OpenBLAS runs its Prescott kernels on this Intel(R) Xeon(R) Platinum 8480+ (AVX-512): set "
        "OPENBLAS_CORETYPE=SkylakeX (the BLAS ran a GEMM at 39.0 GFLOP/s)";
    CHECK(engine::blas_warning(prescott) == expected);
    CHECK_THAT(engine::describe(prescott), Catch::Matchers::EndsWith("\n" + expected));
    engine::RuntimeInfo slow = prescott;
    slow.blas_gflops = 9;
    CHECK_THAT(engine::blas_warning(slow), Catch::Matchers::StartsWith("warning: OpenBLAS runs its Prescott kernels"));
  }
  SECTION("an old core on an AVX2 processor: Haswell") {
    engine::RuntimeInfo avx2 = prescott;
    avx2.blas_core = "NEHALEM";  // a single-target build names its core in capitals
    avx2.cpu = "AMD EPYC 7B12";
    avx2.cpu_flags = {"fpu", "sse2", "avx", "fma", "avx2"};
    CHECK(engine::blas_warning(avx2) ==
          "warning: OpenBLAS runs its NEHALEM kernels on this AMD EPYC 7B12 (AVX2): set OPENBLAS_CORETYPE=Haswell "
          "(the BLAS ran a GEMM at 39.0 GFLOP/s)");
  }
  SECTION("the right core: no warning") {
    engine::RuntimeInfo skylake = prescott;
    skylake.blas_core = "SkylakeX";
    skylake.blas_gflops = 215;
    CHECK(engine::blas_warning(skylake).empty());
    CHECK_THAT(engine::describe(skylake), !Catch::Matchers::Contains("warning"));
    // Haswell's AVX2 kernels on an AVX-512 processor are a deliberate setting
    // on some machines (docs/performance.md), not a fallback.
    engine::RuntimeInfo haswell = skylake;
    haswell.blas_core = "Haswell";
    CHECK(engine::blas_warning(haswell).empty());
    // An old processor on old kernels is as fast as it gets.
    engine::RuntimeInfo old = prescott;
    old.cpu_flags = {"fpu", "sse2", "sse3"};
    CHECK(engine::blas_warning(old).empty());
  }
  SECTION("the reference BLAS, and only it, is blamed as such") {
    engine::RuntimeInfo reference;
    reference.blas = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
    reference.cpu_flags = prescott.cpu_flags;
    reference.blas_gflops = 7.5;
    const std::string blamed =
        "warning: the BLAS runs a GEMM at 7.5 GFLOP/s (< 20.0): libtorch is on the reference BLAS; install "
        "libopenblas0-openmp";
    CHECK(engine::blas_warning(reference) == blamed);
    // As engine::detect_blas() names it: the alternative resolved, the environment appended.
    reference.blas = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0; OPENBLAS_CORETYPE=Haswell";
    CHECK(engine::blas_warning(reference) == blamed);
    engine::RuntimeInfo busy = prescott;
    busy.blas_core = "SkylakeX";
    busy.blas_gflops = 12;
    CHECK(engine::blas_warning(busy) == "warning: the BLAS runs a GEMM at 12.0 GFLOP/s (< 20.0) on " + busy.blas);
  }
}

TEST_CASE("CLI: chiar info says whether the CPU has bf16 instructions, as /proc/cpuinfo lists them", "[runtime][cli]") {
  const auto info = run_chiar({"info", "--threads", "1"});
  REQUIRE(info.status == 0);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {
  }
  std::vector<std::string> found;
  std::istringstream words(line);
  for (std::string w; words >> w;)
    if (w == "avx512_bf16" || w == "amx_bf16") found.push_back(w);
  std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) { return a > b; });
  if (found.empty())
    CHECK_THAT(info.output,
               Catch::Matchers::Contains("bf16       emulated: no bf16 instructions (avx512_bf16, "
                                         "amx_bf16); precision \"bf16\" trains slower than \"fp32\" here\n"));
  else
    CHECK_THAT(info.output, Catch::Matchers::Contains("bf16       native: " + found[0] +
                                                      (found.size() > 1 ? ", " + found[1] : std::string()) + "\n"));
}

TEST_CASE("CLI: chiar info names the kernels OpenBLAS runs", "[runtime][cli]") {
  const auto info = run_chiar({"info", "--threads", "1"});
  REQUIRE(info.status == 0);
  at::mm(at::ones({64, 64}), at::ones({64, 64}));  // maps a lazily loaded BLAS here too
  const std::string core = engine::detect_blas_core();
  CHECK_THAT(info.output, Catch::Matchers::Contains("BLAS core  " + (core.empty() ? "- (not OpenBLAS)" : core) + "\n"));
}
