#include "trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <sys/resource.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "core/autocast_compat.h"
#include "model/model.h"
#include "engine/cluster/data_parallel.h"
#include "engine/cluster/process_group.h"
#include "engine/runtime/device.h"
#include "engine/runtime/failpoint.h"
#include "engine/runtime/gpu_memory.h"
#include "engine/runtime/queue_mark.h"
#include "engine/runtime/runtime.h"
#include "engine/training/accounting.h"
#include "engine/training/checkpoint_dir.h"
#include "engine/training/evaluation.h"
#include "engine/training/gradient_clipping.h"
#include "engine/training/param_groups.h"
#include "engine/training/run_checkpoints.h"
#include "engine/training/training_state.h"
#include "chiar/adamw.h"
#include "chiar/error.h"
#include "chiar/metrics.h"

namespace chiar::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// Loss of a batch: mean token cross-entropy over the real tokens (language
// model, from the hidden states through the fused head: out has no logits)
// or example cross-entropy (classifier), plus the routers' regularisers.
at::Tensor loss_of(const model::ChiarModel& model, const model::ModelOutput& out, const Batch& b, TaskHead head) {
  at::Tensor loss;
  if (head == TaskHead::LanguageModel) {
    at::Tensor weights;  // (B, T) valid / #valid, or undefined for the mean
    if (b.valid.defined()) {
      const auto w = b.valid.to(at::kFloat);
      weights = w / w.sum().clamp_min(1.0);
    }
    loss = model.lm_loss(out, b.targets, weights);
  } else {
    loss = at::cross_entropy_loss(out.logits.to(at::kFloat), b.targets);
  }
  return out.aux_loss.defined() ? loss + out.aux_loss : loss;
}

// Seconds spent in the harness's own work during training, by kind.
struct Overhead {
  double steps = 0;        // training steps: forward, backward, optimizer
  double store = 0;        // store writes: logs, heartbeats, metrics, FLOPs, routing
  double accounting = 0;   // FLOP accounting and routing statistics
  double progress = 0;     // the progress callback
  double checkpoints = 0;  // state and best-model checkpoints
  double evaluation = 0;   // validation during training (the experiment, not overhead)
  double reduction = 0;    // data-parallel: averaging gradients and agreeing over ranks (part of steps)

  double fraction() const { return steps > 0 ? (store + accounting + progress) / steps : 0.0; }
  std::string json() const {
    std::ostringstream s;
    s.precision(6);
    s << "{\"steps_s\": " << steps << ", \"store_s\": " << store << ", \"accounting_s\": " << accounting
      << ", \"progress_s\": " << progress << ", \"checkpoints_s\": " << checkpoints
      << ", \"evaluation_s\": " << evaluation << ", \"reduction_s\": " << reduction << ", \"fraction\": " << fraction()
      << ", \"checkpoint_fraction\": " << (steps > 0 ? checkpoints / steps : 0.0) << "}";
    return s.str();
  }
};

// Adds the seconds `f` takes to `into`.
template <typename F>
void timed(double& into, F&& f) {
  const auto t0 = Clock::now();
  f();
  into += seconds_since(t0);
}

void record_accounting(Store& store, const std::string& hash, int64_t step, const Accounting& a) {
  store.add_flops(hash, step, a.flops, a.reference_attention_fwd);
  for (const auto& l : a.routing) store.add_routing(hash, step, l.layer, l.shares, l.histogram);
}

std::string json_list(const std::vector<double>& v) {
  std::ostringstream s;
  s.precision(10);
  s << '[';
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << ']';
  return s.str();
}

std::string thresholds_json(const model::ChiarModel& model) {
  std::string out = "{";
  for (const auto& layer : model.mixing_layers())
    if (layer->routed()) {
      const int64_t li = static_cast<int64_t>(&layer - &model.mixing_layers()[0]);
      out += std::string(out.size() > 1 ? ", " : "") + "\"layer" + std::to_string(li + 1) +
             "\": " + json_list(layer->router()->thresholds());
    }
  return out + "}";
}

