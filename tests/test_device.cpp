// test_device: train.device and --device. The device is recorded with a
// run but is not part of its hash; a device this build or machine cannot
// give is refused before a store, a data file or a rank is touched, naming
// where the name came from.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/filesystem.hpp>
#include <toml++/toml.h>

#include "chiar/conformance.h"
#include "chiar/error.h"
#include "engine/runtime/device.h"
#include "engine/runtime/queue_mark.h"
#include "engine/store/sqlite.h"
#include "model/model.h"
#include "support/env_scope.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/skip.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

namespace {

// The hidden cases that train on a GPU need one, and a build that lets runs
// use it: without -DCHIAR_CUDA_TRAINING=ON they are skipped, saying so.
#define REQUIRE_CUDA_TRAINING()                                                  \
  do {                                                                           \
    REQUIRE(torch::cuda::is_available());                                        \
    if (!engine::cuda_training_enabled())                                        \
      CHIAR_SKIP("[cuda]",                                                       \
                 "this build refuses CUDA devices for training (configure with " \
                 "-DCHIAR_CUDA_TRAINING=ON, as tools/gpu-check.sh does)");       \
  } while (false)

void write_matrix(const TempDir& d, const std::string& train_extra = "") {
  test::write_one_run_matrix(d, "dev", test::tiny_train_body() + train_extra);
}

std::vector<std::string> run_args(const TempDir& d, const std::string& db) { return test::tiny_run_args(d, db); }

// The first hash `chiar run --dry-run` lists.
std::string dry_run_hash(const TempDir& d, std::vector<std::string> extra = {}) {
  auto args = run_args(d, d.path() + "/dry.db");
  args.push_back("--dry-run");
  args.insert(args.end(), extra.begin(), extra.end());
  const auto out = test::run_chiar(args);
  REQUIRE(out.status == 0);
  const auto line = out.output.find("\n  ");
  REQUIRE(line != std::string::npos);
  return out.output.substr(line + 3, 16);
}

}  // namespace

TEST_CASE("device: names are checked, and the CPU is what auto and cpu resolve to", "[device]") {
  CHECK(engine::device_name_problem("auto").empty());
  CHECK(engine::device_name_problem("cpu").empty());
  CHECK(engine::device_name_problem("cuda").empty());
  CHECK(engine::device_name_problem("cuda:0").empty());
  CHECK(engine::device_name_problem("cuda:12").empty());
  for (const std::string bad : {"gpu", "cuda:", "cuda:x", "CUDA", "cuda:-1", "cpu:0", ""}) {
    INFO(bad);
    CHECK(engine::device_name_problem(bad) == "must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
  }
  CHECK(engine::resolve_device("auto", "x") == "cpu");
  CHECK(engine::resolve_device("cpu", "x") == "cpu");
  CHECK_THROWS_WITH(engine::resolve_device("gpu", "--device"),
                    "--device: \"gpu\" must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
}

TEST_CASE("device: a batch on the CPU is the batch itself; a resolved name is libtorch's device", "[device]") {
  Batch b;
  b.tokens = at::arange(6).view({2, 3});
  b.targets = at::arange(1, 7).view({2, 3});
  b.valid = at::ones({2, 3}, at::kBool);
  const Batch on = engine::batch_on(b, at::Device(at::kCPU));
  CHECK(on.tokens.is_same(b.tokens));
  CHECK(on.targets.is_same(b.targets));
  CHECK(on.valid.is_same(b.valid));
  CHECK_FALSE(on.scored.defined());
  CHECK(engine::torch_device("cpu") == at::Device(at::kCPU));
  CHECK(engine::torch_device("cuda:1") == at::Device(at::kCUDA, 1));
}

TEST_CASE("device: a batch's targets are checked in host memory before it moves, naming the batch", "[device]") {
  Batch lm;
  lm.tokens = at::zeros({2, 3}, at::kLong);
  lm.targets = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 7, 5}).view({2, 3});
  CHECK_NOTHROW(engine::check_batch_targets(lm, 8, true, "task 'lm' training step 4"));
  REQUIRE_THROWS_WITH(engine::check_batch_targets(lm, 7, true, "task 'lm' training step 4"),
                      "task 'lm' training step 4: target 7 at [1, 1] is outside the vocabulary [0, 7)");
  lm.targets[0][2] = -1;
  REQUIRE_THROWS_WITH(engine::check_batch_targets(lm, 8, true, "split 'valid' batch 0"),
                      "split 'valid' batch 0: target -1 at [0, 2] is outside the vocabulary [0, 8)");
  Batch labels;
  labels.tokens = at::zeros({3, 4}, at::kLong);
  labels.targets = at::tensor(std::vector<int64_t>{1, 0, 2});
  CHECK_NOTHROW(engine::check_batch_targets(labels, 3, false, "split 'test' batch 2"));
  REQUIRE_THROWS_WITH(engine::check_batch_targets(labels, 2, false, "split 'test' batch 2"),
                      "split 'test' batch 2: target 2 at [2] is outside the classes [0, 2)");
  labels.targets = labels.targets.to(at::kInt);
  REQUIRE_THROWS_WITH(engine::check_batch_targets(labels, 3, false, "split 'test' batch 2"),
                      "split 'test' batch 2: targets must be int64 in host memory, found Int on cpu");
}

