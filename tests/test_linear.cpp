// chiar::linear and gemm_into on every GEMM library this build has, against
// float64 products written out from the definition.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>
#include <torch/autograd.h>

#include <array>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/autocast_compat.h"
#include "core/row_passes.h"
#include "model/model.h"
#include "engine/runtime/runtime.h"
#include "chiar/error.h"
#include "chiar/gelu.h"
#include "chiar/kernels.h"
#include "chiar/linear.h"
#include "chiar/row_kernels.h"
#include "support/fixtures.h"
#include "support/skip.h"

using namespace chiar;
using test::rel_error;

namespace {

// y[i][j] = sum_k x[i][k] w[j][k] + b[j] + a[i][j], in float64 loops.
at::Tensor reference_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& a) {
  const int64_t k = x.size(-1), n = w.size(0);
  auto x2 = x.to(at::kDouble).reshape({-1, k}).contiguous();
  auto w2 = w.to(at::kDouble).contiguous();
  auto y = at::zeros({x2.size(0), n}, x2.options());
  auto X = x2.accessor<double, 2>();
  auto W = w2.accessor<double, 2>();
  auto Y = y.accessor<double, 2>();
  for (int64_t i = 0; i < x2.size(0); ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += X[i][c] * W[j][c];
      Y[i][j] = s;
    }
  if (b.defined()) y += b.to(at::kDouble);
  if (a.defined()) y += a.to(at::kDouble).reshape({-1, n});
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return y.view(shape);
}

struct Case {
  std::vector<int64_t> x_shape;
  int64_t n;
  bool bias, addend, transposed_x;
};

}  // namespace

TEST_CASE("linear matches the float64 definition on every GEMM library, forward and backward", "[linear]") {
  const std::vector<Case> cases = {
      {{7, 5}, 3, true, false, false},       {{2, 9, 16}, 24, true, true, false}, {{2, 9, 16}, 24, false, true, false},
      {{2, 9, 16}, 24, false, false, false}, {{1, 1}, 1, true, true, false},      {{33, 64}, 1, true, false, false},
      {{6, 1}, 40, false, true, false},      {{12, 20}, 8, true, true, true},
  };
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    for (const auto& c : cases) {
      INFO("backend " << to_string(backend) << ", x " << at::IntArrayRef(c.x_shape) << ", n " << c.n << ", bias "
                      << c.bias << ", addend " << c.addend << ", transposed x " << c.transposed_x);
      at::manual_seed(5);
      auto x = c.transposed_x ? at::randn({c.x_shape[1], c.x_shape[0]}).t() : at::randn(c.x_shape);
      auto w = at::randn({c.n, c.x_shape.back()});
      auto b = c.bias ? at::randn({c.n}) : at::Tensor();
      std::vector<int64_t> out_shape = c.x_shape;
      out_shape.back() = c.n;
      auto a = c.addend ? at::randn(out_shape) : at::Tensor();

      // Without grad: the plain product.
      {
        at::NoGradGuard no_grad;
        CHECK(rel_error(linear(x, w, b, a), reference_linear(x, w, b, a)) < 1e-6);
      }
      // With grad: every input's gradient against float64 autograd on the
      // reference's own formula (dy/dx = g W, dy/dW = g^T x, dy/db = sum g, dy/da = g).
      for (auto* t : {&x, &w, &b, &a})
        if (t->defined()) t->requires_grad_(true);
      auto y = linear(x, w, b, a);
      auto g = at::randn(y.sizes());
      y.backward(g);
      auto g64 = g.to(at::kDouble).reshape({-1, c.n});
      auto x64 = x.detach().to(at::kDouble).reshape({-1, c.x_shape.back()});
      CHECK(rel_error(y.detach(), reference_linear(x.detach(), w.detach(), b.defined() ? b.detach() : b,
                                                   a.defined() ? a.detach() : a)) < 1e-6);
      CHECK(rel_error(x.grad(), at::mm(g64, w.detach().to(at::kDouble)).view(x.sizes())) < 1e-6);
      CHECK(rel_error(w.grad(), at::mm(g64.t(), x64)) < 1e-6);
      if (c.bias) CHECK(rel_error(b.grad(), g64.sum(0)) < 1e-6);
      if (c.addend) CHECK(rel_error(a.grad(), g.to(at::kDouble)) < 1e-12);
    }
  }
}

TEST_CASE("linear follows in-place and replaced weights (the kept transposed copy is refreshed)", "[linear]") {
  // k > n with enough rows takes oneDNN's kept row-major W^T; every library
  // must see each change of the weight.
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    INFO("backend " << to_string(backend));
    at::manual_seed(11);
    auto x = at::randn({300, 48}), w = at::randn({8, 48}), b = at::randn({8});
    at::NoGradGuard no_grad;
    CHECK(rel_error(linear(x, w, b), reference_linear(x, w, b, {})) < 1e-6);
    CHECK(rel_error(linear(x, w, b), reference_linear(x, w, b, {})) < 1e-6);  // the kept copy
    w.mul_(-2.0).add_(0.5);                                                   // in place, as an optimiser step
    CHECK(rel_error(linear(x, w, b), reference_linear(x, w, b, {})) < 1e-6);
    w.set_data(at::randn({8, 48}));  // new storage, as a checkpoint load onto another device would
    CHECK(rel_error(linear(x, w, b), reference_linear(x, w, b, {})) < 1e-6);
    auto w2 = at::randn({8, 48});  // a second weight alongside
    CHECK(rel_error(chiar::linear(x, w2), reference_linear(x, w2, {}, {})) < 1e-6);
    CHECK(rel_error(linear(x, w, b), reference_linear(x, w, b, {})) < 1e-6);
  }
}

TEST_CASE("linear leaves float64 to libtorch whatever the library", "[linear]") {
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    INFO("backend " << to_string(backend));
    at::manual_seed(6);
    auto x = at::randn({4, 6, 8}, at::kDouble), w = at::randn({5, 8}, at::kDouble), b = at::randn({5}, at::kDouble);
    auto a = at::randn({4, 6, 5}, at::kDouble);
    CHECK(rel_error(linear(x, w, b, a), reference_linear(x, w, b, a)) < 1e-14);
  }
}

namespace {

// bf16 autocast on the CPU for a scope, its weight cache cleared after.
struct CpuBf16Autocast {
  CpuBf16Autocast() { chiar::autocast::set_cpu(true, at::kBFloat16); }
  ~CpuBf16Autocast() {
    chiar::autocast::set_cpu(false);
    at::autocast::clear_cache();
  }
};

at::Tensor rounded(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kDouble); }

}  // namespace