// The model, moved to the device before an optimiser holds its parameters.
// It is built on the CPU under its seed, so its initial weights do not
// depend on the device.
model::ChiarModel& on_device(model::ChiarModel& model, const at::Device& device) {
  if (!device.is_cpu()) model.to(device);
  return model;
}

// One run in training: its model and optimiser, and what its phases share.
// The checkpoint files have their own keeper (run_checkpoints.h), and what a
// checkpoint resumes from its own type (training_state.h). The optimiser is
// a member, not a reference, so that its step stays a direct call.
struct Run {
  Run(const RunSpec& s, const TrainContext& c)
      : spec(s),
        ctx(c),
        t(s.train),
        bf16(resolve_precision(s.train.precision, c.device) == "bf16"),
        device(torch_device(c.device)),
        model(c.registry, model_options_for(s, c.task)),
        optimizer(param_groups(on_device(model, device), s.train)),
        group(c.group),
        writer(c.store != nullptr) {
    if (writer) checkpoints.emplace(*c.store, s.hash, c.checkpoint_dir, c.tag);
  }

  const RunSpec& spec;
  const TrainContext& ctx;
  const TrainOptions& t;
  const bool bf16;
  const at::Device device;  // the model's, its optimiser state's and each batch's
  model::ChiarModel model;
  FusedAdamW optimizer;
  ProcessGroup* const group;                  // data-parallel ranks; null for one process
  const bool writer;                          // records the store and checkpoints (rank 0, or the only process)
  std::optional<RunCheckpoints> checkpoints;  // the writer's
  // Where this process began (its step is the first it trains, its seconds
  // those of earlier processes), and the best validation score as it goes.
  ResumePoint point;
  Clock::time_point started;
  std::vector<double> step_ms, step_tps;
  Overhead overhead;

  // Where training stands after step `done`, for a checkpoint.
  ResumePoint at_step(int64_t done, bool validated) const {
    ResumePoint p = point;
    p.step = done;
    p.validate_first = !validated;
    p.train_seconds = point.train_seconds + seconds_since(started);
    return p;
  }
};

// Calibrates data-derived router settings on the first training batches,
// in the precision the run trains in: under bf16 the router sees entropies
// of bf16 coefficients, and thresholds from fp32 ones would give other shares.
// Returns what calibrated them (JSON), or "" when there were none.
std::string calibrate_routers(model::ChiarModel& model, const Task& task, const RunSpec& spec, const at::Device& device,
                              bool bf16) {
  const TrainOptions& t = spec.train;
  std::vector<at::Tensor> tokens, valid;
  int64_t longest = 0;
  std::vector<Batch> sample;
  for (int64_t i = 0; i < t.calibration_batches; ++i) {
    sample.push_back(task.train_batch(static_cast<uint64_t>(spec.seed), i, t.batch_size));
    longest = std::max(longest, sample.back().tokens.size(1));
  }
  for (auto& b : sample) {
    const int64_t pad = longest - b.tokens.size(1);
    auto v = b.valid.defined() ? b.valid : at::ones_like(b.tokens, at::kBool);
    tokens.push_back(at::constant_pad_nd(b.tokens, {0, pad}, task.pad_id()));
    valid.push_back(at::constant_pad_nd(v, {0, pad}, 0));
  }
  if (sample.empty()) return "";
  auto all_valid = at::cat(valid);
  {
    const autocast::Bf16Scope cast(bf16, device);
    model.calibrate_routers(at::cat(tokens).to(device), all_valid.to(device));
  }
  return "{\"batches\": " + std::to_string(t.calibration_batches) +
         ", \"tokens\": " + std::to_string(all_valid.sum().item<int64_t>()) + "}";
}

// Warm-up, then cosine decay to lr * min_lr_ratio.
double learning_rate(const TrainOptions& t, int64_t step) {
  const double progress =
      t.steps > t.warmup ? static_cast<double>(step - t.warmup) / static_cast<double>(t.steps - t.warmup) : 1.0;
  return step < t.warmup
             ? t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup)
             : t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * std::min(1.0, progress))));
}