TEST_CASE("device: the CPU bf16 probe predicts how a longer bf16 product sums", "[device][bf16]") {
  const auto a = at::ones({4, 4096}, at::kBFloat16), b = at::ones({4096, 4}, at::kBFloat16);
  const float sum = at::mm(a, b)[0][0].item<float>();
  INFO("4096 products of ones summed to " << sum);
  if (chiar::cpu_bf16_sums_in_fp32())
    CHECK(sum == 4096.f);
  else
    CHECK(sum < 4096.f);
}

TEST_CASE("device: a run records the CPU as cpu, and a GPU as nvidia-smi describes it", "[device]") {
  CHECK(engine::describe_device("cpu") == "cpu");
  // A stand-in for the driver's tool, first on PATH for this test.
  TempDir d("fake-nvidia-smi");
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  struct RestorePath {
    std::string saved;
    ~RestorePath() { setenv("PATH", saved.c_str(), 1); }
  } restore{path};
  setenv("PATH", (d.path() + ":" + path).c_str(), 1);
  const std::string tool = d.write("nvidia-smi",
                                   "#!/bin/sh\n"
                                   "[ \"$4\" = 0 ] || exit 6\n"
                                   "echo 'NVIDIA H200, 143771, 9.0, 570.86.15'\n");
  boost::filesystem::permissions(tool, boost::filesystem::owner_all);
  CHECK(engine::nvidia_smi_description(0) == "NVIDIA H200, 140.4 GiB, compute capability 9.0, driver 570.86.15");
  CHECK(engine::nvidia_smi_description(1) == "nvidia-smi: not found or failed");  // exits 6 for -i 1
  // nvidia-smi ignores CUDA_VISIBLE_DEVICES: CUDA's device 1 is its GPU 0 here.
  setenv("CUDA_VISIBLE_DEVICES", "3,0", 1);
  CHECK(engine::nvidia_smi_description(1) == "NVIDIA H200, 140.4 GiB, compute capability 9.0, driver 570.86.15");
  CHECK(engine::nvidia_smi_description(0) == "nvidia-smi: not found or failed");
  unsetenv("CUDA_VISIBLE_DEVICES");
  d.write("nvidia-smi", "#!/bin/sh\necho 'No devices were found'\n");
  CHECK(engine::nvidia_smi_description(0) == "nvidia-smi: not found or failed");
  setenv("PATH", d.path().c_str(), 1);
  boost::filesystem::remove(tool);
  CHECK(engine::nvidia_smi_description(0) == "nvidia-smi: not found or failed");
}

TEST_CASE("device: the device is not part of a run's hash", "[device][cli]") {
  TempDir d("device-hash");
  write_matrix(d);
  const std::string plain = dry_run_hash(d);
  CHECK(dry_run_hash(d, {"--set", "train.device=cpu"}) == plain);
  write_matrix(d, "device = \"auto\"\n");
  CHECK(dry_run_hash(d) == plain);
  write_matrix(d, "device = \"cpu\"\n");
  CHECK(dry_run_hash(d) == plain);
  // A run trained on the CPU records it.
  const std::string db = d.path() + "/r.db";
  auto args = run_args(d, db);
  args.insert(args.end(), {"--device", "cpu"});
  REQUIRE(test::run_chiar(args).status == 0);
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare("SELECT hash, device FROM runs");
  REQUIRE(q.step());
  CHECK(q.text(0) == plain);
  CHECK(q.text(1) == "cpu");
}