// Where oneDNN has bf16 kernels, linear() under CPU bf16 autocast rounds its
// operands to bf16 and sums their products in fp32 into an fp32 output, and
// its gradients likewise (the incoming gradient rounded to bf16). The
// float64 reference takes the same rounded operands, so only fp32 sums err:
// within 1e-5 relative at these sizes. Against the unrounded operands the
// output is within bf16's rounding of the two factors: each is off by at
// most 2^-9 relative (8-bit mantissa, round to nearest), a product by at most
// about 2^-8, and a sum of products with random signs by that much of the
// sum of their magnitudes; 2^-6 of the output's norm bounds it here. Elsewhere
// (no native bf16) the product is libtorch's autocast linear, exactly.
TEST_CASE("linear under bf16 autocast: bf16 operands summed in fp32, fp32 output and gradients", "[linear][bf16]") {
  INFO("oneDNN's bf16 kernels here: " << (gemm_bf16_native() ? "yes" : "no (libtorch's autocast path)"));
  at::manual_seed(12);
  // (B, T, k, n): sizes gemm_bf16 runs on its layout's primitive for any
  // size, multiples of 32, whose two weight products read the weight packed
  // (gemm_bf16_pack_b), and 1,203 rows, whose bias gradient is summed in
  // parts of rows while gy is rounded (as_bf16_with_column_sums).
  for (const auto& [B, T, k, n] :
       std::vector<std::array<int64_t, 4>>{{3, 7, 40, 24}, {2, 32, 64, 96}, {3, 401, 24, 40}})
    for (const bool bf16_input : {false, true}) {
      INFO("input " << (bf16_input ? "bf16" : "fp32") << ", (" << B << ", " << T << ", " << k << ") -> " << n);
      auto x = at::randn({B, T, k});
      if (bf16_input) x = x.to(at::kBFloat16);
      x.requires_grad_(true);
      auto w = at::randn({n, k}).requires_grad_(true), b = at::randn({n}).requires_grad_(true);
      auto a = at::randn({B, T, n}).requires_grad_(true);
      const auto gy = at::randn({B, T, n});
      at::Tensor y;
      const uint64_t reads_before = gemm_bf16_packed_b_reads();
      {
        CpuBf16Autocast cast;
        y = linear(x, w, b, a);
      }
      y.backward(gy);
      // x W^T and gy W read the packed weight; gy^T x reads activations.
      const bool packs = gemm_bf16_native() && k % 32 == 0 && n % 32 == 0 && (B * T) % 32 == 0;
      CHECK(gemm_bf16_packed_b_reads() - reads_before == (packs ? 2u : 0u));
      if (!gemm_bf16_native()) {
        CpuBf16Autocast cast;
        const auto expected = at::linear(x.detach(), w.detach(), b.detach()) + a.detach();
        CHECK(rel_error(y.detach(), expected) == 0);
        continue;
      }
      CHECK(y.scalar_type() == at::kFloat);
      const auto xr = rounded(x.detach()), wr = rounded(w.detach());
      CHECK(rel_error(y.detach(), reference_linear(xr, wr, b.detach(), a.detach())) < 1e-5);
      CHECK(rel_error(y.detach(), reference_linear(x.detach(), w.detach(), b.detach(), a.detach())) <
            std::ldexp(1.0, -6));
      const auto gyr = rounded(gy).reshape({-1, n});  // (M, n)
      CHECK(x.grad().scalar_type() == x.scalar_type());
      CHECK(rel_error(x.grad().to(at::kDouble).reshape({-1, k}), at::mm(gyr, wr)) < (bf16_input ? 1e-2 : 1e-5));
      CHECK(rel_error(w.grad(), at::mm(gyr.t(), xr.reshape({-1, k}))) < 1e-5);
      CHECK(rel_error(b.grad(), gy.to(at::kDouble).reshape({-1, n}).sum(0)) < 1e-6);
      CHECK(at::equal(a.grad(), gy));
    }
}

// linear_bf16_out under bf16 autocast: the output bf16, each entry summed in
// fp32 with its bias and rounded once, so within 2^-9 of itself (round to
// nearest, 8 significant bits) of the same sums from the rounded operands,
// which a float64 reference takes; 2^-8 of the output's norm bounds the
// whole. Its gradient arrives in bf16; x's gradient is written in x's type
// (a bf16 x: rounded once, 2^-8 again), the weight's and the bias's in fp32
// from the bf16 gradient's values exactly. Outside autocast it is linear().
TEST_CASE("linear_bf16_out: bf16 output and gradients under bf16 autocast, linear() elsewhere", "[linear][bf16]") {
  INFO("oneDNN's bf16 kernels here: " << (gemm_bf16_native() ? "yes" : "no (it is linear(): libtorch's path)"));
  at::manual_seed(15);
  // (rows, k, n): sizes of any layout, and multiples of 32 whose weight is
  // read packed.
  for (const auto& [rows, k, n] : std::vector<std::array<int64_t, 3>>{{21, 40, 24}, {64, 64, 96}})
    for (const bool bf16_input : {false, true})
      for (const bool with_bias : {false, true}) {
        INFO("(" << rows << ", " << k << ") -> " << n << ", input " << (bf16_input ? "bf16" : "fp32")
                 << (with_bias ? ", bias" : ""));
        auto x = at::randn({rows, k});
        if (bf16_input) x = x.to(at::kBFloat16);
        x.requires_grad_(true);
        auto w = at::randn({n, k}).requires_grad_(true);
        auto b = with_bias ? at::randn({n}).requires_grad_(true) : at::Tensor();
        const auto gy = at::randn({rows, n}).to(at::kBFloat16);  // (rows, n)
        at::Tensor y;
        {
          CpuBf16Autocast cast;
          y = linear_bf16_out(x, w, b);
        }
        if (!gemm_bf16_native()) {
          CHECK(y.scalar_type() == at::kBFloat16);  // libtorch's autocast linear
          continue;
        }
        REQUIRE(y.scalar_type() == at::kBFloat16);
        y.backward(gy);
        const auto xr = rounded(x.detach()), wr = rounded(w.detach());
        const auto expected = reference_linear(xr, wr, with_bias ? b.detach() : at::Tensor(), at::Tensor());
        CHECK(rel_error(y.detach(), expected) < std::ldexp(1.0, -8));
        CHECK(((y.detach().to(at::kDouble) - expected).abs() <= expected.abs() * std::ldexp(1.0, -8) + 1e-5)
                  .all()
                  .item<bool>());
        const auto gyd = gy.to(at::kDouble);
        REQUIRE(x.grad().scalar_type() == x.scalar_type());
        CHECK(rel_error(x.grad(), at::mm(gyd, wr)) < (bf16_input ? std::ldexp(1.0, -8) : 1e-5));
        CHECK(rel_error(w.grad(), at::mm(gyd.t(), xr)) < 1e-5);
        if (with_bias) CHECK(rel_error(b.grad(), gyd.sum(0)) < 1e-6);
      }
  // Without autocast: linear() itself, fp32 out.
  const auto x = at::randn({5, 8}), w = at::randn({6, 8}), b = at::randn({6});
  const auto y = linear_bf16_out(x, w, b);
  CHECK(y.scalar_type() == at::kFloat);
  CHECK(at::equal(y, chiar::linear(x, w, b)));
}