void set_learning_rate(FusedAdamW& optimizer, double lr) {
  for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

struct StepLoss {
  at::Tensor loss;     // () float64 on the run's device: the mean over the micro-batches
  int64_t tokens = 0;  // real tokens trained on
};

// One rank's loss in a data-parallel run: its slice's share of the whole
// batch's loss, times the number of ranks, so that the mean of the ranks'
// gradients is the whole batch's gradient. The routers' regularisers are
// taken over the slice (their mean over ranks stands for the batch's).
at::Tensor slice_loss_of(const model::ChiarModel& model, const model::ModelOutput& out, const Batch& slice,
                         const Batch& whole, TaskHead head, int ranks) {
  at::Tensor loss;
  if (head == TaskHead::LanguageModel) {
    const double scale = static_cast<double>(ranks) / static_cast<double>(std::max<int64_t>(real_tokens(whole), 1));
    const at::Tensor weights =  // (B / ranks, T)
        slice.valid.defined() ? slice.valid.to(at::kFloat) * scale
                              : at::full(slice.targets.sizes(), scale, slice.targets.options().dtype(at::kFloat));
    loss = model.lm_loss(out, slice.targets, weights);
  } else {
    loss = at::cross_entropy_loss(out.logits.to(at::kFloat), slice.targets, {}, at::Reduction::Sum) *
           (static_cast<double>(ranks) / static_cast<double>(whole.targets.size(0)));
  }
  return out.aux_loss.defined() ? loss + out.aux_loss : loss;
}

// Forward and backward over the step's micro-batches into fresh gradients
// (in a process group: over this rank's slice of each).
StepLoss accumulate_gradients(Run& run, int64_t step) {
  const TrainOptions& t = run.t;
  const int ranks = run.group ? run.group->size() : 1;
  run.optimizer.clear_gradients();
  StepLoss s;
  for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
    const Batch host =
        run.ctx.task.train_batch(static_cast<uint64_t>(run.spec.seed), step * t.grad_accum + micro, t.batch_size);
    const bool lm = run.ctx.task.head() == TaskHead::LanguageModel;
    check_batch_targets(host, lm ? run.ctx.task.vocab_size() : run.ctx.task.n_classes(), lm,
                        "task '" + run.spec.task + "' training step " + std::to_string(step + 1));
    const Batch b = batch_on(host, run.device);
    at::Tensor loss;
    {
      const autocast::Bf16Scope cast(run.bf16, run.device);
      if (ranks == 1) {
        loss = loss_of(run.model, run.model.forward(b.tokens, b.valid, /*logits=*/false), b, run.ctx.task.head());
      } else {
        const Batch slice = slice_of_batch(b, run.group->rank(), ranks);
        loss = slice_loss_of(run.model, run.model.forward(slice.tokens, slice.valid, /*logits=*/false), slice, b,
                             run.ctx.task.head(), ranks);
      }
    }
    (loss / static_cast<double>(t.grad_accum)).backward();
    // Summed where it was computed, in float64 as the host summed the
    // micro-batches' losses before: the host reads it once per step, and on
    // a GPU, late (train_steps).
    const at::Tensor share = loss.detach().to(at::kDouble) / static_cast<double>(t.grad_accum);
    s.loss = s.loss.defined() ? s.loss + share : share;
    s.tokens += real_tokens(host);
  }
  return s;
}

