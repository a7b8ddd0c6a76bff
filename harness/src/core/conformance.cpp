#include "chiar/conformance.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <regex>
#include <sstream>

#include "autocast_compat.h"
#include "chiar/error.h"
#include "chiar/rows.h"

namespace chiar {
namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Largest relative error of autograd against central differences on x.
double gradient_error(Operator& op, const at::Tensor& x0, const OpContext& ctx) {
  auto x = x0.clone().requires_grad_(true);
  auto probe = at::randn(x0.sizes(), kF64);
  (op.forward(x, ctx) * probe).sum().backward();
  auto grad = x.grad().reshape({-1});
  auto flat = x.detach().view({-1});
  double worst = 0;
  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < flat.numel(); i += std::max<int64_t>(1, flat.numel() / 24)) {
    const double orig = flat[i].item<double>(), h = 1e-6;
    flat[i] = orig + h;
    const double up = (op.forward(x, ctx) * probe).sum().item<double>();
    flat[i] = orig - h;
    const double down = (op.forward(x, ctx) * probe).sum().item<double>();
    flat[i] = orig;
    const double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(grad[i].item<double>() - numeric) / std::max(1.0, std::abs(numeric)));
  }
  return worst;
}

using Failures = std::vector<std::string>;

// The output's shape, dtype and finiteness, and causality: outputs up to
// t = 4 unchanged when later tokens change.
void check_forward(Operator& op, const OperatorTraits& traits, const at::Tensor& x, const at::Tensor& y,
                   const OpContext& ctx, Failures& fail) {
  if (y.sizes() != x.sizes()) fail.push_back("forward: output shape differs from the input's");
  if (y.scalar_type() != x.scalar_type()) fail.push_back("forward: output dtype differs from the input's");
  if (!y.isfinite().all().item<bool>()) fail.push_back("forward: non-finite outputs");
  if (!traits.causal) return;
  auto later = x.clone();
  later.narrow(1, 5, x.size(1) - 5).normal_();
  const double e = rel(op.forward(later, ctx).narrow(1, 0, 5), y.narrow(1, 0, 5));
  if (e > 1e-10)
    fail.push_back("causality: outputs at t <= 4 change when tokens after 4 change (relative " + num(e) + ")");
}

// Real outputs independent of what the padding holds.
void check_padding(Operator& op, const at::Tensor& x, const OpContext& padded, Failures& fail) {
  auto noisy = x.clone();
  noisy[1].narrow(0, 6, 3).normal_().mul_(50);
  auto mask = padded.valid.unsqueeze(-1);
  const double e = rel(op.forward(noisy, padded).masked_select(mask), op.forward(x, padded).masked_select(mask));
  if (e > 1e-10) fail.push_back("padding: real outputs change with the content of padding (relative " + num(e) + ")");
}

// forward_rows against the rows of forward, with and without the rows in
// host memory (as a routed layer calls it).
void check_rows(Operator& op, const at::Tensor& x, const OpContext& ctx, Failures& fail) {
  const int64_t d = x.size(2);
  auto full = op.forward(x, ctx).reshape({-1, d});
  auto rows = at::tensor(std::vector<int64_t>{0, 3, 4, 10, 17}, at::TensorOptions().dtype(at::kLong));
  const double e = rel(op.forward_rows(x, rows, ctx), full.index_select(0, rows));
  if (e > 1e-10) fail.push_back("forward_rows disagrees with the rows of forward (relative " + num(e) + ")");
  OpContext with_host_rows = ctx;
  with_host_rows.host_rows = rows.clone();
  const double eh = rel(op.forward_rows(x, rows, with_host_rows), full.index_select(0, rows));
  if (eh > 1e-10)
    fail.push_back("forward_rows given OpContext::host_rows disagrees with the rows of forward (relative " + num(eh) +
                   ")");
}