// linear_bias_gelu: in grad mode bias_gelu(linear_bf16_out(x, w), b) itself
// (the same values and gradients); without it, under bf16 autocast with
// bf16 kernels, one product whose kernels add the bias and take the GELU
// before rounding once: within 2^-8 of each entry of float64's gelu of the
// same bf16 operands (plus the sums' error near zero), where the
// composition rounds the pre-activation too. Outside autocast, the
// composition in fp32.
TEST_CASE("linear_bias_gelu: the FFN's up projection and GELU, fused without grad mode under bf16",
          "[linear][bf16][gelu]") {
  INFO("oneDNN's bf16 kernels here: " << (gemm_bf16_native() ? "yes" : "no (the composition)"));
  at::manual_seed(17);
  const auto composition = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    auto u = linear_bf16_out(x, w);
    return bias_gelu_(u, b);
  };
  // (rows, k, n): multiples of 32 (a primitive for the shape, the weight
  // packed) and sizes of any layout.
  for (const auto& [rows, k, n] : std::vector<std::array<int64_t, 3>>{{64, 64, 96}, {21, 40, 24}}) {
    INFO("(" << rows << ", " << k << ") -> " << n);
    const auto x = at::randn({3, rows, k}), w = at::randn({n, k}) * 0.2, b = at::randn({n});
    const auto sums = at::matmul(rounded(x), rounded(w).t()) + b.to(at::kDouble);  // (3, rows, n)
    const auto expected = at::gelu(sums);
    {
      const at::NoGradGuard no_grad;
      CpuBf16Autocast cast;
      const uint64_t before = host_kernel_count();
      const auto y = linear_bias_gelu(x, w, b);
      CHECK(y.sizes() == expected.sizes());
      CHECK(y.scalar_type() == at::kBFloat16);
      if (gemm_bf16_native()) {
        CHECK(host_kernel_count() > before);
        const auto near_zero = (sums.abs() * std::ldexp(1.0, -16) + 1e-6 + 1e-7 * static_cast<double>(k)) * 1.13;
        CHECK((((y.to(at::kDouble) - expected).abs() <= expected.abs() * std::ldexp(1.0, -8) + near_zero)
                   .all()
                   .item<bool>()));
        // The composition rounds twice; the two agree to bf16's rounding,
        // and differ somewhere (the fused product ran, not the composition).
        const auto composed = composition(x, w, b);
        CHECK(rel_error(y, composed) < std::ldexp(1.0, -7));
        CHECK_FALSE(at::equal(y, composed));
      } else {
        CHECK(at::equal(y, composition(x, w, b)));
      }
    }
    // Grad mode: the composition, values and gradients.
    for (const bool bf16 : {false, true}) {
      INFO((bf16 ? "bf16 autocast" : "fp32"));
      auto xa = x.clone().requires_grad_(true), wa = w.clone().requires_grad_(true),
           ba = b.clone().requires_grad_(true);
      auto xb = x.clone().requires_grad_(true), wb = w.clone().requires_grad_(true),
           bb = b.clone().requires_grad_(true);
      at::Tensor ya, yb;
      {
        const autocast::Bf16Scope cast(bf16, x.device());
        ya = linear_bias_gelu(xa, wa, ba);
        yb = bias_gelu(linear_bf16_out(xb, wb), bb);
      }
      CHECK(at::equal(ya, yb));
      const auto g = at::randn(ya.sizes()).to(ya.scalar_type());
      ya.backward(g);
      yb.backward(g);
      CHECK(at::equal(xa.grad(), xb.grad()));
      CHECK(at::equal(wa.grad(), wb.grad()));
      CHECK(at::equal(ba.grad(), bb.grad()));
    }
    // fp32 without grad mode: the composition in place, exactly.
    const at::NoGradGuard no_grad;
    CHECK(at::equal(linear_bias_gelu(x, w, b), composition(x, w, b)));
  }
}

// gemm_bf16_packed_b_rounded against float64 of the same bf16 operands: each
// entry rounded once from an fp32 sum, so within 2^-8 of itself (2^-9 for the
// rounding, the rest for fp32 sums near a rounding boundary), plus the fp32
// sum's own error for entries near zero (1e-7 k covers sums of k products of
// unit-sized factors). k 0 is an empty sum: the bias and GELU alone, on the
// widening path. (2048, 1024, 256) is the anchor's up projection, whose
// primitive reads the packed weight where A and C are stored as linear()
// stores them (with wider rows oneDNN picks a kernel that reads B as stored).
TEST_CASE("gemm_bf16_packed_b_rounded: bf16 C, an optional bias, rounded once", "[linear][bf16]") {
  INFO("oneDNN's bf16 kernels here: " << (gemm_bf16_native() ? "yes" : "no (it widens)"));
  at::manual_seed(16);
  for (const auto& [m, n, k] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{7, 6, 5}, {5, 6, 0}, {64, 96, 32}, {2048, 1024, 256}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& [with_bias, gelu] : {std::pair{false, false}, {true, false}, {true, true}}) {
          if (m == 2048 && ta) continue;  // linear() reads A as stored
          INFO(m << "x" << n << "x" << k << ", transposed a " << ta << ", b " << tb << (with_bias ? ", bias" : "")
                 << (gelu ? ", GELU" : ""));
          // Rows wider than they are used, except at the anchor's shape: stored as linear() stores them.
          const int64_t pad = m == 2048 ? 0 : 3, lda = (ta ? m : k) + pad, ldb = tb ? k : n, ldc = n + pad;
          const auto a_store = at::randn({ta ? k : m, lda}).to(at::kBFloat16);
          const auto b_store = at::randn({tb ? n : k, ldb}).to(at::kBFloat16);
          const auto a = a_store.narrow(1, 0, ta ? m : k);
          const auto A = (ta ? a.t() : a).to(at::kDouble), B = (tb ? b_store.t() : b_store).to(at::kDouble);
          const auto bias = at::randn({n});
          const auto packed = gemm_bf16_pack_b(tb, n, k, b_store.data_ptr<c10::BFloat16>(), ldb);
          CHECK(packed.defined() == (gemm_bf16_native() && n % 32 == 0 && k % 32 == 0));
          auto c_store = at::full({m, ldc}, std::numeric_limits<float>::quiet_NaN()).to(at::kBFloat16);
          const uint64_t reads_before = gemm_bf16_packed_b_reads();
          gemm_bf16_packed_b_rounded(
              ta, tb, m, n, k, a_store.data_ptr<c10::BFloat16>(), lda, b_store.data_ptr<c10::BFloat16>(), ldb, packed,
              with_bias ? bias.data_ptr<float>() : nullptr, gelu, c_store.data_ptr<c10::BFloat16>(), ldc);
          if (m == 2048) CHECK(gemm_bf16_packed_b_reads() - reads_before == (gemm_bf16_native() ? 1u : 0u));
          auto sums = at::mm(A, B);  // (m, n)
          if (with_bias) sums = sums + bias.to(at::kDouble);
          const auto expected = gelu ? at::gelu(sums) : sums;
          const auto c = c_store.narrow(1, 0, n).to(at::kDouble);
          // The GELU's slope is at most 1.13, so the sums' error passes
          // through it at most that much larger (2^-16 of a sum's size
          // covers the fp32 sum and the kernel's erf).
          const auto near_zero = gelu
                                     ? (sums.abs() * std::ldexp(1.0, -16) + 1e-6 + 1e-7 * static_cast<double>(k)) * 1.13
                                     : at::full_like(sums, 1e-6 + 1e-7 * static_cast<double>(k));
          CHECK((((c - expected).abs() <= expected.abs() * std::ldexp(1.0, -8) + near_zero).all().item<bool>()));
          CHECK(c_store.narrow(1, n, pad).isnan().all().item<bool>());  // beyond n: untouched
        }
}