// A data-parallel step's agreement: the ranks' gradients averaged, their
// losses averaged (the whole batch's loss), and a stop requested on any rank
// honoured by all at this step. A parameter without a gradient on some rank
// (a routed operator no token of its slice reached) takes zeros there, so
// every rank reduces the same tensors; one without a gradient anywhere keeps
// none, as in a single process. Returns whether to stop.
bool agree_over_ranks(Run& run, double& loss, bool stop_requested) {
  std::vector<at::Tensor> params = run.model.parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  at::Tensor shared = at::zeros({n + 2}, at::kDouble);  // (loss, stop, has_grad per parameter)
  auto a = shared.accessor<double, 1>();
  a[0] = loss;
  a[1] = stop_requested ? 1.0 : 0.0;
  for (int64_t i = 0; i < n; ++i) a[i + 2] = params[static_cast<size_t>(i)].grad().defined() ? 1.0 : 0.0;
  std::vector<at::Tensor> agreed{shared};
  run.group->allreduce_mean(agreed);
  a = agreed[0].accessor<double, 1>();
  loss = a[0];
  std::vector<at::Tensor> grads;
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor& p = params[static_cast<size_t>(i)];
    if (a[i + 2] == 0) continue;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad());
  }
  run.group->allreduce_mean(grads);
  return a[1] > 0;
}

bool diverged(const TrainOptions& t, double loss) {
  return !std::isfinite(loss) || (t.fail_loss_above > 0 && loss > t.fail_loss_above);
}

void apply_gradients(Run& run) {
  if (run.t.clip > 0) clip_gradient_norm(run.model.parameters(), run.t.clip);
  run.optimizer.step();
}

// The training log and heartbeat when due, and the progress callback.
void report_step(Run& run, int64_t done, double loss, double lr) {
  const TrainOptions& t = run.t;
  if (done % t.log_every == 0 || done == t.steps)
    timed(run.overhead.store, [&] {
      run.ctx.store->add_train_log(run.spec.hash, done, loss, lr, run.step_tps.back());
      run.ctx.store->heartbeat(run.spec.hash, done);
    });
  if (run.ctx.progress) timed(run.overhead.progress, [&] { run.ctx.progress(done, loss, run.step_tps.back()); });
}

void save_best(Run& run, int64_t step) {
  torch::serialize::OutputArchive archive;
  run.model.save(archive);
  run.checkpoints->write(RunCheckpoints::kBest, step, archive_bytes(archive));
}

// What may stop the run's evaluations between batches: the stop flag in a
// single process; nothing in a process group, whose ranks stop together.
const std::atomic<bool>* interruption(const Run& run) { return run.group ? nullptr : run.ctx.stop; }

// Scores the validation split (all of it after the last step), records the
// metrics and the FLOP / routing accounting, and keeps a new best model.
void validate(Run& run, int64_t done) {
  const bool final_eval = done == run.t.steps;
  EvalResult e;
  timed(run.overhead.evaluation, [&] {
    e = evaluate(run.model, run.ctx.task, "valid", final_eval ? 0 : run.t.eval_batches, run.t.eval_batch_size, run.bf16,
                 run.device, interruption(run));
  });
  run.overhead.evaluation -= e.accounting_seconds;
  run.overhead.accounting += e.accounting_seconds;
  failpoint("eval.scored");
  timed(run.overhead.store, [&] {
    run.ctx.store->add_metrics(run.spec.hash, done, "valid", "current", e.metrics);
    record_accounting(*run.ctx.store, run.spec.hash, done, e.accounting);
  });
  if (score(e.metrics) > run.point.best) {
    run.point.best = score(e.metrics);
    run.point.has_best = true;
    timed(run.overhead.checkpoints, [&] { save_best(run, done); });
  }
}

void save_checkpoint(Run& run, int64_t done, bool validated = true) {
  timed(run.overhead.checkpoints, [&] {
    run.checkpoints->write(RunCheckpoints::kState, done,
                           state_bytes(run.model, run.optimizer, run.device, run.at_step(done, validated)));
  });
}

// A step whose update is queued on the device and whose loss the host has
// not read: the loss is on its way into pinned host memory.
struct QueuedStep {
  int64_t done = 0;  // the step's number, counted from 1
  double lr = 0;
  int64_t tokens = 0;
  Clock::time_point began;  // when the host began the step
  at::Tensor loss;          // () float64, in host memory once `copied` is reached
  QueueMark copied;
};

