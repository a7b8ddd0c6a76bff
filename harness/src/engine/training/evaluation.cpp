#include "evaluation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/autocast_compat.h"
#include "engine/cluster/data_parallel.h"
#include "engine/runtime/device.h"
#include "engine/runtime/failpoint.h"
#include "chiar/metrics.h"

namespace chiar::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void add_lm_metrics(std::map<std::string, double>& metrics, const Task& task, const std::string& split, double nll,
                    int64_t scored, bool full_split) {
  metrics["nll"] = nll;
  metrics["tokens"] = static_cast<double>(scored);
  metrics["token_ppl"] = std::exp(nll / std::max<int64_t>(scored, 1));
  if (full_split) {  // words and bytes describe the whole split only
    const SplitStats s = task.stats(split);
    const LmMetrics m = lm_metrics(nll, scored, s.words, s.bytes);
    metrics["word_ppl"] = m.word_ppl;
    metrics["bits_per_byte"] = m.bits_per_byte;
  }
}

void add_class_metrics(std::map<std::string, double>& metrics, double loss_sum, const std::vector<int64_t>& correct,
                       const std::vector<int64_t>& count) {
  const ClassMetrics m = class_metrics(loss_sum, correct, count);
  metrics["accuracy"] = m.accuracy;
  metrics["loss"] = m.mean_loss;
  int64_t examples = 0, largest_class = 0;
  for (size_t c = 0; c < count.size(); ++c) {
    examples += count[c];
    largest_class = std::max(largest_class, count[c]);
    if (count[c])
      metrics["accuracy_class_" + std::to_string(c)] = static_cast<double>(correct[c]) / static_cast<double>(count[c]);
  }
  metrics["examples"] = static_cast<double>(examples);
  // What always answering the split's most frequent class scores: the floor
  // an accuracy must clear before it says the model learned anything.
  if (examples > 0) metrics["majority_rate"] = static_cast<double>(largest_class) / static_cast<double>(examples);
}

}  // namespace

// Scores up to max_batches batches of a split (0: all of them). A stop
// request (SIGTERM, SIGINT) ends it between batches, by EvaluationStopped:
// scoring a large split can take minutes, more than a scheduler's warning
// before it kills a job. Null stop: not interruptible (a process group's
// ranks stop only together, at a step).
//
// The sums stay where they are computed, in float64 as the host summed the
// batches' values before, and the host reads them once, after the last
// batch: on a GPU a batch no longer waits for the one before it to be read
// back (the routing's own waits inside the forward remain).
EvalResult evaluate(model::ChiarModel& model, const Task& task, const std::string& split, int64_t max_batches,
                    int64_t batch_size, bool bf16, const at::Device& device, const std::atomic<bool>* stop) {
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  EvalResult r;
  const bool lm = task.head() == TaskHead::LanguageModel;
  const int64_t total = task.eval_batch_count(split, batch_size);
  const int64_t n = max_batches > 0 ? std::min(max_batches, total) : total;
  const int64_t classes = lm ? 0 : task.n_classes();
  const auto on_device = at::TensorOptions().device(device);
  at::Tensor loss_sum = at::zeros({}, on_device.dtype(at::kDouble));      // () summed NLL (LM) or loss (classifier)
  at::Tensor correct = at::zeros({classes}, on_device.dtype(at::kLong));  // (C,) right answers per true class
  at::Tensor count = at::zeros({classes}, on_device.dtype(at::kLong));    // (C,) examples per true class
  int64_t scored = 0, real_count = 0;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    // Counts come from the batch in host memory, the model reads its copy on the device.
    const Batch host = task.eval_batch(split, i, batch_size);
    check_batch_targets(host, lm ? task.vocab_size() : task.n_classes(), lm,
                        "split '" + split + "' batch " + std::to_string(i));
    const Batch b = batch_on(host, device);
    model::ModelOutput out;
    {
      const autocast::Bf16Scope cast(bf16, device);
      // A language model's loss through the fused head (no (B, T, V) logits;
      // under bf16 it takes the same autocast path as training).
      out = model.forward(b.tokens, b.valid, /*logits=*/!lm);
      if (lm) {
        const auto mask = b.scored.defined() ? b.scored : b.valid;
        const auto host_mask = host.scored.defined() ? host.scored : host.valid;
        const at::Tensor batch_nll =  // () summed over the scored tokens
            model.lm_loss(out, b.targets,
                          mask.defined() ? mask.to(at::kFloat)
                                         : at::ones(b.targets.sizes(), b.targets.options().dtype(at::kFloat)));
        loss_sum += batch_nll.to(at::kDouble);
        scored += host_mask.defined() ? host_mask.sum().item<int64_t>() : host.targets.numel();
      }
    }
    real_count += real_tokens(host);
    if (!lm) {
      const auto logits = out.logits.to(at::kDouble);  // (B, C)
      loss_sum += at::cross_entropy_loss(logits, b.targets, {}, at::Reduction::Sum);
      const auto right = logits.argmax(-1).eq(b.targets).to(at::kLong);  // (B,)
      // index_add_, not bincount, which reads its input's largest value back.
      count.index_add_(0, b.targets, at::ones_like(b.targets));
      correct.index_add_(0, b.targets, right);
    }
    if (i == 0) {
      // The accounting reads the first batch's routing back: its time alone
      // is left out of the rate, not the batch's own kernels.
      synchronize_device(device);
      const auto accounting_began = Clock::now();
      r.accounting = account(model, out, b.valid, b.tokens.size(1));
      r.accounting_seconds += seconds_since(accounting_began);
    }
    failpoint("eval.batch");
    if (i + 1 < n && stop && stop->load()) throw EvaluationStopped{};  // a finished evaluation counts
  }
  const double loss_total = loss_sum.item<double>();  // host wait: every batch, done
  r.tokens_per_s = static_cast<double>(real_count) / std::max(seconds_since(t0) - r.accounting_seconds, 1e-9);
  if (lm) {
    add_lm_metrics(r.metrics, task, split, loss_total, scored, n == total);
  } else {
    const auto as_vector = [](const at::Tensor& t) {
      const auto host = t.cpu();
      return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
    };
    add_class_metrics(r.metrics, loss_total, as_vector(correct), as_vector(count));
  }
  r.metrics["full_split"] = n == total ? 1.0 : 0.0;
  model.train(was_training);
  return r;
}

// Higher is better for accuracy, lower for perplexity.
double score(const std::map<std::string, double>& m) {
  auto acc = m.find("accuracy");
  return acc != m.end() ? acc->second : -m.at("nll") / std::max(1.0, m.at("tokens"));
}

}  // namespace chiar::engine