// A gradient of the gradient under bf16 autocast: the first gradient, taken
// with create_graph (inside the autocast scope, as a user might), is an fp32
// product of x rounded to bf16 and the weight, so f = sum((d/dW sum(y^2))^2)
// must reach x both through y and through the weight's gradient. Against
// float64 of the unrounded values: bf16's rounding of x and W, about 2^-8 per
// factor, bounds the error at 2^-5 here; the direct path through the weight's
// gradient carries about half of x's gradient, so losing it fails by far.
TEST_CASE("gradients of gradients through linear under bf16 autocast reach x and W", "[linear][bf16][grad]") {
  at::manual_seed(14);
  const auto x0 = at::randn({3, 5, 6}), w0 = at::randn({4, 6}), b0 = at::randn({4});
  const auto f = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool ours) {
    auto y = ours ? chiar::linear(x, w, b) : at::linear(x, w, b);  // (3, 5, 4)
    auto gw = torch::autograd::grad({y.square().sum()}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    return gw.square().sum();
  };
  auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  {
    CpuBf16Autocast cast;
    f(x, w, b0, true).backward();
  }
  auto x64 = x0.to(at::kDouble).requires_grad_(true), w64 = w0.to(at::kDouble).requires_grad_(true);
  f(x64, w64, b0.to(at::kDouble), false).backward();
  CHECK(rel_error(x.grad(), x64.grad()) < std::ldexp(1.0, -5));
  CHECK(rel_error(w.grad(), w64.grad()) < std::ldexp(1.0, -5));
}

TEST_CASE("linear under bf16 autocast follows in-place weight changes and copes with empty batches", "[linear][bf16]") {
  if (!gemm_bf16_native()) {
    INFO("no native bf16 here: libtorch's autocast path, which keeps no weight copies");
  }
  at::manual_seed(13);
  // (rows, k, n): the bf16 copy alone, and the packed copy too (multiples of 32).
  for (const auto& [rows, k, n] : std::vector<std::array<int64_t, 3>>{{5, 8, 6}, {32, 64, 32}}) {
    INFO("(" << rows << ", " << k << ") -> " << n);
    auto w = at::randn({n, k});
    const auto x = at::randn({rows, k});
    CpuBf16Autocast cast;
    const auto before = chiar::linear(x, w);
    {
      at::NoGradGuard no_grad;
      w.mul_(2);  // as an optimiser steps: the version counter moves
    }
    const auto after = chiar::linear(x, w);
    CHECK(rel_error(after.to(at::kFloat), 2 * before.to(at::kFloat)) < 1e-6);
    const auto none = chiar::linear(at::randn({0, k}), w);
    CHECK(none.sizes() == at::IntArrayRef({0, n}));
  }
}

TEST_CASE("gemm_into handles transposed operands, accumulation and empty sums", "[linear]") {
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    INFO("backend " << to_string(backend));
    at::manual_seed(7);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO("transposed a " << ta << ", b " << tb);
        auto a = ta ? at::randn({11, 9}).t() : at::randn({9, 11});    // (9, 11)
        auto b = tb ? at::randn({13, 11}).t() : at::randn({11, 13});  // (11, 13)
        auto c0 = at::randn({9, 13});
        auto c = c0.clone();
        gemm_into(c, a, b, 0.5f);
        auto expected = at::mm(a.to(at::kDouble), b.to(at::kDouble)) + 0.5 * c0.to(at::kDouble);
        CHECK(rel_error(c, expected) < 1e-6);
      }
    // A view that is neither layout is copied, not misread.
    auto strided = at::randn({9, 22}).narrow(1, 0, 11).t().t();  // (9, 11), row stride 22
    auto b = at::randn({11, 4});
    auto c = at::empty({9, 4});
    gemm_into(c, strided, b);
    CHECK(rel_error(c, at::mm(strided.to(at::kDouble), b.to(at::kDouble))) < 1e-6);
    auto e = at::full({3, 2}, 2.0f);
    gemm_into(e, at::empty({3, 0}), at::empty({0, 2}), 0.5f);
    CHECK(rel_error(e, at::full({3, 2}, 1.0, at::kDouble)) == 0);
    auto bad = at::empty({3, 3});
    CHECK_THROWS_WITH(gemm_into(bad, at::empty({3, 2}), at::empty({3, 3})),
                      Catch::Contains("gemm_into: shapes [3, 2] x [3, 3] -> [3, 3] do not match"));
  }
}

TEST_CASE("sgemm on raw memory: transposes, leading dimensions, alpha, beta, inside parallel_for", "[linear]") {
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    INFO("backend " << to_string(backend));
    at::manual_seed(8);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO("transposed a " << ta << ", b " << tb);
        // op(A) (7, 5), op(B) (5, 6), each stored with a wider row than it uses.
        auto a_store = at::randn({ta ? 5 : 7, 12});
        auto b_store = at::randn({tb ? 6 : 5, 10});
        auto a = a_store.narrow(1, 0, ta ? 7 : 5), b = b_store.narrow(1, 0, tb ? 5 : 6);
        auto c_store = at::randn({7, 9});
        auto c0 = c_store.narrow(1, 0, 6).to(at::kDouble);
        auto tail = c_store.narrow(1, 6, 3).clone();
        sgemm(ta, tb, 7, 6, 5, 1.5f, a_store.data_ptr<float>(), 12, b_store.data_ptr<float>(), 10, 0.25f,
              c_store.data_ptr<float>(), 9);
        const auto A = (ta ? a.t() : a).to(at::kDouble), B = (tb ? b.t() : b).to(at::kDouble);
        CHECK(rel_error(c_store.narrow(1, 0, 6), 1.5 * at::mm(A, B) + 0.25 * c0) < 1e-6);
        CHECK(at::equal(c_store.narrow(1, 6, 3), tail));  // beyond n: untouched
      }
    // beta 0 ignores NaN in C; an empty sum scales C by beta.
    auto a = at::randn({4, 3}), b = at::randn({3, 2});
    auto c = at::full({4, 2}, std::numeric_limits<float>::quiet_NaN());
    sgemm(false, false, 4, 2, 3, 1.f, a.data_ptr<float>(), 3, b.data_ptr<float>(), 2, 0.f, c.data_ptr<float>(), 2);
    CHECK(rel_error(c, at::mm(a.to(at::kDouble), b.to(at::kDouble))) < 1e-6);
    sgemm(false, false, 4, 2, 0, 1.f, a.data_ptr<float>(), 3, b.data_ptr<float>(), 2, 0.f, c.data_ptr<float>(), 2);
    CHECK(at::equal(c, at::zeros({4, 2})));
    // Many single-threaded calls side by side, as the fused attention core makes.
    auto as = at::randn({16, 8, 8}), bs = at::randn({16, 8, 8}), cs = at::empty({16, 8, 8});
    at::parallel_for(0, 16, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        sgemm(false, true, 8, 8, 8, 1.f, as[i].data_ptr<float>(), 8, bs[i].data_ptr<float>(), 8, 0.f,
              cs[i].data_ptr<float>(), 8);
    });
    CHECK(rel_error(cs, at::matmul(as.to(at::kDouble), bs.to(at::kDouble).transpose(1, 2))) < 1e-6);
  }
}