QueuedStep queue_loss_read(const Run& run, const StepLoss& s, int64_t done, double lr, Clock::time_point began) {
  QueuedStep q{done, lr, s.tokens, began, s.loss, {}};
  if (!run.device.is_cpu()) {
    q.loss = at::empty({}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    q.loss.copy_(s.loss, /*non_blocking=*/true);
  }
  q.copied = QueueMark::after_queued_work(run.device);
  return q;
}

// A trained step's time, tokens/s and report, once its work is done (at
// `reached`). Its time runs from when the host began it, or from when the
// step before it was done if that was later: with late loss reads the
// device works on one step while the host queues the next, and the time
// between two steps' ends is what each cost.
void record_step(Run& run, int64_t done, double loss, double lr, int64_t tokens, Clock::time_point began,
                 Clock::time_point& last_done, Clock::time_point reached) {
  const double seconds = std::chrono::duration<double>(reached - std::max(began, last_done)).count();
  last_done = reached;
  run.overhead.steps += seconds;
  run.step_ms.push_back(seconds * 1e3);
  run.step_tps.push_back(static_cast<double>(tokens) / seconds);
  if (run.writer) report_step(run, done, loss, lr);
}

bool validates(const TrainOptions& t, int64_t done) { return done % t.eval_every == 0 || done == t.steps; }
bool checkpoints(const TrainOptions& t, int64_t done) { return done % t.checkpoint_every == 0 || done == t.steps; }

// Whether step `done` is read before its update even with late reads: a
// step that validates or checkpoints (the last step does both), so that
// nothing is kept of a step that diverged.
bool read_before_update(const TrainOptions& t, int64_t done) { return validates(t, done) || checkpoints(t, done); }

// Trains from run.point.step to the last step; stops early on divergence, or
// after a checkpoint when a stop is requested.
//
// Reading a step's loss waits for the device to finish the step. Read
// before the update, as on the CPU, a GPU would sit idle each step while
// the host decides on divergence, reports, and builds and queues the next
// batch. With late reads (loss_reads_for) the host queues a step's update,
// starts a copy of its loss into host memory and goes on; it reads that
// loss once the next step's forward and backward are queued behind it, and
// only then applies the next step's update, so that a divergence still
// stops the run before anything that follows it is applied. A step that
// validates or checkpoints, the last step, and a step at which a stop is
// requested are read before their update, as on the CPU: nothing is kept of
// a step that diverged. The diverged step's own update is applied in
// memory, where nothing reads it again. A stop requested during a step read
// late is honoured at the next step, whose forward and backward are queued
// by then. Should the next step fail (an exception), the step read late is
// lost with it: its update is in memory only, and the run resumes from its
// last checkpoint.
// Whether step `done` diverged; if so, the result says so.
bool record_if_diverged(const TrainOptions& t, TrainResult& result, int64_t done, double loss) {
  if (!diverged(t, loss)) return false;
  result.outcome = RunStatus::Diverged;
  result.diverged_step = done;
  result.error = "loss " + std::to_string(loss) + " at step " + std::to_string(done);
  return true;
}

bool stop_requested(const Run& run) { return run.ctx.stop && run.ctx.stop->load(); }

// The step read late, once the next step's forward and backward are queued
// behind it: its loss read and recorded. Returns false when it diverged.
bool settle_queued_step(Run& run, TrainResult& result, QueuedStep& queued, Clock::time_point& last_done) {
  queued.copied.wait();  // host wait: the step before this one, done
  const auto reached = Clock::now();
  const double loss = queued.loss.item<double>();
  if (record_if_diverged(run.t, result, queued.done, loss)) return false;
  record_step(run, queued.done, loss, queued.lr, queued.tokens, queued.began, last_done, reached);
  return true;
}

// After step `done`'s update: its validation and checkpoint where due, and
// a requested stop (the group's, in a process group: group_stops), read
// after validating. Returns whether the run ends here.
bool after_update(Run& run, TrainResult& result, int64_t done, bool group_stops) {
  const TrainOptions& t = run.t;
  if (run.writer && validates(t, done)) {
    try {
      validate(run, done);
    } catch (const EvaluationStopped&) {
      // Stopped mid-validation: the step is kept, its validation owed.
      save_checkpoint(run, done, /*validated=*/false);
      result.outcome = RunStatus::Interrupted;
      result.resumption = "stopped while validating step " + std::to_string(done) +
                          "; checkpoint saved, a rerun validates it and goes on";
      return true;
    }
  }
  const bool stopping = run.group ? group_stops : stop_requested(run);
  if (run.writer && (checkpoints(t, done) || stopping)) save_checkpoint(run, done);
  if (stopping && done < t.steps) {
    result.outcome = RunStatus::Interrupted;
    return true;
  }
  return false;
}

void train_steps(Run& run, TrainResult& result) {
  const TrainOptions& t = run.t;
  const bool late = !run.group && loss_reads_for(run.device) == LossReads::Late;
  std::optional<QueuedStep> queued;
  Clock::time_point last_done{};
  for (int64_t step = run.point.step; step < t.steps; ++step) {
    const auto began = Clock::now();
    const int64_t done = step + 1;
    const double lr = learning_rate(t, step);
    set_learning_rate(run.optimizer, lr);
    StepLoss s = accumulate_gradients(run, step);
    if (queued) {
      if (!settle_queued_step(run, result, *queued, last_done)) break;
      queued.reset();
    }
    if (late && !read_before_update(t, done) && !stop_requested(run)) {
      apply_gradients(run);
      failpoint("train.step");
      queued = queue_loss_read(run, s, done, lr, began);
      continue;
    }
    double loss = s.loss.item<double>();  // host wait: this step's forward and backward, done
    // In a process group the loss, and so divergence, and a stop are the
    // group's: every rank leaves the loop at the same step.
    bool group_stops = false;
    if (run.group)
      timed(run.overhead.reduction, [&] { group_stops = agree_over_ranks(run, loss, stop_requested(run)); });
    if (record_if_diverged(t, result, done, loss)) break;
    apply_gradients(run);
    failpoint("train.step");
    synchronize_device(run.device);  // the step's time includes its optimiser's kernels
    record_step(run, done, loss, lr, s.tokens, began, last_done, Clock::now());
    if (after_update(run, result, done, group_stops)) break;
  }
}

void summarise_training(const Run& run, RunSummary& summary) {
  summary.trained_steps = !run.step_ms.empty();
  summary.train_seconds = run.point.train_seconds + seconds_since(run.started);
  summary.step_ms = median(run.step_ms);
  summary.train_tokens_per_s = median(run.step_tps);
  summary.tau = thresholds_json(run.model);
  summary.overhead_fraction = run.overhead.fraction();
  summary.overhead = run.overhead.json();
}

// The test split, scored by the last and by the best-validation model.
void score_test_split(Run& run, RunSummary& summary) {
  const TrainOptions& t = run.t;
  EvalResult last =
      evaluate(run.model, run.ctx.task, "test", 0, t.eval_batch_size, run.bf16, run.device, interruption(run));
  run.ctx.store->add_metrics(run.spec.hash, t.steps, "test", "last", last.metrics);
  summary.eval_tokens_per_s = last.tokens_per_s;
  if (run.point.has_best) {
    const auto best = run.checkpoints->newest_verified(
        RunCheckpoints::kBest,
        [](int64_t step) { return "scoring the best model of step " + std::to_string(step) + " instead"; },
        "scoring the last model instead");
    if (best.first >= 0) {
      torch::serialize::InputArchive archive;
      archive.load_from(best.second.data(), best.second.size(), run.device);
      run.model.load(archive);
    }
  }
  EvalResult best_eval =
      evaluate(run.model, run.ctx.task, "test", 0, t.eval_batch_size, run.bf16, run.device, interruption(run));
  run.ctx.store->add_metrics(run.spec.hash, t.steps, "test", "best", best_eval.metrics);
}

}  // namespace