// FLOP counts non-negative and increasing in T.
void check_flops(const Operator& op, int64_t d, Failures& fail) {
  int64_t previous = -1;
  for (int64_t t : {16, 32, 64}) {
    const FlopCount f = op.flops(t, t, d);
    if (f.forward < 0 || f.backward < 0) fail.push_back("flops: negative count at T " + std::to_string(t));
    if (f.total() <= previous) fail.push_back("flops: not increasing in T at T " + std::to_string(t));
    previous = f.total();
  }
}

}  // namespace

std::vector<std::string> check_operator(const std::function<std::shared_ptr<Operator>(int64_t, int64_t)>& make) {
  Failures fail;
  at::manual_seed(0);
  const int64_t B = 2, T = 9, d = 8;
  std::shared_ptr<Operator> op;
  try {
    op = make(d, 2);
  } catch (const std::exception& e) {
    return {"cannot build the operator: " + message_of(e)};
  }
  op->to(at::kDouble);
  op->eval();
  const OperatorTraits traits = op->traits();
  if (!traits.colour.empty() && !std::regex_match(traits.colour, std::regex("#[0-9a-fA-F]{6}")))
    fail.push_back("traits: colour '" + traits.colour + "' is not of the form #rrggbb");
  OpContext ctx;
  ctx.causal = traits.causal;
  auto x = at::randn({B, T, d}, kF64);
  {
    at::NoGradGuard no_grad;
    check_forward(*op, traits, x, op->forward(x, ctx), ctx, fail);
    OpContext padded;
    padded.valid = at::ones({B, T}, at::TensorOptions().dtype(at::kBool));
    padded.valid[1].narrow(0, 6, 3).fill_(false);
    if (traits.padded) check_padding(*op, x, padded, fail);
    check_rows(*op, x, traits.causal ? ctx : padded, fail);
  }
  check_flops(*op, d, fail);
  op->train();
  const double g = gradient_error(*op, at::randn({1, 5, d}, kF64), ctx);
  if (!(g < 1e-5)) fail.push_back("gradient: autograd and finite differences differ by " + num(g));
  return fail;
}

std::string OperatorCase::name() const {
  std::ostringstream s;
  s << "T=" << T << " d=" << d_model << " h=" << n_heads
    << (causal   ? " causal"
        : padded ? " padded"
                 : " plain")
    << (bf16 ? " bf16" : " fp32") << (cuda ? " cuda" : " cpu");
  return s.str();
}

std::vector<OperatorCase> operator_cases(const OperatorTraits& traits, bool cuda) {
  struct Shape {
    int64_t T, d, heads;
  };
  std::vector<Shape> shapes;
  for (int64_t T : {1, 7, 128})
    for (const auto& [d, heads] : std::vector<std::pair<int64_t, int64_t>>{{16, 2}, {64, 4}, {256, 4}})
      shapes.push_back({T, d, heads});
  shapes.push_back({1024, 64, 4});
  std::vector<OperatorCase> out;
  for (bool on_cuda : {false, true}) {
    if (on_cuda && !cuda) continue;
    for (bool bf16 : {false, true}) {
      if (bf16 && !on_cuda && !cpu_bf16_sums_in_fp32()) continue;
      for (const Shape& s : shapes)
        for (int context = 0; context < 3; ++context) {
          OperatorCase c;
          c.T = s.T;
          c.d_model = s.d;
          c.n_heads = s.heads;
          c.causal = context == 1;
          c.padded = context == 2;
          c.bf16 = bf16;
          c.cuda = on_cuda;
          if ((c.causal && !traits.causal) || (c.padded && (!traits.padded || s.T <= 2))) continue;
          out.push_back(c);
        }
    }
  }
  return out;
}

bool cpu_bf16_sums_in_fp32() {
  static const bool exact = [] {
    const at::NoGradGuard no_grad;
    // b not transposed: the layout that sums in bf16 where any does.
    const auto a = at::ones({4, 512}, at::kBFloat16), b = at::ones({512, 4}, at::kBFloat16);
    return at::mm(a, b).eq(512).all().item<bool>();
  }();
  return exact;
}