TEST_CASE("gemm_bf16: bf16 operands summed in fp32, on oneDNN's kernels and widened, transposes and beta",
          "[linear][bf16]") {
  using Gemm = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const c10::BFloat16*, int64_t,
                        const c10::BFloat16*, int64_t, float, float*, int64_t);
  INFO("oneDNN's bf16 kernels here: " << (gemm_bf16_native() ? "yes" : "no (both runs widen)"));
  for (const auto& [name, gemm] :
       {std::make_pair("gemm_bf16", Gemm{gemm_bf16}), std::make_pair("gemm_bf16_widened", Gemm{gemm_bf16_widened}),
        std::make_pair("gemm_bf16_tile", Gemm{gemm_bf16_tile}),
        std::make_pair("gemm_bf16_any_size", Gemm{gemm_bf16_any_size})}) {
    INFO(name);
    at::manual_seed(9);
    // (m, n, k): odd sizes, one with the anchor's width and a long sum, and
    // one of multiples of 32 (gemm_bf16 makes it a primitive of its own).
    for (const auto& [m, n, k] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{7, 6, 5}, {33, 300, 256}, {64, 96, 32}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          INFO(m << "x" << n << "x" << k << ", transposed a " << ta << ", b " << tb);
          // op(A) (m, k), op(B) (k, n), each stored with a wider row than it uses.
          const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 4;
          const auto a_store = at::randn({ta ? k : m, lda}).to(at::kBFloat16);
          const auto b_store = at::randn({tb ? n : k, ldb}).to(at::kBFloat16);
          const auto a = a_store.narrow(1, 0, ta ? m : k), b = b_store.narrow(1, 0, tb ? k : n);
          const auto A = (ta ? a.t() : a).to(at::kDouble), B = (tb ? b.t() : b).to(at::kDouble);
          // Twice: a primitive made on the first run, kept for the second.
          GemmBf16Primitives after_first;
          for (int run = 1; run <= 2; ++run) {
            INFO("run " << run);
            if (run == 2) after_first = gemm_bf16_primitives_made();
            auto c_store = at::randn({m, ldc});
            const auto c0 = c_store.narrow(1, 0, n).to(at::kDouble);
            const auto tail = c_store.narrow(1, n, 4).clone();
            gemm(ta, tb, m, n, k, 1.5f, a_store.data_ptr<c10::BFloat16>(), lda, b_store.data_ptr<c10::BFloat16>(), ldb,
                 0.25f, c_store.data_ptr<float>(), ldc);
            // Products of bf16 values are exact in fp32: only the fp32 sums err.
            CHECK(rel_error(c_store.narrow(1, 0, n), 1.5 * at::mm(A, B) + 0.25 * c0) < 1e-5);
            CHECK(at::equal(c_store.narrow(1, n, 4), tail));  // beyond n: untouched
          }
          CHECK(gemm_bf16_primitives_made().for_shape == after_first.for_shape);
          CHECK(gemm_bf16_primitives_made().for_any_size == after_first.for_any_size);
        }
    // beta 0 ignores NaN in C; an empty sum scales C by beta.
    const auto a = at::randn({4, 3}).to(at::kBFloat16), b = at::randn({3, 2}).to(at::kBFloat16);
    auto c = at::full({4, 2}, std::numeric_limits<float>::quiet_NaN());
    gemm(false, false, 4, 2, 3, 1.f, a.data_ptr<c10::BFloat16>(), 3, b.data_ptr<c10::BFloat16>(), 2, 0.f,
         c.data_ptr<float>(), 2);
    CHECK(rel_error(c, at::mm(a.to(at::kDouble), b.to(at::kDouble))) < 1e-6);
    gemm(false, false, 4, 2, 0, 1.f, a.data_ptr<c10::BFloat16>(), 3, b.data_ptr<c10::BFloat16>(), 2, 0.f,
         c.data_ptr<float>(), 2);
    CHECK(at::equal(c, at::zeros({4, 2})));
  }
}

TEST_CASE("gemm_bf16_tile: many tiles side by side inside at::parallel_for, each on its own thread's primitives",
          "[linear][bf16]") {
  INFO("oneDNN's bf16 kernels here: " << (gemm_bf16_native() ? "yes" : "no (the tiles widen)"));
  at::manual_seed(10);
  // 24 products of three shapes (a tile's scores, its output, a gradient
  // summed onto), as attention's fused core makes them per (tile, head).
  // Shapes of multiples of 32 get primitives of their own, the others their
  // layout's for any size: both run side by side.
  const std::vector<std::tuple<int64_t, int64_t, int64_t, bool>> shapes{
      {32, 48, 16, false}, {32, 64, 32, false}, {16, 48, 32, true}};
  std::vector<at::Tensor> as, bs, cs, want;
  for (int i = 0; i < 24; ++i) {
    const auto [m, n, k, ta] = shapes[static_cast<size_t>(i % 3)];
    as.push_back(at::randn({ta ? k : m, ta ? m : k}).to(at::kBFloat16));
    bs.push_back(at::randn({k, n}).to(at::kBFloat16));
    cs.push_back(at::randn({m, n}));
    const auto a = ta ? as.back().t() : as.back();
    want.push_back(at::mm(a.to(at::kDouble), bs.back().to(at::kDouble)) + (ta ? 1.0 : 0.0) * cs.back().to(at::kDouble));
  }
  const uint64_t tiles_before = gemm_bf16_tile_count();
  at::parallel_for(0, 24, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto [m, n, k, ta] = shapes[static_cast<size_t>(i % 3)];
      auto& c = cs[static_cast<size_t>(i)];
      gemm_bf16_tile(ta, false, m, n, k, 1.f, as[static_cast<size_t>(i)].data_ptr<c10::BFloat16>(), ta ? m : k,
                     bs[static_cast<size_t>(i)].data_ptr<c10::BFloat16>(), n, ta ? 1.f : 0.f, c.data_ptr<float>(), n);
    }
  });
  for (size_t i = 0; i < cs.size(); ++i) {
    INFO("product " << i);
    CHECK(rel_error(cs[i], want[i]) < 1e-5);
  }
  CHECK(gemm_bf16_tile_count() - tiles_before == (gemm_bf16_native() ? 24u : 0u));
}