LossReads loss_reads_for(const at::Device& device) {
  const char* env = std::getenv("CHIAR_LOSS_READS");
  const std::string chosen = env ? env : "";
  if (chosen == "every-step") return LossReads::EveryStep;
  if (chosen == "late") return LossReads::Late;
  if (!chosen.empty()) throw UserError("CHIAR_LOSS_READS: \"" + chosen + "\" is not one of every-step, late");
  return queue_marks_wait_precisely(device) ? LossReads::Late : LossReads::EveryStep;
}

void check_loss_reads_setting() { loss_reads_for(at::Device(at::kCPU)); }

model::ModelOptions model_options_for(const RunSpec& spec, const Task& task) {
  model::ModelOptions o = spec.model;
  o.vocab_size(task.vocab_size());
  o.head(task.head());
  if (task.head() == TaskHead::Classifier) o.n_classes(task.n_classes());
  return o;
}

// Where training starts: the newest verified state checkpoint, or a fresh
// model whose routers are calibrated. In a process group rank 0 finds the
// checkpoint and sends its bytes, so every rank resumes from the same one,
// and then every rank takes rank 0's parameters and buffers (thresholds).
void start_or_resume(Run& run, TrainResult& result) {
  std::string state = run.writer ? run.checkpoints->resumable_state() : std::string();
  if (run.group) state = run.group->broadcast_string(state);
  if (!state.empty())
    run.point = restore_state(run.model, run.optimizer, run.device, state);
  else
    result.summary.calibration = calibrate_routers(run.model, run.ctx.task, run.spec, run.device, run.bf16);
  if (!run.group) return;
  std::vector<at::Tensor> tensors = run.model.parameters();
  for (const auto& b : run.model.buffers()) tensors.push_back(b);
  at::NoGradGuard no_grad;
  run.group->broadcast(tensors);
  // Each rank draws its own dropout masks: rank 0 goes on with the stream a
  // single process would use; every other rank takes a stream of its own,
  // fixed by the run's seed, its rank and the step it starts at.
  if (run.group->rank() > 0) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(static_cast<uint64_t>(run.spec.seed) * 1000003u +
                         static_cast<uint64_t>(run.group->rank()) * 7919u + static_cast<uint64_t>(run.point.step));
  }
}

