// chiar: the harness command line. Parsing lives here; commands.h has the bodies.
#include <CLI/CLI.hpp>
#include <boost/filesystem/exception.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "engine/runtime/runtime.h"
#include "chiar/error.h"
#include "commands.h"

namespace {

using namespace chiar::cli;

// Every command's arguments, as parsing fills them in.
struct Args {
  Global g;
  std::string input = "-", dct_impl = "auto";  // entropy
  ModelArgs m;
  DataArgs d;
  ListOpsArgs l;
  SotuArgs so;
  RunArgs r;
  SlurmArgs sl;
  MergeArgs mg;
  ShowArgs sh, ex;
  ReportArgs rep;
  PlanArgs plan;
  InspectArgs ins;
  BenchTrainArgs bt;
  NewPluginArgs np;
};

// The subcommands, to tell which one was given.
struct Commands {
  CLI::App *info = nullptr, *plugins = nullptr, *options = nullptr, *entropy = nullptr, *model = nullptr;
  CLI::App *stats = nullptr, *listops = nullptr, *sotu = nullptr;
  CLI::App *run = nullptr, *slurm = nullptr, *merge = nullptr, *show = nullptr, *exp = nullptr, *report = nullptr,
           *inspect = nullptr;
  CLI::App* plan = nullptr;
  CLI::App *bench = nullptr, *newp = nullptr;
};

// An integer option's lower bound, said as the other size checks say it
// ("--nproc: must be at least 1, found 0"): CLI11's own range check prints
// its bounds as doubles, the upper one 309 digits long.
CLI::Validator at_least(long long low) {
  return CLI::Validator(
      [low](std::string& text) -> std::string {
        long long value = 0;
        size_t used = 0;
        try {
          value = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "expected an integer, found '" + text + "'";
        return value < low ? "must be at least " + std::to_string(low) + ", found " + text : "";
      },
      ">= " + std::to_string(low));
}

void add_global_options(CLI::App& app, Global& g) {
  app.add_option("--threads", g.threads, "intra-op threads (0 = all cores)")->check(at_least(0));
  app.add_option("--gemm", g.gemm, "library for the model's products: auto (the faster, measured), blas, onednn")
      ->check(CLI::IsMember({"auto", "blas", "onednn"}));
  app.add_option("--plugin-dir", g.plugin_dirs, "extra plugin folder (repeatable)");
}

void add_info_commands(CLI::App& app, Args& a, Commands& c) {
  c.info = app.add_subcommand("info", "libtorch, threads, BLAS and the measured GEMM rate");
  c.plugins = app.add_subcommand("plugins", "list every plugin: name, kind, description, file, API");
  c.options = app.add_subcommand(
      "options", "every [model] and [train] option, and every plugin's: key, kind, default, meaning (Markdown)");
  c.entropy = app.add_subcommand("entropy", "spectral entropy of each line's vector (float64, 12 significant digits)");
  c.entropy->add_option("file", a.input, "input file, or - for stdin");
  c.entropy->add_option("--dct", a.dct_impl, "DCT implementation: auto, gemm, fft");
}

void add_model_command(CLI::App& app, Args& a, Commands& c) {
  ModelArgs& m = a.m;
  auto* model = c.model = app.add_subcommand("model", "build a model from a layer plan; print it and its size");
  model->add_option("--layers", m.layers, "layer plan, e.g. dct 'dct|attn' 'dct|attn' attn")
      ->delimiter(',')
      ->required();
  model->add_option("--router", m.router, "router plugin of the routed layers (required when a layer is routed)");
  model->add_option("--router-set", m.router_set, "router option key=value (repeatable)");
  model->add_option("--op-set", m.operator_set, "operator option op.key=value (repeatable)");
  model->add_option("--head", m.head, "lm or classifier");
  model->add_option("--meta-router", m.meta_router, "none, causal or batch_mean");
  model->add_option("--vocab", m.vocab, "vocabulary size");
  model->add_option("--d-model", m.d_model, "model width");
  model->add_option("--heads", m.heads, "attention heads");
  model->add_option("--classes", m.classes, "classes (classifier head)");
  model->add_option("--seed", m.seed, "seed");
  model->add_option("--batch", m.batch, "with --seq: run one forward pass and print routing shares")
      ->check(at_least(0));
  model->add_option("--seq", m.seq, "sequence length of that forward pass")->check(at_least(0));
}

// --decide and the design's options, for `run` and `slurm` alike.
template <class WithDesign>
CLI::Option* add_decide_options(CLI::App* command, WithDesign& args, const std::string& what) {
  CLI::Option* decide = command->add_option("--decide", args.decide, what);
  command->add_option("--max-seeds", args.max_seeds, "with --decide: the most seeds (default: every seed listed)")
      ->check(at_least(3))
      ->needs(decide);
  command->add_option("--rounds", args.rounds, "with --decide: the rounds of seeds (default 3)")
      ->check(at_least(1))
      ->needs(decide);
  command->add_option("--baseline", args.baseline, "with --decide: the variant \"$baseline\" names (default baseline)")
      ->needs(decide);
  return decide;
}

// Also sets the data and cache folders' defaults, which run and inspect share.
void add_data_commands(CLI::App& app, Args& a, Commands& c) {
  auto* data = app.add_subcommand("data", "inspect and prepare task data")->require_subcommand(1);
  DataArgs& d = a.d;
  d.data_root = std::getenv("CHIAR_DATA_ROOT") ? std::getenv("CHIAR_DATA_ROOT") : "../shared/data";
  d.cache_dir = ".cache";
  auto* stats = c.stats =
      data->add_subcommand("stats", "per split: examples, tokens, vocabulary, <unk> rate, labels, lengths");
  stats->add_option("file", d.config_file, "TOML file holding the task table");
  stats->add_option("--table", d.table, "the task's table in that file, e.g. tasks.wikitext2");
  stats->add_option("--task", d.task, "a task plugin, instead of a TOML table");
  stats->add_option("--set", d.set, "task option key=value (repeatable)");
  stats->add_option("--data-root", d.data_root, "folder relative data paths start from (env CHIAR_DATA_ROOT)");
  stats->add_option("--cache-dir", d.cache_dir, "folder for trained tokenisers and extracted archives");

  ListOpsArgs& l = a.l;
  auto* listops = c.listops = data->add_subcommand("listops", "generate ListOps (LRA's generator) as LRA TSV");
  listops->add_option("--n", l.n, "examples")->required();
  listops->add_option("--seed", l.seed, "seed (same seed, same bytes)");
  listops->add_option("--min-len", l.min_len, "keep length > this (default 500)");
  listops->add_option("--max-len", l.max_len, "keep length < this (default 2000)");
  listops->add_option("--max-depth", l.max_depth, "maximum depth (default 10)");
  listops->add_option("--max-args", l.max_args, "maximum arguments per operator (default 10; flat: 8)");
  listops->add_option("--min-args", l.min_args, "flat only: minimum arguments (default 4)");
  listops->add_flag("--flat", l.flat, "the paper's flat variant: one operator over digits");
  listops->add_option("--out", l.out, "output TSV")->required();

  SotuArgs& so = a.so;
  auto* sotu = c.sotu = data->add_subcommand("sotu", "State of the Union speeches -> WikiText layout, split by year");
  sotu->add_option("--from", so.from, "folder of <year>_<name>_<party>.txt files")->required();
  sotu->add_option("--out", so.out, "output folder")->required();
  sotu->add_option("--valid-from", so.valid_from, "first validation year (default 1981)");
  sotu->add_option("--test-from", so.test_from, "first test year (default 2001)");
}

void add_run_command(CLI::App& app, Args& a, Commands& c) {
  RunArgs& r = a.r;
  r.data_root = a.d.data_root;
  r.cache_dir = a.d.cache_dir;
  auto* run = c.run = app.add_subcommand("run", "run an ablation matrix: every unfinished run, recorded in SQLite");
  run->add_option("config", r.config, "matrix TOML file")->required();
  run->add_option("--db", r.db, "results database (default results/<matrix>.db)");
  run->add_option("--set", r.set, "override model.KEY, train.KEY, task.KEY or router.KEY (repeatable)");
  run->add_option("--only", r.only, "only runs whose name matches this glob (variant/task/seed=S)");
  run->add_option("--shard", r.shard, "K/N: run a deterministic 1/N of the matrix");
  run->add_flag("--dry-run", r.dry_run, "print the runs, their hashes and what would be skipped");
  run->add_option("--data-root", r.data_root, "folder relative data paths start from (env CHIAR_DATA_ROOT)");
  run->add_option("--cache-dir", r.cache_dir, "folder for trained tokenisers and extracted archives");
  run->add_option("--device", r.device, "auto, cpu, cuda or cuda:N for every run (not part of run hashes)");
  run->add_option("--nproc", r.nproc, "train each run data-parallel over N local processes (c10d, Gloo)")
      ->check(at_least(1));
  run->add_flag("--retry-failed", r.retry_failed,
                "start the runs recorded failed again, as new (after fixing what failed them)");
  run->add_flag("--sole-writer", r.sole_writer,
                "no other process writes the store: resume a run left 'running' at once (Slurm array tasks)");
  CLI::Option* decide = add_decide_options(
      run, r,
      "CLAIMS: add seeds in rounds by a group-sequential design, testing these claims' comparisons after "
      "each round");
  auto* round_from = run->add_option("--round-from", r.round_from,
                                     "with --decide and --round (and --shard): run this part of that round of the "
                                     "design this store holds (what chiar slurm --decide's array tasks do)")
                         ->needs(decide);
  auto* round = run->add_option("--round", r.round, "with --round-from: the round the task was written for")
                    ->check(at_least(1))
                    ->needs(round_from);
  round_from->needs(round);
}

// Scale-out: a matrix as a Slurm job array, and its shard stores merged.
void add_scale_out_commands(CLI::App& app, Args& a, Commands& c) {
  SlurmArgs& s = a.sl;
  s.data_root = a.d.data_root;
  s.cache_dir = a.d.cache_dir;
  auto* slurm = c.slurm =
      app.add_subcommand("slurm", "write (and --submit) an sbatch job array running a matrix in shards");
  slurm->add_option("config", s.config, "matrix TOML file")->required();
  slurm->add_option("--tasks", s.tasks, "array tasks: task i runs shard i/N into DIR/shard-i.db")->required();
  slurm->add_option("--dir", s.dir, "shard stores, logs and the script (default results/<matrix>)");
  slurm->add_option("--partition", s.partition, "#SBATCH --partition");
  slurm->add_option("--time", s.time, "#SBATCH --time per task (SIGTERM 2 minutes before: checkpoint, resumable)");
  slurm->add_option("--cpus-per-task", s.cpus_per_task, "#SBATCH --cpus-per-task, and each run's threads");
  slurm->add_option("--gpus-per-task", s.gpus_per_task, "#SBATCH --gpus-per-task");
  slurm->add_option("--mem", s.mem, "#SBATCH --mem, e.g. 16G");
  slurm->add_option("--account", s.account, "#SBATCH --account");
  slurm->add_option("--extra", s.extra, "a further '#SBATCH ...' line (repeatable)");
  slurm->add_option("--set", s.set, "override passed to every task's chiar run (repeatable)");
  slurm->add_option("--only", s.only, "only runs whose name matches this glob");
  slurm->add_option("--chiar", s.chiar, "the chiar binary the tasks run (default: this one)");
  slurm->add_option("--data-root", s.data_root, "folder relative data paths start from (env CHIAR_DATA_ROOT)");
  slurm->add_option("--cache-dir", s.cache_dir, "folder for trained tokenisers and extracted archives");
  slurm->add_flag("--submit", s.submit, "submit it with sbatch and print the job id");
  slurm->add_flag("--retry-failed", s.retry_failed,
                  "start the runs recorded failed in the shard stores again, as new, once, before the job");
  add_decide_options(slurm, s,
                     "CLAIMS: one array per round of a group-sequential design; run again after each array ends to "
                     "look at its round and write the next");

  MergeArgs& m = a.mg;
  auto* merge = c.merge =
      app.add_subcommand("merge", "copy every run of several stores (or folders of shards) into one");
  merge->add_option("out", m.out, "the store to merge into (created when missing)")->required();
  merge->add_option("inputs", m.inputs, "stores, or folders of *.db stores")->required();
}

// show, export and report: the results of a database.
void add_result_commands(CLI::App& app, Args& a, Commands& c) {
  ShowArgs& sh = a.sh;
  auto* show = c.show = app.add_subcommand("show", "print the results table of a database");
  show->add_option("db", sh.dbs, "results database(s), or folders of shard stores")->required();
  ShowArgs& ex = a.ex;
  auto* exp = c.exp = app.add_subcommand("export", "write the results as CSV or JSON");
  exp->add_option("db", ex.dbs, "results database(s), or folders of shard stores")->required();
  exp->add_flag("--csv", ex.csv, "CSV");
  exp->add_flag("--json", ex.json, "JSON");
  exp->add_option("--out", ex.out, "output file (default: standard output)");

  ReportArgs& rep = a.rep;
  auto* report = c.report =
      app.add_subcommand("report", "write a Markdown and a self-contained HTML report with charts");
  report->add_option("db", rep.dbs, "results database(s), or folders of shard stores")->required();
  report->add_option("--out", rep.out, "output path without extension (default reports/<db name>)");
  report->add_option("--baseline", rep.baseline, "the variant reductions and speed-ups compare with");
  report->add_option("--claims", rep.claims, "the paper's claims to check (default configs/claims.toml)");
  report->add_flag("--allow-mixed-code", rep.allow_mixed_code,
                   "judge claim rows whose runs come from several commits, a dirty tree or several product "
                   "libraries (each such row says so) instead of leaving them without a verdict");

  PlanArgs& pl = a.plan;
  auto* plan = c.plan = app.add_subcommand("plan", "the seeds each claim's comparisons need, from a pilot store");
  plan->add_option("matrix", pl.config, "the matrix file of the main run")->required();
  plan->add_option("--pilot", pl.pilot, "the pilot's store(s), 3 seeds at least")->required();
  plan->add_option("--claims", pl.claims, "the claims the report will check (default configs/claims.toml)");
  plan->add_option("--baseline", pl.baseline, "the variant \"$baseline\" names (default baseline)");
  plan->add_option("--power", pl.power, "the power to plan for (default 0.8)")
      ->check(CLI::Range(0.5, 0.999).description("between 0.5 and 0.999"));
  plan->add_option("--max-seeds", pl.max_seeds, "the most seeds to plan (default 50)")->check(at_least(3));
  plan->add_option("--out", pl.out, "write the TOML here instead of standard output");
}

void add_inspect_command(CLI::App& app, Args& a, Commands& c) {
  InspectArgs& ins = a.ins;
  ins.data_root = a.d.data_root;
  ins.cache_dir = a.d.cache_dir;
  auto* inspect = c.inspect = app.add_subcommand("inspect", "per-token spectral entropy and route of a finished run");
  inspect->add_option("source", ins.db, "results database, or a run's checkpoint folder or .pt file")->required();
  inspect->add_option("--run", ins.run, "with a database: run id, name or hash (see chiar show)");
  inspect->add_option("--checkpoint", ins.checkpoint, "best (default) or last");
  inspect->add_option("--text", ins.text, "text to inspect");
  inspect->add_option("--file", ins.file, "file to inspect (- for stdin, the default without --text)");
  inspect->add_flag("--tsv", ins.tsv, "tab-separated output: token, id, H and route per routed layer");
  inspect->add_option("--html", ins.html, "write a heatmap page (tokens coloured by route, H on hover)");
  inspect->add_option("--corpus", ins.corpus,
                      "summarise routes over this text file: tokens most/least sent to attention");
  inspect->add_option("--top", ins.top, "tokens listed by --corpus (15)")->check(at_least(1));
  inspect->add_option("--min-count", ins.min_count, "occurrences a token needs to be listed (5)")->check(at_least(1));
  inspect->add_option("--max-tokens", ins.max_tokens, "words of --corpus read (20000)")->check(at_least(1));
  inspect->add_option("--color", ins.color, "auto, always or never")->check(CLI::IsMember({"auto", "always", "never"}));
  inspect->add_option("--data-root", ins.data_root, "folder relative data paths start from");
  inspect->add_option("--cache-dir", ins.cache_dir, "folder for trained tokenisers and extracted archives");
}

void add_bench_command(CLI::App& app, Args& a, Commands& c) {
  BenchTrainArgs& bt = a.bt;
  auto* bench = c.bench =
      app.add_subcommand("bench-train", "training and inference tokens/s per variant, against the GEMM rate");
  bench->add_option("--variants", bt.variants, "variants (default baseline,chiar_dct_attn)")->delimiter(',');
  bench->add_option("--variants-file", bt.variants_file, "where the variants are defined");
  bench->add_option("--vocab", bt.vocab, "vocabulary (8192)");
  bench->add_option("--batch", bt.batch, "batch (8)");
  bench->add_option("--seq", bt.seq, "sequence length (256)");
  bench->add_option("--d-model", bt.d_model, "width (256)");
  bench->add_option("--layers", bt.layers, "layers (4)");
  bench->add_option("--heads", bt.heads, "heads (4)");
  bench->add_option("--steps", bt.steps, "timed steps (10)");
  bench->add_option("--warmup", bt.warmup, "warm-up steps (3)");
  bench->add_option("--classes", bt.classes,
                    "classify into N classes (bidirectional, e.g. --vocab 256 for bytes) instead of causal LM (0)");
  bench
      ->add_option("--compare-gemm", bt.gemm_backends,
                   "run every variant on each of these GEMM libraries, interleaved (e.g. blas,onednn)")
      ->delimiter(',')
      ->check(CLI::IsMember({"blas", "onednn"}));
  bench->add_option("--device", bt.device, "auto, cpu, cuda or cuda:N");
  auto* precision =
      bench->add_option("--precision", bt.precision, "auto (bf16 on a GPU, fp32 on the CPU), fp32 or bf16 (autocast)")
          ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  bench
      ->add_option("--compare-precision", bt.precisions,
                   "run every variant in each of these precisions, interleaved (fp32,bf16)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->excludes(precision);
  bench->add_option("--op-times", bt.op_time_steps,
                    "after the timed steps, N more per variant timed operator by operator: self ms per step (0)");
  bench->add_option("--json", bt.json, "also write the results as JSON");
}

void add_new_plugin_command(CLI::App& app, Args& a, Commands& c) {
  NewPluginArgs& np = a.np;
  auto* newp = c.newp =
      app.add_subcommand("new-plugin", "write a ready-to-build plugin folder (operator, router or task)");
  newp->add_option("kind", np.kind, "operator, router or task")->required();
  newp->add_option("name", np.name, "plugin name (lower case, digits, _)")->required();
  newp->add_option("--dir", np.dir, "parent folder (default .)");
}

// Runs the command that was given.
int dispatch(Args& a, const Commands& c) {
  const Global& g = a.g;
  if (*c.info) return run_info(g);
  if (*c.plugins) return run_plugins(g);
  if (*c.options) return run_options(g);
  if (*c.entropy) return run_entropy(g, a.input, a.dct_impl);
  if (*c.model) return run_model(g, a.m);
  if (*c.stats) return run_data_stats(g, a.d);
  if (*c.listops) {
    if (a.l.flat && !c.listops->count("--max-args")) a.l.max_args = 8;
    return run_data_listops(g, a.l);
  }
  if (*c.sotu) return run_data_sotu(g, a.so);
  if (*c.run) return run_run(g, a.r);
  if (*c.slurm) return run_slurm(g, a.sl);
  if (*c.merge) return run_merge(g, a.mg);
  if (*c.show) return run_show(g, a.sh);
  if (*c.exp) return run_export(g, a.ex);
  if (*c.report) return run_report(g, a.rep);
  if (*c.plan) return run_plan(g, a.plan);
  if (*c.inspect) return run_inspect(g, a.ins);
  if (*c.bench) return run_bench_train(g, a.bt);
  if (*c.newp) return run_new_plugin(g, a.np);
  return 0;
}

// The one line a failing command ends with, written in one piece: the ranks
// of a data-parallel run share stderr and may fail together, and a line
// written a part at a time interleaves with another rank's.
void print_error(const std::string& message) {
  const std::string line = "chiar: " + message + "\n";
  std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
  std::cerr.flush();
}

// "<path>: cannot create directory: File exists" from Boost's
// "boost::filesystem::create_directory: File exists: \"<path>\"".
std::string filesystem_message(const boost::filesystem::filesystem_error& e) {
  std::string operation = e.what();
  const std::string lead = "boost::filesystem::";
  if (operation.rfind(lead, 0) == 0) operation = operation.substr(lead.size());
  operation = operation.substr(0, operation.find(':'));
  std::replace(operation.begin(), operation.end(), '_', ' ');
  const std::string path = e.path1().empty() ? std::string("a folder") : e.path1().string();
  return path + ": cannot " + operation + ": " + e.code().message();
}

}  // namespace

int main(int argc, char** argv) {
  chiar::engine::configure_allocator();
  CLI::App app{"chiar: benchmark and ablation harness for spectral-entropy routed transformers"};
  app.require_subcommand(1);
  // Options a subcommand does not know go up to its parent: users type the
  // global ones after the command too (`chiar plugins --plugin-dir D`).
  // Subcommands inherit this when they are added, so it comes first.
  app.fallthrough();
  Args a;
  Commands c;
  add_global_options(app, a.g);
  // In this order in the help.
  add_info_commands(app, a, c);
  add_model_command(app, a, c);
  add_data_commands(app, a, c);
  add_run_command(app, a, c);
  add_scale_out_commands(app, a, c);
  add_result_commands(app, a, c);
  add_inspect_command(app, a, c);
  add_bench_command(app, a, c);
  add_new_plugin_command(app, a, c);

  a.g.argv.assign(argv, argv + argc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return 2;
  }

  // The error policy (docs: DESIGN, 'Error policy'): bad input 2, a failing
  // environment 3, anything else 1 with its message alone, never a libtorch
  // backtrace or "terminate called".
  try {
    const int status = dispatch(a, c);
    // A full disk or closed pipe behind standard output shows only here.
    if (std::fflush(stdout) != 0 || !std::cout.flush()) {
      print_error(std::string("standard output: cannot write: ") + std::strerror(errno));
      return 3;
    }
    return status;
  } catch (const chiar::UserError& e) {
    print_error(e.what());
    return 2;
  } catch (const chiar::EnvironmentError& e) {
    print_error(e.what());
    return 3;
  } catch (const boost::filesystem::filesystem_error& e) {
    // A folder the command had to make or use: its path and the cause,
    // not Boost's "boost::filesystem::create_directory: ...".
    print_error(filesystem_message(e));
    return 3;
  } catch (const std::exception& e) {
    // Memory running out is the machine failing under a correct request.
    if (chiar::is_out_of_memory(e)) {
      print_error("out of memory: " + chiar::out_of_memory_message(e));
      return 3;
    }
    print_error(chiar::message_of(e));
    return 1;
  }
}