TEST_CASE("device: precision auto is bf16 on a GPU and fp32 on the CPU, and it is resolved before the hash",
          "[device][cli]") {
  CHECK(engine::resolve_precision("auto", "cpu") == "fp32");
  CHECK(engine::resolve_precision("auto", "cuda") == "bf16");
  CHECK(engine::resolve_precision("auto", "cuda:3") == "bf16");
  CHECK(engine::resolve_precision("auto", "gpu") == "fp32");  // refused later, at its key
  CHECK(engine::resolve_precision("auto", "auto") == (engine::auto_device() == "cpu" ? "fp32" : "bf16"));
  CHECK(engine::resolve_precision("auto", "auto", /*host_only=*/true) == "fp32");
  CHECK(engine::resolve_precision("fp32", "cuda") == "fp32");
  CHECK(engine::resolve_precision("bf16", "cpu") == "bf16");
  CHECK(engine::auto_device(/*host_only=*/true) == "cpu");

  TempDir d("device-precision");
  write_matrix(d);
  const std::string plain = dry_run_hash(d);
  const std::string fp32 = dry_run_hash(d, {"--set", "train.precision=fp32"});
  const std::string bf16 = dry_run_hash(d, {"--set", "train.precision=bf16"});
  CHECK(bf16 != fp32);
  // On the CPU the default is fp32, hashed as fp32: stores written before
  // "auto" existed keep their runs. A dry run checks no device, so the hash
  // a GPU would give is visible here: the explicit bf16 one.
  CHECK(dry_run_hash(d, {"--device", "cpu"}) == fp32);
  CHECK(dry_run_hash(d, {"--device", "cuda"}) == bf16);
  CHECK(dry_run_hash(d, {"--device", "cuda", "--set", "train.precision=fp32"}) == fp32);
  if (engine::auto_device() == "cpu") CHECK(plain == fp32);
  write_matrix(d, "precision = \"auto\"\ndevice = \"cuda:0\"\n");
  CHECK(dry_run_hash(d) == bf16);
  CHECK(dry_run_hash(d, {"--device", "cpu"}) == fp32);
  // What a run stores is what it computed in, never "auto".
  write_matrix(d);
  const std::string db = d.path() + "/r.db";
  auto args = run_args(d, db);
  args.insert(args.end(), {"--device", "cpu"});
  REQUIRE(test::run_chiar(args).status == 0);
  CHECK(test::query_integer(db, "SELECT COUNT(*) FROM runs WHERE hash = '" + fp32 +
                                    "' AND spec LIKE '%\"precision\" : \"fp32\"%' AND spec_toml LIKE "
                                    "'%precision = ''fp32''%'") == 1);
}