TrainResult train_run(const RunSpec& spec, const TrainContext& ctx) {
  TrainResult result;
  configure_threads(static_cast<int>(spec.train.threads));
  Run run(spec, ctx);
  configure_device(run.device);
  warn_about_cpu_bf16(run.device, run.bf16);
  result.summary.params = run.model.parameter_count();
  // The marks from the model and optimiser in place, after handing back the
  // blocks earlier runs of this process left cached, so that the reserved
  // mark is this run's alone.
  release_gpu_cache(run.device);
  reset_gpu_memory_peak(run.device);
  if (run.writer) {
    prepare_checkpoint_dir(spec, ctx.checkpoint_dir);
    warn_if_short_of_space(ctx.checkpoint_dir, result.summary.params);
  }
  start_or_resume(run, result);
  run.model.train();

  run.started = Clock::now();
  if (run.point.validate_first && run.writer) {
    try {
      validate(run, run.point.step);
    } catch (const EvaluationStopped&) {
      result.outcome = RunStatus::Interrupted;
      result.resumption = "stopped while validating step " + std::to_string(run.point.step) +
                          " again; a rerun validates it and goes on";
    }
  }
  if (result.outcome == RunStatus::Done) train_steps(run, result);
  summarise_training(run, result.summary);
  if (result.outcome == RunStatus::Done && run.writer) {
    try {
      score_test_split(run, result.summary);
    } catch (const EvaluationStopped&) {
      // The last step's checkpoint is written: a rerun scores the test split again.
      result.outcome = RunStatus::Interrupted;
      result.resumption = "stopped while scoring the test split, rerun to score it";
    }
  }
  result.summary.peak_rss_mb = peak_rss_mb();
  const GpuMemoryPeak gpu = gpu_memory_peak(run.device);
  result.summary.peak_gpu_allocated_mb = gpu.allocated_mb;
  result.summary.peak_gpu_reserved_mb = gpu.reserved_mb;
  return result;
}

}  // namespace chiar::engine