TEST_CASE("gemm_bf16: row counts that change every call make no primitive each; a model's own shapes get theirs",
          "[linear][bf16]") {
  const bool native = gemm_bf16_native();
  INFO("oneDNN's bf16 kernels here: " << (native ? "yes" : "no (gemm_bf16 widens to sgemm: no primitives)"));
  at::manual_seed(11);
  // A projection (rows, 64) x (64, 64)^T: rows a routed segment's, new
  // every step, or a whole batch's.
  const auto w = at::randn({64, 64}).to(at::kBFloat16);  // (n, k)
  const auto product = [&](int64_t rows, decltype(gemm_bf16) gemm) {
    const auto x = at::randn({rows, 64}).to(at::kBFloat16);  // (rows, k)
    auto y = at::empty({rows, 64});                          // (rows, n)
    gemm(false, true, rows, 64, 64, 1.f, x.data_ptr<c10::BFloat16>(), 64, w.data_ptr<c10::BFloat16>(), 64, 0.f,
         y.data_ptr<float>(), 64);
    CHECK(rel_error(y, at::mm(x.to(at::kDouble), w.to(at::kDouble).t())) < 1e-5);
    return y;
  };
  const auto before = gemm_bf16_primitives_made();
  for (int64_t rows = 1025; rows < 1056; ++rows) {
    INFO(rows << " rows");
    // The path is the shape's alone: the layout's primitive for any size,
    // the same bits as gemm_bf16_any_size gives (the same seed, so the same x).
    at::manual_seed(rows);
    const auto y = product(rows, gemm_bf16);
    at::manual_seed(rows);
    CHECK(at::equal(y, product(rows, gemm_bf16_any_size)));
  }
  const auto varying = gemm_bf16_primitives_made();
  CHECK(varying.for_shape == before.for_shape);
  // One for the layout (none if an earlier case made it; none widening).
  CHECK(varying.for_any_size - before.for_any_size <= (native ? 1u : 0u));
  for (int step = 0; step < 5; ++step) product(1184, gemm_bf16);  // a size no other case runs
  const auto own = gemm_bf16_primitives_made();
  CHECK(own.for_shape - varying.for_shape == (native ? 1u : 0u));
  CHECK(own.for_any_size == varying.for_any_size);
}

TEST_CASE("gemm_bf16_packed_b: a weight packed once gives gemm_bf16's products; sizes it cannot pack read B as stored",
          "[linear][bf16]") {
  const bool native = gemm_bf16_native();
  if (!native) WARN("no oneDNN bf16 kernels here: nothing is packed, and only the widened products are checked");
  at::manual_seed(12);
  // w (n_out, k_in) read as forward's op(B) = w^T and as backward's op(B) = w,
  // at widths of multiples of 32 (packed) and not (read as stored); rows
  // of multiples of 32 (a primitive of the shape's own, reading the packed
  // copy) and not (the layout's for any size, reading w).
  for (const auto& [n_out, k_in] : std::vector<std::pair<int64_t, int64_t>>{{96, 64}, {64, 160}, {48, 40}})
    for (const bool forward : {true, false}) {
      const int64_t n = forward ? n_out : k_in, k = forward ? k_in : n_out;  // op(B) (k, n)
      const auto w = at::randn({n_out, k_in}).to(at::kBFloat16);
      const auto* wp = w.data_ptr<c10::BFloat16>();
      const auto packed = gemm_bf16_pack_b(/*trans_b=*/forward, n, k, wp, k_in);
      INFO("w " << n_out << "x" << k_in << (forward ? ", x w^T" : ", gy w"));
      CHECK(packed.defined() == (native && n % 32 == 0 && k % 32 == 0));
      if (packed.defined()) CHECK(packed.sizes() == at::IntArrayRef{k, n});
      const auto B = forward ? w.to(at::kDouble).t() : w.to(at::kDouble);  // (k, n)
      for (const int64_t m : {64, 50}) {
        INFO(m << " rows");
        const auto a = at::randn({m, k}).to(at::kBFloat16);  // (m, k)
        auto c = at::randn({m, n}), plain = c.clone();       // (m, n)
        const auto c0 = c.to(at::kDouble);
        const uint64_t reads_before = gemm_bf16_packed_b_reads();
        gemm_bf16_packed_b(false, forward, m, n, k, 1.5f, a.data_ptr<c10::BFloat16>(), k, wp, k_in, packed, 0.5f,
                           c.data_ptr<float>(), n);
        gemm_bf16(false, forward, m, n, k, 1.5f, a.data_ptr<c10::BFloat16>(), k, wp, k_in, 0.5f,
                  plain.data_ptr<float>(), n);
        // Rows of multiples of 32: the shape's own primitive, which reads the packed copy.
        CHECK(gemm_bf16_packed_b_reads() - reads_before == (packed.defined() && m % 32 == 0 ? 1u : 0u));
        const auto want = 1.5 * at::mm(a.to(at::kDouble), B) + 0.5 * c0;
        CHECK(rel_error(c, want) < 1e-5);  // products of bf16 values are exact in fp32: only the sums err
        CHECK(rel_error(c, plain.to(at::kDouble)) < 1e-6);
      }
    }
  // A packed copy of another op(B)'s sizes is not read, even one whose
  // padded layout is as large (n 32 and 64 both fill one block of 64
  // columns). (One of the same sizes would be: the caller keeps each copy
  // with its B.)
  const auto w = at::randn({64, 64}).to(at::kBFloat16);
  const auto other = gemm_bf16_pack_b(true, 32, 64, w.data_ptr<c10::BFloat16>(), 64);
  const auto a = at::randn({32, 64}).to(at::kBFloat16);
  auto c = at::empty({32, 64});
  const uint64_t reads_before = gemm_bf16_packed_b_reads();
  gemm_bf16_packed_b(false, true, 32, 64, 64, 1.f, a.data_ptr<c10::BFloat16>(), 64, w.data_ptr<c10::BFloat16>(), 64,
                     other, 0.f, c.data_ptr<float>(), 64);
  CHECK(rel_error(c, at::mm(a.to(at::kDouble), w.to(at::kDouble).t())) < 1e-5);
  CHECK(gemm_bf16_packed_b_reads() == reads_before);
}

// Restores the CPU's own choice of bf16 rounding when a test leaves.
struct EmulatedBf16Rounding {
  explicit EmulatedBf16Rounding(bool emulate) { emulate_bf16_rounding(emulate); }
  ~EmulatedBf16Rounding() { emulate_bf16_rounding(false); }
};