TEST_CASE("device: CUDA on a libtorch without it is refused before anything runs, naming the source", "[device][cli]") {
  if (engine::built_with_cuda())
    CHIAR_SKIP("[device]", "this libtorch has CUDA; the refusals checked here are a CPU build's");
  TempDir d("device-refuse");
  const std::string db = d.path() + "/r.db";
  const std::string needs = "\"cuda\" needs a libtorch built with CUDA; this build has none\n";

  write_matrix(d, "device = \"cuda\"\n");
  auto from_file = test::run_chiar(run_args(d, db));
  CHECK(from_file.status == 2);
  CHECK(from_file.output.rfind("chiar: " + d.path() + "/m.toml:", 0) == 0);
  CHECK(from_file.output.find(": key 'train.device': " + needs) != std::string::npos);

  write_matrix(d);
  auto args = run_args(d, db);
  args.insert(args.end(), {"--set", "train.device=cuda"});
  const auto from_set = test::run_chiar(args);
  CHECK(from_set.status == 2);
  CHECK(from_set.output == "chiar: --set train.device: " + needs);

  args = run_args(d, db);
  args.insert(args.end(), {"--device", "cuda:1", "--nproc", "2"});
  const auto from_flag = test::run_chiar(args);
  CHECK(from_flag.status == 2);
  CHECK(from_flag.output == "chiar: --device: \"cuda:1\" needs a libtorch built with CUDA; this build has none\n");

  args = run_args(d, db);
  args.insert(args.end(), {"--device", "gpu"});
  CHECK(test::run_chiar(args).output == "chiar: --device: \"gpu\" must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"\n");
  // A dry run lists the hashes a GPU would give without one, but refuses a
  // name no device has.
  args.push_back("--dry-run");
  const auto dry = test::run_chiar(args);
  CHECK(dry.status == 2);
  CHECK(dry.output == "chiar: --device: \"gpu\" must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"\n");

  const auto bench = test::run_chiar({"bench-train", "--device", "cuda", "--steps", "1"});
  CHECK(bench.status == 2);
  CHECK(bench.output == "chiar: --device: " + needs);
  CHECK_FALSE(boost::filesystem::exists(db));
  CHECK_FALSE(boost::filesystem::exists(db + ".checkpoints"));
}

TEST_CASE("device: a device name of the wrong form in a matrix is refused at its key", "[device][cli]") {
  TempDir d("device-form");
  write_matrix(d, "device = \"gpu\"\n");
  const auto out = test::run_chiar(run_args(d, d.path() + "/r.db"));
  CHECK(out.status == 2);
  CHECK(out.output.find("must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"") != std::string::npos);
  CHECK(out.output.rfind("chiar: " + d.path() + "/m.toml:", 0) == 0);
}

// Hidden (chiar_tests "[cuda]" on a GPU, in a build with
// -DCHIAR_CUDA_TRAINING=ON: tools/gpu-check.sh). A CPU run's NULLs are
// checked by the engine's end-to-end test.
TEST_CASE("device: a run on a GPU records the caching allocator's peaks", "[.cuda]") {
  REQUIRE_CUDA_TRAINING();
  TempDir d("device-gpu-memory");
  write_matrix(d);
  auto args = run_args(d, d.path() + "/gpu.db");
  args.insert(args.end(), {"--device", "cuda"});
  const auto out = test::run_chiar(args);
  INFO(out.output);
  REQUIRE(out.status == 0);
  engine::Database con(d.path() + "/gpu.db");
  auto q = con.prepare("SELECT peak_gpu_allocated_mb, peak_gpu_reserved_mb, device FROM runs");
  REQUIRE(q.step());
  CHECK(q.real(0) > 0);
  CHECK(q.real(1) >= q.real(0));  // the allocator holds at least what its tensors use
  CHECK(q.text(2) != "cpu");
}

namespace {

// The tiny matrix of attention layers and a threshold-routed DCT|attention
// layer, each as a language model and as a classifier, seed 0.
void write_four_run_matrix(const TempDir& d, const std::string& name, const std::string& train_body) {
  test::write_tiny_matrix(
      d, "name = \"" + name + "\"\nvariants = [\"base\", \"routed\"]\ntasks = [\"lm\", \"flat\"]\nseeds = [0]\n",
      train_body);
}

// The tiny matrix's test metrics trained on `device`, in a fresh store.
std::vector<double> metrics_on(const TempDir& d, const std::string& db, const std::string& device) {
  auto args = run_args(d, d.path() + "/" + db);
  args.insert(args.end(), {"--device", device});
  const auto out = test::run_chiar(args);
  INFO(out.output);
  REQUIRE(out.status == 0);
  return test::test_split_metrics(d.path() + "/" + db);
}

// Equal within 1e-4, relative to values of at least 1 in size.
void check_close(const std::vector<double>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  REQUIRE_FALSE(expected.empty());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("metric " << i << ": " << got[i] << " against " << expected[i]);
    CHECK(std::abs(got[i] - expected[i]) <= 1e-4 * std::max(1.0, std::abs(expected[i])));
  }
}

}  // namespace

// Hidden (as above). fp32 on both devices and no dropout (the tiny model's
// default), so the two differ by rounding alone: attention layers, a
// threshold-routed DCT|attention layer, a language model and a classifier.
// (A token whose entropy lies within rounding of a threshold could take the
// other operator on one device; at this size none is expected, and a failure
// here names the metric to look at.)
TEST_CASE("device: three fp32 training steps on a GPU score what they score on the CPU", "[.cuda]") {
  REQUIRE_CUDA_TRAINING();
  TempDir d("device-gpu-equal");
  write_four_run_matrix(d, "equal", test::tiny_train_body(3, 3, 3) + "precision = \"fp32\"\nlog_every = 1\n");
  check_close(metrics_on(d, "gpu.db", "cuda"), metrics_on(d, "cpu.db", "cpu"));
  // And each step's training loss, of every run.
  const auto gpu = test::train_logs(d.path() + "/gpu.db"), cpu = test::train_logs(d.path() + "/cpu.db");
  REQUIRE(cpu.size() == 4 * 3);
  REQUIRE(gpu.size() == cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(cpu[i].run << " step " << cpu[i].step << ": " << gpu[i].loss << " on the GPU against " << cpu[i].loss);
    CHECK(gpu[i].run == cpu[i].run);
    CHECK(gpu[i].step == cpu[i].step);
    CHECK(std::abs(gpu[i].loss - cpu[i].loss) <= 1e-4 * std::max(1.0, std::abs(cpu[i].loss)));
  }
}

// Hidden (as above). The default precision on a GPU is bf16: the run's
// hash is the one an explicit bf16 gives, and it trains and scores.
TEST_CASE("device: a run on a GPU computes in bf16 unless its precision is set", "[.cuda]") {
  REQUIRE_CUDA_TRAINING();
  TempDir d("device-gpu-bf16");
  write_matrix(d);
  const std::string bf16 = dry_run_hash(d, {"--set", "train.precision=bf16"});
  CHECK(dry_run_hash(d, {"--device", "cuda"}) == bf16);
  const std::string db = d.path() + "/gpu.db";
  auto args = run_args(d, db);
  args.insert(args.end(), {"--device", "cuda"});
  const auto out = test::run_chiar(args);
  INFO(out.output);
  REQUIRE(out.status == 0);
  CHECK(test::query_integer(db, "SELECT COUNT(*) FROM runs WHERE hash = '" + bf16 + "' AND status = 'done'") == 1);
}

// Hidden (as above). A mark waits for the work queued before it: a copy
// into pinned memory, queued behind fp32 products that keep the GPU busy
// for a while (50 of 4096^3), has landed when wait() returns. The host
// buffer starts as NaN, which a wait that returned early would leave.
TEST_CASE("device: a queue mark on a GPU waits for the copy queued before it", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const at::Device gpu("cuda:0");
  const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(gpu)) / 64.0;  // (n, n)
  at::Tensor x = a;                                                                      // (n, n)
  for (int i = 0; i < 50; ++i) x = at::mm(x, a).tanh_();
  const at::Tensor total = x.sum().to(at::kDouble);  // () on the GPU
  at::Tensor landed = at::full({}, NAN, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  landed.copy_(total, /*non_blocking=*/true);
  engine::QueueMark::after_queued_work(gpu).wait();
  const double value = landed.item<double>();
  CHECK(value == total.item<double>());
}

// Hidden (as above). A GPU reads each step's loss a step late by default
// (CHIAR_LOSS_READS, engine/training/trainer.h); read every step instead it trains
// the same runs: the same losses to fp32 rounding (the two processes may
// sum in different orders where CUDA's kernels use atomics), and a forced
// divergence (a learning rate of 1e12) found at the same step.
TEST_CASE("device: a GPU run whose losses are read late trains as one whose losses are read each step", "[.cuda]") {
  REQUIRE_CUDA_TRAINING();
  TempDir d("device-gpu-loss-reads");
  write_four_run_matrix(d, "reads", test::tiny_train_body(9, 4, 4) + "precision = \"fp32\"\nlog_every = 1\n");
  const auto trained = [&](const std::string& reads, const std::string& db, std::vector<std::string> extra) {
    test::EnvScope env("CHIAR_LOSS_READS", reads);
    auto args = run_args(d, d.path() + "/" + db);
    args.insert(args.end(), {"--device", "cuda"});
    args.insert(args.end(), extra.begin(), extra.end());
    const auto out = test::run_chiar(args);
    INFO(out.output);
    REQUIRE(out.status == 0);
    return d.path() + "/" + db;
  };
  const std::string late = trained("late", "late.db", {}), every = trained("every-step", "every.db", {});
  const auto late_log = test::train_logs(late), every_log = test::train_logs(every);
  REQUIRE(every_log.size() == 4 * 9);
  REQUIRE(late_log.size() == every_log.size());
  for (size_t i = 0; i < every_log.size(); ++i) {
    INFO(late_log[i] << " against " << every_log[i]);
    CHECK(late_log[i].step == every_log[i].step);
    CHECK(std::abs(late_log[i].loss - every_log[i].loss) <= 1e-4 * std::abs(every_log[i].loss));
  }
  check_close(test::test_split_metrics(late), test::test_split_metrics(every));

  const std::vector<std::string> diverging = {"--set", "train.lr=1e12", "--set", "train.clip=0"};
  const std::string sql =
      "SELECT group_concat(name || ':' || diverged_step, ' ') FROM "
      "(SELECT name, diverged_step FROM runs WHERE status = 'diverged' ORDER BY name)";
  const auto diverged_at = [&](const std::string& db) {
    engine::Database con(db, engine::OpenMode::ReadOnly);
    auto q = con.prepare(sql);
    return q.step() ? q.text(0) : std::string();
  };
  const std::string every_nan = trained("every-step", "every-nan.db", diverging);
  REQUIRE(test::query_integer(every_nan, "SELECT COUNT(*) FROM runs WHERE status = 'diverged'") == 4);
  CHECK(diverged_at(trained("late", "late-nan.db", diverging)) == diverged_at(every_nan));
}

// Hidden (as above). A run stopped on one device by SIGTERM (what scancel
// sends) during its fourth step, past its step-3 checkpoint (on the GPU,
// which reads losses a step late, after its fifth), and resumed on the
// other ends where a run on the second device alone ends, to rounding.
TEST_CASE("device: a checkpoint written on a GPU resumes on the CPU, and one from the CPU on a GPU", "[.cuda]") {
  REQUIRE_CUDA_TRAINING();
  TempDir d("device-gpu-resume");
  test::write_tiny_matrix(
      d, R"(name = "resume"
variants = ["routed"]
tasks = ["lm"]
seeds = [0]
)",
      test::tiny_train_body(6, 3, 3) + "precision = \"fp32\"\n");  // explicit: the run moves between devices
  for (const auto& [first, second] :
       std::vector<std::pair<std::string, std::string>>{{"cuda", "cpu"}, {"cpu", "cuda"}}) {
    INFO(first << " then " << second);
    const std::string db = first + "-" + second + ".db";
    auto args = run_args(d, d.path() + "/" + db);
    args.insert(args.end(), {"--device", first});
    setenv("CHIAR_FAILPOINT", "train.step:4:term", 1);
    const auto stopped = test::run_chiar(args);
    unsetenv("CHIAR_FAILPOINT");
    INFO(stopped.output);
    REQUIRE(stopped.status == 130);
    REQUIRE(test::query_integer(d.path() + "/" + db, "SELECT COUNT(*) FROM runs WHERE status = 'interrupted'") == 1);
    const auto resumed = metrics_on(d, db, second);
    check_close(resumed, metrics_on(d, second + "-alone.db", second));
  }
}

namespace {

// The variants of configs/variants.toml, and whether each can model
// language (every operator in its plan is causal, by its traits).
std::vector<std::pair<std::string, bool>> shipped_variants() {
  const toml::table file = toml::parse_file(CHIAR_SOURCE_DIR "/configs/variants.toml");
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& [name, variant] : *file["variants"].as_table()) {
    bool causal = true;
    for (const auto& layer : *variant.as_table()->get("layers")->as_array())
      for (const auto& op : model::split_layer_spec(layer.value_or(std::string())))
        causal = causal && test::make_op(test::plugins().canonical("operator", op), 16, 2)->traits().causal;
    out.emplace_back(std::string(name.str()), causal);
  }
  return out;
}

// Every variant of configs/variants.toml on `device`, in its default
// precision, at the tiny model's size, five steps: language modelling for
// the causal ones, classification for all. The first run is stopped by
// SIGTERM during its third step, past its step-2 checkpoint: on the CPU it
// stops after that step; on a GPU, which reads each step's loss a step
// late, after the fourth (engine/training/trainer.h, LossReads). The second call
// resumes it and trains the rest. Then every run is done on `device`, and
// each best checkpoint is inspected (on the CPU).
void train_every_variant(const TempDir& d, const std::string& device) {
  test::write_tiny_corpus(d);
  const auto variants = shipped_variants();
  std::string causal, all;
  int64_t n_causal = 0;
  for (const auto& [v, lm] : variants) {
    all += "\"" + v + "\", ";
    if (lm) causal += "\"" + v + "\", ";
    n_causal += lm ? 1 : 0;
  }
  REQUIRE(n_causal > 0);
  REQUIRE(n_causal < static_cast<int64_t>(variants.size()));  // fnet: classification only
  const std::string include = std::string("include = [\"") + CHIAR_SOURCE_DIR + "/configs/variants.toml\"]\n";
  const std::string shared = test::kTinyModelTable + "\n[train]\n" + test::tiny_train_body(5, 2, 2) + "\n" +
                             test::kTinyLmTask + "\n" + test::kTinyFlatTask;
  for (const auto& [name, listed, task] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"lm", causal, "lm"}, {"cls", all, "flat"}}) {
    INFO(name << " on " << device);
    d.write(name + ".toml", include + "[matrix]\nname = \"" + name + "\"\nvariants = [" + listed + "]\ntasks = [\"" +
                                task + "\"]\nseeds = [0]\n\n" + shared);
    const std::string db = d.path() + "/" + name + ".db";
    const std::vector<std::string> args = {"run",         d.path() + "/" + name + ".toml",
                                           "--db",        db,
                                           "--data-root", d.path(),
                                           "--cache-dir", d.path() + "/cache",
                                           "--device",    device};
    setenv("CHIAR_FAILPOINT", "train.step:3:term", 1);
    const auto stopped = test::run_chiar(args);
    unsetenv("CHIAR_FAILPOINT");
    INFO(stopped.output);
    REQUIRE(stopped.status == 130);
    const int64_t stopped_at = test::query_integer(db, "SELECT MAX(step) FROM checkpoints WHERE kind = 'state'");
    CHECK(stopped_at == (device == "cpu" ? 3 : 4));
    const auto resumed = test::run_chiar(args);
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    const int64_t runs = test::query_integer(db, "SELECT COUNT(*) FROM runs");
    CHECK(runs == (task == "lm" ? n_causal : static_cast<int64_t>(variants.size())));
    CHECK(test::query_integer(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == runs);
    CHECK(test::query_integer(db, "SELECT COUNT(*) FROM runs WHERE device " +
                                      std::string(device == "cpu" ? "=" : "<>") + " 'cpu'") == runs);
    engine::Database con(db, engine::OpenMode::ReadOnly);
    auto q = con.prepare("SELECT name FROM runs ORDER BY id");
    while (q.step()) {
      const auto shown = test::run_chiar({"inspect", db, "--run", q.text(0), "--text", "the route of a token", "--tsv",
                                          "--data-root", d.path(), "--cache-dir", d.path() + "/cache"});
      INFO(q.text(0) << ": " << shown.output);
      CHECK(shown.status == 0);
    }
  }
}

}  // namespace

// Hidden (as above): issue 17's promise for every shipped variant.
TEST_CASE("device: every shipped variant trains, resumes and is inspected after training on a GPU", "[.cuda]") {
  REQUIRE_CUDA_TRAINING();
  TempDir d("device-gpu-variants");
  train_every_variant(d, "cuda");
}

// The same on the CPU, where it also keeps every shipped variant trainable,
// resumable and inspectable.
TEST_CASE("device: every shipped variant trains, resumes and is inspected on the CPU", "[engine][device]") {
  TempDir d("device-cpu-variants");
  train_every_variant(d, "cpu");
}