OperatorTolerance operator_tolerance(bool bf16) {
  return bf16 ? OperatorTolerance{2.5e-4, 2.5e-3} : OperatorTolerance{1e-9, 1e-7};
}

namespace {

// ||got - want||^2 / ||want||^2 in float64, over the rows `keep` marks (all when undefined).
double nmse(const at::Tensor& got, const at::Tensor& want, const at::Tensor& keep = {}) {
  auto g = got.detach().cpu().to(at::kDouble), w = want.detach().cpu().to(at::kDouble);
  if (keep.defined()) {
    g = g.masked_select(keep.unsqueeze(-1));
    w = w.masked_select(keep.unsqueeze(-1));
  }
  const double err = (g - w).pow(2).sum().item<double>(), ref = w.pow(2).sum().item<double>();
  if (ref == 0) return err == 0 ? 0 : std::numeric_limits<double>::infinity();
  return err / ref;
}

// The worst NMSE over the gradients, each gradient's error against its own
// norm, floored at 1e-4 of the mean squared norm of all of them: a gradient
// that is zero in exact arithmetic (the query projection's at T = 1, where
// softmax over one key is constant) is compared with the scale of the
// others, not with its own rounding noise.
double gradient_nmse(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  double mean = 0;
  int counted = 0;
  for (const auto& w : want)
    if (w.defined()) mean += w.detach().to(at::kDouble).pow(2).sum().item<double>(), ++counted;
  mean /= std::max(counted, 1);
  // A gradient the reference has and the case lacks (or the reverse) is a
  // parameter one path leaves out of the graph: infinitely wrong.
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].defined() != got[i].defined()) return std::numeric_limits<double>::infinity();
    if (!want[i].defined()) continue;
    const auto g = got[i].detach().cpu().to(at::kDouble), w = want[i].detach().to(at::kDouble);
    const double err = (g - w).pow(2).sum().item<double>();
    const double norm = std::max(w.pow(2).sum().item<double>(), 1e-4 * mean);
    worst = std::max(worst, norm > 0 ? err / norm : (err == 0 ? 0 : std::numeric_limits<double>::infinity()));
  }
  return worst;
}