TEST_CASE("round_to_bf16 rounds as c10::BFloat16 does: to nearest, ties to even, NaN kept", "[linear][bf16]") {
  // Both roundings where the CPU has AVX512-BF16's instruction, the integer
  // one elsewhere (its fix-ups, NaN and subnormal lanes, are among the values).
  const bool native = bf16_rounding_native();
  const bool emulate = native ? GENERATE(false, true) : true;
  const EmulatedBf16Rounding scope(emulate);
  if (!native) WARN("this CPU has no AVX512-BF16: only the integer rounding is tested");
  INFO((bf16_rounding_native() ? "instruction" : "integer") << " rounding");
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const auto of_bits = [](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  };
  // 1 + 2^-8 lies halfway between 1 and the next bf16 (1 + 2^-7): ties to
  // even give 1; 1 + 3 * 2^-8 lies halfway above 1 + 2^-7, odd: up to 1 + 2^-6.
  // Subnormals (1e-40, the smallest, one that rounds up to the smallest
  // normal bf16), a negative NaN and one with a payload.
  std::vector<float> values{0.f,
                            -0.f,
                            1.f,
                            1.f + 0x1p-8f,
                            1.f + 3 * 0x1p-8f,
                            1.f + 0x1p-9f,
                            -2.5e-3f,
                            inf,
                            -inf,
                            nan,
                            3.4e38f,
                            1e-40f,
                            65504.f,
                            -1.f / 3,
                            1e30f,
                            -7.123f,
                            0x1.fffffep127f,
                            -1e-40f,
                            0x1p-149f,
                            0x1.fffffcp-127f,
                            -nan,
                            of_bits(0x7f812345u)};
  at::manual_seed(11);
  const auto random = at::randn({1000}) * 100;
  for (int64_t i = 0; i < random.numel(); ++i) values.push_back(random[i].item<float>());
  std::vector<uint16_t> got(values.size());
  round_to_bf16(values.data(), got.data(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("value " << values[i]);
    CHECK(got[i] == c10::BFloat16(values[i]).x);  // NaN: 0x7fc0, as c10
  }
  // Rows shorter than a vector and not a multiple of one, at every offset.
  for (int64_t n = 1; n <= 40; ++n) {
    std::vector<uint16_t> part(static_cast<size_t>(n) + 1, 0xabcd);
    round_to_bf16(values.data() + 3, part.data(), n);
    for (int64_t j = 0; j < n; ++j) CHECK(part[static_cast<size_t>(j)] == got[static_cast<size_t>(j) + 3]);
    CHECK(part[static_cast<size_t>(n)] == 0xabcd);  // nothing written past the row
  }
  CHECK(got[3] == c10::BFloat16(1.f).x);
  CHECK(static_cast<float>(c10::BFloat16(got[4], c10::BFloat16::from_bits())) == 1.f + 0x1p-6f);

  // Its two fused forms round the same way: scale_to_bf16 the products
  // values[i] * factor, round_to_bf16_adding the values while adding them up.
  const float factor = -0.37f;
  std::vector<uint16_t> scaled(values.size()), again(values.size());
  scale_to_bf16(values.data(), factor, scaled.data(), static_cast<int64_t>(values.size()));
  std::vector<float> sums(values.size(), 1.f);
  round_to_bf16_adding(values.data(), again.data(), sums.data(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("value " << values[i]);
    CHECK(scaled[i] == c10::BFloat16(values[i] * factor).x);
    CHECK(again[i] == got[i]);
    if (!std::isnan(values[i])) CHECK(sums[i] == 1.f + values[i]);
  }
}

TEST_CASE("to_bf16 converts as libtorch does, bit for bit but for NaN's", "[linear][bf16]") {
  // The CPU's conversion instruction and the integer rounding, where there
  // is the instruction; the integer rounding elsewhere.
  const bool native = bf16_rounding_native();
  const EmulatedBf16Rounding scope(native ? GENERATE(false, true) : true);
  INFO((bf16_rounding_native() ? "instruction" : "integer") << " rounding");
  at::manual_seed(12);
  // More than one task's elements: split over the cores where there are two
  // or more.
  auto x = at::randn({3 * kElementsPerTask + 5}) * 1e3;  // (n,)
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = 1e-40f;                                                  // subnormal
  x[3] = 1.f + 0x1p-8f;                                           // a tie, to even: 1
  const auto weight = at::randn({300, 64}).requires_grad_(true);  // a parameter's values
  const std::vector<at::Tensor> cases{x, weight, weight.t() /* not contiguous */, at::randn({0, 8}),
                                      at::tensor(2.5f) /* 0-dim */};
  for (const auto& t : cases) {
    INFO("sizes " << t.sizes());
    const auto got = to_bf16(t);
    const auto want = t.detach().to(at::kBFloat16).contiguous();
    CHECK(got.scalar_type() == at::kBFloat16);
    CHECK(got.is_contiguous());
    CHECK_FALSE(got.requires_grad());
    CHECK(got.sizes() == t.sizes());
    // A NaN as c10::BFloat16 writes it, 0x7fc0; libtorch's vector loop
    // writes 0xffff.
    const auto nan = t.isnan();
    CHECK(at::equal(got.isnan(), nan));
    CHECK(at::equal(got.view(at::kShort).masked_select(nan.logical_not()),
                    want.view(at::kShort).masked_select(nan.logical_not())));
  }
  CHECK(to_bf16(x)[0].view(at::kShort).item<int16_t>() == c10::BFloat16(std::numeric_limits<float>::quiet_NaN()).x);
  const auto b = at::randn({5, 7}).to(at::kBFloat16);
  CHECK(to_bf16(b).data_ptr() == b.data_ptr());  // already bf16: the same tensor
}

TEST_CASE("batch_matmul matches float64 products over batches of views, forward and backward", "[linear]") {
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    at::manual_seed(9);
    // (G, h, T, dh) like attention's keys: a narrowed, transposed operand is
    // read in place, with batch strides that are not m * k.
    auto q = at::randn({3, 2, 7, 8});                      // (G, h, m, dh)
    auto keys = at::randn({3, 2, 12, 8}).narrow(2, 0, 9);  // (G, h, e, dh), row stride kept
    auto p = at::randn({3, 2, 7, 9});                      // (G, h, m, e)
    auto packed = at::randn({40, 5, 6});                   // many small products: run side by side
    auto mixed = at::randn({40, 3, 6}).transpose(1, 2);    // (40, 6, 3), column-major
    auto rowvec = at::randn({4, 1, 6}), colvec = at::randn({4, 6, 1});
    struct Pair {
      const char* name;
      at::Tensor a, b;
    };
    for (auto c : {Pair{"q k^T", q, keys.transpose(-2, -1)}, Pair{"p v", p, keys}, Pair{"packed", packed, mixed},
                   Pair{"row x column", rowvec, colvec}, Pair{"column x row", colvec, rowvec},
                   Pair{"2-D", q[0][0], keys[0][0].t()}}) {
      INFO("backend " << to_string(backend) << ", " << c.name);
      auto a = c.a.detach().clone().requires_grad_(true);
      auto b = c.b.detach().clone().requires_grad_(true);
      auto expected = at::matmul(c.a.to(at::kDouble), c.b.to(at::kDouble));
      {
        at::NoGradGuard no_grad;
        CHECK(rel_error(batch_matmul(c.a, c.b), expected) < 1e-6);
      }
      auto y = batch_matmul(a, b);
      auto g = at::randn(y.sizes());
      y.backward(g);
      auto g64 = g.to(at::kDouble);
      CHECK(rel_error(a.grad(), at::matmul(g64, c.b.to(at::kDouble).transpose(-2, -1))) < 1e-6);
      CHECK(rel_error(b.grad(), at::matmul(c.a.to(at::kDouble).transpose(-2, -1), g64)) < 1e-6);
    }
    // Broadcasting is left to at::matmul, with its result.
    auto w = at::randn({6, 4});
    CHECK(rel_error(batch_matmul(packed, w), at::matmul(packed.to(at::kDouble), w.to(at::kDouble))) < 1e-6);
  }
}

TEST_CASE("gradients of gradients through linear and batch_matmul match float64", "[linear][grad]") {
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    INFO("backend " << to_string(backend));
    at::manual_seed(10);
    const auto x0 = at::randn({3, 5, 6}), w0 = at::randn({4, 6}), b0 = at::randn({4}), m0 = at::randn({3, 5, 2});
    // f = sum((d/dW sum(y^2))^2) with y = batch_matmul(linear(x, W, b)^T, m): the
    // first gradient, taken with create_graph, must itself be differentiable.
    const auto f = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& m, bool ours) {
      auto h = ours ? linear(x, w, b) : at::linear(x, w, b);                                  // (3, 5, 4)
      auto y = ours ? batch_matmul(h.transpose(1, 2), m) : at::matmul(h.transpose(1, 2), m);  // (3, 4, 2)
      auto gw = torch::autograd::grad({y.square().sum()}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
      return gw.square().sum();
    };
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    f(x, w, b0, m0, true).backward();
    auto x64 = x0.to(at::kDouble).requires_grad_(true), w64 = w0.to(at::kDouble).requires_grad_(true);
    f(x64, w64, b0.to(at::kDouble), m0.to(at::kDouble), false).backward();
    CHECK(rel_error(x.grad(), x64.grad()) < 1e-5);
    CHECK(rel_error(w.grad(), w64.grad()) < 1e-5);
  }
}

TEST_CASE("a model trains to the same numbers on every GEMM library", "[linear][model]") {
  if (!onednn_available()) CHIAR_SKIP("[linear]", "this build has no oneDNN: one GEMM library, nothing to compare");
  std::vector<std::vector<at::Tensor>> grads;
  std::vector<at::Tensor> logits;
  for (const auto backend : test::gemm_backends()) {
    test::BackendScope scope(backend);
    at::manual_seed(8);
    // One operator per layer: a routed layer could flip a borderline
    // decision on a last-bit difference and compare different models.
    model::ChiarModel model(test::plugins(), model::ModelOptions().vocab_size(40).d_model(16).n_heads(2).seed(4).layers(
                                                 {"dct", "rbf", "attn"}));
    auto tokens = at::randint(40, {3, 10}, at::TensorOptions().dtype(at::kLong));
    auto out = model.forward(tokens);
    out.logits.square().mean().backward();
    logits.push_back(out.logits.detach());
    grads.emplace_back();
    for (const auto& p : model.parameters()) grads.back().push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  }
  CHECK(rel_error(logits[1], logits[0]) < 1e-5);
  for (size_t i = 0; i < grads[0].size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(grads[0][i].defined() == grads[1][i].defined());
    if (grads[0][i].defined()) CHECK(rel_error(grads[1][i], grads[0][i]) < 1e-4);
  }
}

TEST_CASE("the GEMM library is chosen by name, and a wrong name says which are known", "[linear][runtime]") {
  test::BackendScope scope(gemm_backend());
  CHECK_THROWS_WITH(engine::configure_gemm("mkl"), "unknown gemm backend 'mkl' (known: auto, blas, onednn)");
  CHECK_THROWS_WITH(gemm_backend_from_string("auto"), "unknown gemm backend 'auto' (known: blas, onednn)");
  CHECK(gemm_backend_from_string("onednn") == GemmBackend::OneDnn);
  CHECK(std::string(to_string(gemm_backend_from_string("blas"))) == "blas");
  CHECK(engine::configure_gemm("blas") == "blas (libtorch's path)");
  CHECK(gemm_backend() == GemmBackend::Blas);
  if (onednn_available()) {
    CHECK_THAT(engine::configure_gemm("onednn"), Catch::StartsWith("onednn: oneDNN "));
    CHECK(gemm_backend() == GemmBackend::OneDnn);
  } else {
    CHECK_THROWS_WITH(set_gemm_backend(GemmBackend::OneDnn),
                      "gemm backend 'onednn': this build has no oneDNN "
                      "(configure with libdnnl-dev installed and CHIAR_WITH_ONEDNN=ON)");
  }
}

TEST_CASE("a resumed run keeps the GEMM library it began on unless another is asked for", "[linear][runtime][resume]") {
  engine::RuntimeInfo timed;  // a process whose start-up timing chose oneDNN
  timed.gemm_library = "onednn";
  timed.gemm = "onednn: oneDNN 2.6.3 sgemm; auto: 2048x256x1024 at 280 GFLOP/s on oneDNN, 190 on the BLAS";
  timed.gemm_timed = true;
  const std::string began_blas =
      "blas (libtorch's path); auto: 2048x256x1024 at 150 GFLOP/s on oneDNN, 160 on the BLAS";

  // A fresh run (and a run from before the store kept the library) takes the process's choice.
  for (const std::string& none : {std::string(), std::string("mkl: from another harness")}) {
    const engine::RunGemm fresh = engine::gemm_for_run(timed, none);
    CHECK(fresh.library == "onednn");
    CHECK(fresh.record == timed.gemm);
    CHECK(fresh.note.empty());
  }
  // Timing chose the library the run began on: the record of that first decision stays.
  const std::string began_onednn =
      "onednn: oneDNN 2.6.3 sgemm; auto: 2048x256x1024 at 250 GFLOP/s on oneDNN, 200 on the BLAS";
  const engine::RunGemm same = engine::gemm_for_run(timed, began_onednn);
  CHECK(same.library == "onednn");
  CHECK(same.record == began_onednn);
  CHECK(same.note.empty());
  // Timing chose another library: the run keeps its own, and says so.
  const engine::RunGemm kept = engine::gemm_for_run(timed, began_blas);
  CHECK(kept.library == "blas");
  CHECK(kept.record == began_blas);
  CHECK(kept.note == "keeps blas, the library it began on (this process timed onednn faster)");

  // A library asked for is obeyed; the record and the note say the run switched.
  engine::RuntimeInfo asked;
  asked.gemm_library = "onednn";
  asked.gemm = "onednn: oneDNN 2.6.3 sgemm";
  const engine::RunGemm switched = engine::gemm_for_run(asked, began_blas);
  CHECK(switched.library == "onednn");
  CHECK(switched.record == "onednn: oneDNN 2.6.3 sgemm; switched from blas at resumption");
  CHECK(switched.note ==
        "resumes on onednn (as asked); it began on blas, so its results will differ from an uninterrupted run's");
  const engine::RunGemm obeyed = engine::gemm_for_run(asked, began_onednn);
  CHECK(obeyed.record == asked.gemm);
  CHECK(obeyed.note.empty());
  // Resumed again on the library it switched to: the record keeps saying so.
  const engine::RunGemm again = engine::gemm_for_run(asked, switched.record);
  CHECK(again.library == "onednn");
  CHECK(again.record == "onednn: oneDNN 2.6.3 sgemm; switched from blas at resumption");
  CHECK(again.note.empty());

  // A run that began on oneDNN, resumed by a build without it.
  engine::RuntimeInfo no_onednn;
  no_onednn.gemm_library = "blas";
  no_onednn.gemm = "blas (auto: this build has no oneDNN)";
  no_onednn.gemm_timed = true;
  const engine::RunGemm without = engine::gemm_for_run(no_onednn, began_onednn, /*onednn_built=*/false);
  CHECK(without.library == "blas");
  CHECK(without.record == "blas (auto: this build has no oneDNN); switched from onednn at resumption");
  CHECK(without.note ==
        "resumes on blas (this build has no oneDNN); it began on onednn, so its results will "
        "differ from an uninterrupted run's");
  // A process whose timing chose the BLAS, in a build with oneDNN, keeps it.
  engine::RuntimeInfo chose_blas = no_onednn;
  chose_blas.gemm = "blas (libtorch's path); auto: 2048x256x1024 at 150 GFLOP/s on oneDNN, 160 on the BLAS";
  const engine::RunGemm with = engine::gemm_for_run(chose_blas, began_onednn, /*onednn_built=*/true);
  CHECK(with.library == "onednn");
  CHECK(with.record == began_onednn);
  CHECK(with.note == "keeps onednn, the library it began on (this process timed blas faster)");
}