// One forward and backward of sum(y * probe): the output and the gradients
// of the input and of every parameter, in parameter order.
struct Pass {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

Pass run_pass(Operator& op, const at::Tensor& x, const OpContext& ctx, const at::Tensor& rows, const at::Tensor& probe,
              bool bf16) {
  auto input = x.detach().clone().requires_grad_(true);
  op.zero_grad();
  Pass p;
  {
    autocast::Bf16Scope scope(bf16, x.device());
    p.out = rows.defined() ? op.forward_rows(input, rows, ctx) : op.forward(input, ctx);  // (B, T, d) or (N, d)
  }
  (p.out.to(probe.scalar_type()) * probe).sum().backward();
  p.grads.push_back(input.grad());
  for (auto& w : op.parameters()) p.grads.push_back(w.grad());
  return p;
}

at::Device case_device(const OperatorCase& c) { return c.cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

}  // namespace

PreparedOperatorCase prepare_operator_case(const std::function<std::shared_ptr<Operator>(int64_t, int64_t)>& make,
                                           const OperatorCase& c, uint64_t seed) {
  PreparedOperatorCase p;
  at::manual_seed(seed);
  p.op = make(c.d_model, c.n_heads);
  p.reference = make(c.d_model, c.n_heads);
  p.reference->to(at::kDouble);
  {
    at::NoGradGuard no_grad;
    auto from = p.op->named_parameters(), to = p.reference->named_parameters();
    for (const auto& w : from) to[w.key()].copy_(w.value());
    auto buffers = p.reference->named_buffers();
    for (const auto& b : p.op->named_buffers())
      if (buffers.contains(b.key()) && b.value().is_floating_point()) buffers[b.key()].copy_(b.value());
  }
  p.op->to(case_device(c), at::kFloat);
  p.x = at::randn({c.batch, c.T, c.d_model}, kF64);  // (B, T, d)
  p.context.causal = c.causal;
  if (c.padded) {
    p.context.valid = at::ones({c.batch, c.T}, at::TensorOptions().dtype(at::kBool));  // (B, T)
    for (int64_t b = 1; b < c.batch; ++b) p.context.valid[b].narrow(0, c.T - c.T / 3, c.T / 3).fill_(false);
  }
  p.probe = at::randn({c.batch, c.T, c.d_model}, kF64);  // (B, T, d): zero at padding
  if (c.padded) p.probe.mul_(p.context.valid.unsqueeze(-1).to(at::kDouble));
  return p;
}

std::pair<at::Tensor, OpContext> case_inputs(const PreparedOperatorCase& p, const OperatorCase& c) {
  OpContext ctx = p.context;
  if (ctx.valid.defined()) ctx.valid = ctx.valid.to(case_device(c));
  return {p.x.to(case_device(c), at::kFloat), ctx};
}

OperatorCaseResult run_operator_case(const std::function<std::shared_ptr<Operator>(int64_t, int64_t)>& make,
                                     const OperatorCase& c, uint64_t seed) {
  OperatorCaseResult r;
  r.tolerance = operator_tolerance(c.bf16);
  PreparedOperatorCase p;
  try {
    p = prepare_operator_case(make, c, seed);
  } catch (const std::exception& e) {
    r.failure = "cannot build the case: " + message_of(e);
    return r;
  }
  try {
    const auto [x, ctx] = case_inputs(p, c);
    // A sample of rows for forward_rows, as a routed layer passes them: every
    // third row, and the last (the end of a padded sequence, and T = 1).
    const int64_t n = c.batch * c.T;
    auto rows = at::arange(0, n, 3, at::TensorOptions().dtype(at::kLong));                                  // (N,)
    if (rows[-1].item<int64_t>() != n - 1) rows = at::cat({rows, at::full({1}, n - 1, rows.options())});    // (N,)
    const at::Tensor keep = p.context.valid.defined() ? p.context.valid : at::Tensor();                     // (B, T)
    const at::Tensor keep_rows = keep.defined() ? keep.reshape({-1}).index_select(0, rows) : at::Tensor();  // (N,)
    for (bool sparse : {false, true}) {
      const at::Tensor probe = sparse ? p.probe.reshape({-1, c.d_model}).index_select(0, rows) : p.probe;
      const Pass want = run_pass(*p.reference, p.x, p.context, sparse ? rows : at::Tensor(), probe, false);
      OpContext device_ctx = ctx;
      if (sparse) device_ctx.host_rows = rows;
      const Pass got = run_pass(*p.op, x, device_ctx, sparse ? rows.to(x.device()) : at::Tensor(),
                                probe.to(x.device(), at::kFloat), c.bf16);
      r.output_nmse = std::max(r.output_nmse, nmse(got.out, want.out, sparse ? keep_rows : keep));
      r.gradient_nmse = std::max(r.gradient_nmse, gradient_nmse(got.grads, want.grads));
    }
  } catch (const std::exception& e) {
    r.failure = "the case fails to run: " + message_of(e);
    return r;
  }
  if (!(r.output_nmse <= r.tolerance.output))
    r.failure = "output NMSE " + num(r.output_nmse) + " above " + num(r.tolerance.output);
  else if (!(r.gradient_nmse <= r.tolerance.gradient))
    r.failure = "gradient NMSE " + num(r.gradient_nmse) + " above " + num(r.tolerance.gradient);
  return r;
}

std::vector<std::string> check_router(
    const std::function<std::shared_ptr<Router>(const std::vector<std::string>&)>& make) {
  std::vector<std::string> fail;
  int tried = 0;
  // A router sees its operators' names and count only, never the operators:
  // the names stand for the roles, cheapest first.
  for (const auto& ops : {std::vector<std::string>{"cheap_mixing", "global_mixing"},
                          std::vector<std::string>{"cheap_mixing", "intermediate_mixing", "global_mixing"}}) {
    std::shared_ptr<Router> router;
    try {
      router = make(ops);
    } catch (const UserError&) {
      continue;  // this router does not take that many operators
    }
    ++tried;
    const std::string k = std::to_string(ops.size()) + " operators: ";
    at::manual_seed(1);
    const int64_t B = 2, T = 12, d = 16;
    auto x = at::randn({B, T, d});
    auto h = at::rand({B, T});
    router->calibrate(h);
    for (bool causal : {false, true}) {
      OpContext ctx;
      ctx.causal = causal;
      at::NoGradGuard no_grad;
      const RouteResult r = router->route(x, h, ctx);
      if (r.weights.sizes() != at::IntArrayRef({B, T, static_cast<int64_t>(ops.size())})) {
        fail.push_back(k + "weights are not (B, T, K)");
        continue;
      }
      if ((r.weights.sum(-1) - 1).abs().max().item<double>() > 1e-5) fail.push_back(k + "weights do not sum to 1");
      if (r.weights.min().item<double>() < 0) fail.push_back(k + "negative weights");
      if (!at::equal(r.choice, r.weights.argmax(-1))) fail.push_back(k + "choice is not the argmax of the weights");
      if (r.mode == RouteMode::Hard &&
          !at::equal(r.weights, at::one_hot(r.choice, static_cast<int64_t>(ops.size())).to(r.weights.scalar_type())))
        fail.push_back(k + "a hard router's weights are not one-hot");
      if (causal) {
        auto x2 = x.clone();
        auto h2 = h.clone();
        x2.narrow(1, 6, T - 6).normal_();
        h2.narrow(1, 6, T - 6).uniform_();
        if (!at::equal(router->route(x2, h2, ctx).choice.narrow(1, 0, 6), r.choice.narrow(1, 0, 6)))
          fail.push_back(k + "causal decisions at t <= 5 change when later tokens change");
      }
    }
  }
  if (tried == 0) fail.push_back("the router accepts neither 2 nor 3 operators");
  return fail;
}

std::vector<std::string> check_task(const Task& task) {
  std::vector<std::string> fail;
  for (const auto& split : task.splits()) {
    const SplitStats s = task.stats(split);
    if (s.examples <= 0 || s.tokens <= 0) fail.push_back("split " + split + " is empty");
    if (task.eval_batch_count(split, 4) <= 0) {
      fail.push_back("split " + split + " has no evaluation batches");
      continue;
    }
    const Batch b = task.eval_batch(split, 0, 4);
    if (b.valid.defined() && b.valid.sizes() != b.tokens.sizes())
      fail.push_back("split " + split + ": valid mask shape differs from tokens");
  }
  const Batch a = task.train_batch(3, 5, 4), again = task.train_batch(3, 5, 4);
  if (!at::equal(a.tokens, again.tokens) || !at::equal(a.targets, again.targets))
    fail.push_back("training batches are not a pure function of (seed, step)");
  if (a.tokens.min().item<int64_t>() < 0 || a.tokens.max().item<int64_t>() >= task.vocab_size())
    fail.push_back("tokens outside the vocabulary");
  const int64_t top = task.head() == TaskHead::Classifier ? task.n_classes() : task.vocab_size();
  if (a.targets.min().item<int64_t>() < 0 || a.targets.max().item<int64_t>() >= top)
    fail.push_back(task.head() == TaskHead::Classifier ? "labels outside 0..n_classes-1"
                                                       : "targets outside the vocabulary");
  return fail;
}

}  // namespace chiar
