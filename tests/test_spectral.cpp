#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <sstream>

#include "engine/text/vector_text.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/spectral.h"
#include "core/autocast_compat.h"
#include "support/fixtures.h"
#include "support/reference.h"

using namespace chiar;
namespace ref = chiar::test::ref;
using test::rel_error;

namespace {
const int64_t kSizes[] = {1, 2, 3, 7, 8, 16, 63, 64, 256};
const DctImpl kImpls[] = {DctImpl::Gemm, DctImpl::Fft};
}  // namespace

TEST_CASE("dct_basis equals the definition and is orthonormal", "[spectral]") {
  for (int64_t d : kSizes) {
    auto b = dct_basis(d, at::kDouble, at::kCPU);
    CHECK(rel_error(b, test::ref::dct_matrix(d)) < 1e-13);  // cos of arguments up to ~pi d
    CHECK(rel_error(at::matmul(b, b.t()), at::eye(d, at::TensorOptions().dtype(at::kDouble))) < 1e-13);
  }
}

// A weight of its own: products that keep a bf16 or packed copy per weight
// (chiar::linear under bf16 products) find the same tensor every call.
TEST_CASE("idct_basis is B^T, contiguous, and the same tensor every call", "[spectral]") {
  for (int64_t d : kSizes) {
    INFO("d " << d);
    const auto bt = idct_basis(d, at::kFloat, at::kCPU);
    CHECK(bt.is_contiguous());
    CHECK(at::equal(bt, dct_basis(d, at::kFloat, at::kCPU).t()));
    CHECK(idct_basis(d, at::kFloat, at::kCPU).unsafeGetTensorImpl() == bt.unsafeGetTensorImpl());
    CHECK(rel_error(idct_basis(d, at::kDouble, at::kCPU), test::ref::dct_matrix(d).t()) < 1e-13);
  }
}

TEST_CASE("dct2 matches the float64 definition", "[spectral]") {
  at::manual_seed(1);
  for (auto impl : kImpls)
    for (int64_t d : kSizes) {
      INFO("impl " << to_string(impl) << ", d " << d);
      auto x = at::randn({5, d}, at::TensorOptions().dtype(at::kDouble));
      auto expected = test::ref::dct(x);
      CHECK(rel_error(dct2(x, impl), expected) < 1e-12);
      CHECK(rel_error(dct2(x.to(at::kFloat), impl), expected) < 1e-5);
    }
}

TEST_CASE("idct2 inverts dct2, both implementations agree", "[spectral]") {
  at::manual_seed(2);
  for (int64_t d : kSizes) {
    INFO("d " << d);
    auto x = at::randn({3, 4, d});
    for (auto impl : kImpls) {
      CHECK(rel_error(idct2(dct2(x, impl), impl), x) < 1e-5);
      auto xd = x.to(at::kDouble);
      CHECK(rel_error(idct2(dct2(xd, impl), impl), xd) < 1e-12);
    }
    CHECK(rel_error(dct2(x, DctImpl::Fft), dct2(x, DctImpl::Gemm)) < 1e-5);
    CHECK(rel_error(idct2(x, DctImpl::Fft), idct2(x, DctImpl::Gemm)) < 1e-5);
  }
}

TEST_CASE("dct2 and idct2 are differentiable in both implementations", "[spectral][grad]") {
  at::manual_seed(3);
  for (auto impl : kImpls) {
    auto x = at::randn({2, 7}, at::TensorOptions().dtype(at::kDouble)).requires_grad_(true);
    auto w = at::randn({2, 7}, at::TensorOptions().dtype(at::kDouble));
    CHECK(test::gradcheck([&] { return (idct2(dct2(x, impl) * dct2(x, impl), impl) * w).sum(); }, {x}) < 1e-6);
  }
}

TEST_CASE("spectral entropy: constant, flat spectrum, zero, scale, range, reference", "[spectral]") {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  for (int64_t d : {2, 8, 64, 256}) {
    INFO("d " << d);
    // All energy in the DC bin.
    CHECK(spectral_entropy(at::full({1, d}, 3.0, f64)).item<double>() == Approx(0).margin(1e-9));
    CHECK(spectral_entropy(at::full({1, d}, 3.0)).item<double>() == Approx(0).margin(1e-5));
    // Energy spread evenly over every frequency.
    CHECK(spectral_entropy(idct2(at::ones({1, d}, f64))).item<double>() == Approx(1).epsilon(1e-12));
    CHECK(spectral_entropy(at::zeros({2, d})).eq(0).all().item<bool>());
    auto x = at::randn({64, d}, f64);
    auto h = spectral_entropy(x);
    CHECK(h.ge(0).all().item<bool>());
    CHECK(h.le(1).all().item<bool>());
    CHECK(rel_error(spectral_entropy(x * 1e3), h) < 1e-12);
    CHECK(rel_error(spectral_entropy(x * -1e-3), h) < 1e-12);
    CHECK(rel_error(h, test::ref::entropy(x)) < 1e-12);
    CHECK(rel_error(spectral_entropy(x.to(at::kFloat)), test::ref::entropy(x)) < 1e-5);
  }
  CHECK(spectral_entropy(at::randn({4, 1})).eq(0).all().item<bool>());
}

TEST_CASE("spectral entropy: the fp32 row kernel of inference equals the float64 definition", "[spectral]") {
  at::manual_seed(31);
  for (int64_t d : {2, 3, 17, 64, 256, 1000}) {
    INFO("d " << d);
    auto c = at::randn({300, d}, at::TensorOptions().dtype(at::kDouble));
    c[0].zero_();  // H = 0
    c[1].zero_();
    c[1][d - 1] = 5.0;  // one bin: H = 0
    c[2].fill_(1e-3);   // flat: H = 1
    c[3] *= 1e15;       // scale-free
    c[4] *= 1e-15;
    c[5].narrow(0, 0, d / 2).mul_(1e-20);  // bins below fp32's smallest normal energy
    // Fed as spectra: row r of (300, d), and a strided view of the same rows.
    auto want = test::ref::entropy_from_coeffs(c);
    auto c32 = c.to(at::kFloat);
    auto got = spectral_entropy_from_coeffs(c32);
    CHECK(at::allclose(got.to(at::kDouble), want, /*rtol=*/0, /*atol=*/2e-6));
    auto wide = at::zeros({300, 2 * d});
    wide.narrow(1, 0, d).copy_(c32);
    CHECK(at::equal(spectral_entropy_from_coeffs(wide.narrow(1, 0, d)), got));
    // The autograd path (training) agrees with the kernel (inference).
    auto trained = spectral_entropy_from_coeffs(c32.clone().requires_grad_(true));
    CHECK(at::allclose(trained.detach(), got, /*rtol=*/0, /*atol=*/2e-6));
  }
}

TEST_CASE("spectral entropy: bf16 and fp16 coefficients give fp32 H, non-finite rows give NaN", "[spectral]") {
  at::manual_seed(37);
  for (int64_t d : {1, 2, 17, 64, 256}) {
    INFO("d " << d);
    auto c = at::randn({40, d}, at::TensorOptions().dtype(at::kDouble));  // (40, d)
    c[0].zero_();
    if (d > 1) c[1].narrow(0, 1, d - 1).zero_();  // zeros beside energy: 0 log 0 in fp16 too
    for (const auto type : {at::kBFloat16, at::kHalf}) {
      INFO(at::toString(type));
      const auto rounded = c.to(type);                                            // (40, d)
      const auto want = test::ref::entropy_from_coeffs(rounded.to(at::kDouble));  // (40,)
      // Inference (the row kernel after widening) and training (the
      // composition with autograd) compute the same fp32 H from the rounded values.
      const auto inferred = spectral_entropy_from_coeffs(rounded);
      CHECK(inferred.scalar_type() == at::kFloat);
      CHECK(at::allclose(inferred.to(at::kDouble), want, /*rtol=*/0, /*atol=*/2e-6));
      const auto trained = spectral_entropy_from_coeffs(rounded.clone().requires_grad_(true));
      CHECK(trained.scalar_type() == at::kFloat);
      CHECK(at::allclose(trained.detach().to(at::kDouble), want, /*rtol=*/0, /*atol=*/2e-6));
    }
  }
  // A diverging model's NaN or infinity shows as NaN in H on every path,
  // not as a clamped 0 or 1 that a router would act on.
  auto bad = at::randn({3, 16});  // (3, 16)
  bad[0][3] = std::numeric_limits<float>::quiet_NaN();
  bad[1][5] = std::numeric_limits<float>::infinity();
  bad[2][0] = 1e30f;  // its square overflows fp32
  for (const bool grad : {false, true}) {
    INFO("autograd " << grad);
    const auto h = spectral_entropy_from_coeffs(grad ? bad.clone().requires_grad_(true) : bad);  // (3,)
    CHECK(h.isnan().all().item<bool>());
  }
  CHECK(spectral_entropy_from_coeffs(bad.to(at::kDouble)).isnan().narrow(0, 0, 2).all().item<bool>());
}

TEST_CASE("spectral entropy under bf16 autocast is its fp32 entropy, bit for bit", "[spectral][bf16]") {
  // dct2_exact switches autocast off for the spectrum's product, so a bf16
  // run's entropy is the fp32 one; a bf16 x is widened before the product.
  at::manual_seed(41);
  for (int64_t d : {2, 64, 256}) {
    for (const auto impl : kImpls) {
      INFO("d " << d << ", " << to_string(impl));
      const auto x = at::randn({3, 40, d}) + at::sin(at::arange(d) * 0.3);  // (3, 40, d)
      const auto h32 = spectral_entropy(x, impl);                           // (3, 40)
      const auto c32 = dct2_exact(x, impl);                                 // (3, 40, d)
      at::Tensor h16, c16, bf16_product;
      {
        const autocast::Bf16Scope cast(true, x.device());
        h16 = spectral_entropy(x, impl);
        c16 = dct2_exact(x, impl);
        bf16_product = dct2(x, impl);
        CHECK(autocast::enabled_dtype(at::kCPU) == at::kBFloat16);  // left on
      }
      CHECK(h16.scalar_type() == at::kFloat);
      CHECK(c16.scalar_type() == at::kFloat);
      CHECK(at::equal(h16, h32));
      CHECK(at::equal(c16, c32));
      CHECK(rel_error(h32, spectral_entropy(x.to(at::kDouble), impl)) < 1e-6);
      // Without the switch the GEMM's product takes bf16 operands (the FFT
      // has no autocast rule and stays fp32).
      if (impl == DctImpl::Gemm) CHECK_FALSE(at::equal(bf16_product.to(at::kFloat), c32));
      const auto rounded = x.to(at::kBFloat16);
      CHECK(at::equal(dct2_exact(rounded, impl), dct2(rounded.to(at::kFloat), impl)));
    }
  }
}

TEST_CASE("spectral entropy has finite gradients, also at a zero vector", "[spectral][grad]") {
  auto x = at::zeros({2, 8}, at::TensorOptions().dtype(at::kDouble));
  x[0] = at::randn({8}, at::TensorOptions().dtype(at::kDouble));
  x.requires_grad_(true);
  spectral_entropy(x).sum().backward();
  CHECK(x.grad().isfinite().all().item<bool>());
  auto y = at::randn({3, 6}, at::TensorOptions().dtype(at::kDouble)).requires_grad_(true);
  CHECK(test::gradcheck([&] { return spectral_entropy(y).sum(); }, {y}) < 1e-6);
}

TEST_CASE("spectral entropy in training: the row kernel forward and the closed-form backward equal float64 autograd",
          "[spectral][grad]") {
  at::manual_seed(41);
  for (int64_t d : {2, 3, 17, 64, 256}) {
    INFO("d " << d);
    auto c = at::randn({64, d}, at::TensorOptions().dtype(at::kDouble));  // (64, d)
    c[0].zero_();                                                         // H = 0, gradient 0
    c[1].zero_();
    c[1][d - 1] = 5.0;  // one bin
    c[2].fill_(1e-3);   // flat: H = 1
    c[3] *= 1e15;
    c[4].narrow(0, 0, (d + 1) / 2).mul_(1e-20);  // bins below fp32's smallest normal energy
    const auto upstream = at::randn({64}, at::TensorOptions().dtype(at::kDouble));  // (64,) dL/dH
    for (const auto type : {at::kFloat, at::kBFloat16}) {
      INFO(at::toString(type));
      const auto rounded = c.to(type);  // (64, d)
      // The float64 composition differentiated by autograd (checked against
      // central differences above), from the same rounded values.
      auto leaf64 = rounded.to(at::kDouble).requires_grad_(true);
      const auto want = spectral_entropy_from_coeffs(leaf64);  // (64,)
      (want * upstream).sum().backward();
      auto leaf = rounded.clone().requires_grad_(true);
      const uint64_t before = host_kernel_count();
      const auto h = spectral_entropy_from_coeffs(leaf);  // (64,)
      CHECK(host_kernel_count() == before + 1);           // the forward is the row kernel's
      REQUIRE(h.requires_grad());
      (h * upstream.to(at::kFloat)).sum().backward();
      CHECK(at::allclose(h.detach().to(at::kDouble), want.detach(), /*rtol=*/0, /*atol=*/2e-6));
      REQUIRE(leaf.grad().defined());
      CHECK(leaf.grad().scalar_type() == type);
      // As close to float64 as autograd through the composition in the same
      // precision (KernelPolicy::Compositions); for bf16 coefficients both
      // return the gradient in bf16, whose rounding (2^-9 relative) is most
      // of either's error. The flat row is apart: its
      // gradient is 0, and what either fp32 path gives there is the rounding
      // of the (g_i - mean g) cancellation, scaled by 2 c_i / S = 2 / (d c_i).
      auto composed_leaf = rounded.clone().requires_grad_(true);
      {
        ScopedKernelPolicy aten(KernelPolicy::Compositions);
        (spectral_entropy_from_coeffs(composed_leaf) * upstream.to(at::kFloat)).sum().backward();
      }
      const auto others = at::cat({at::arange(0, 2), at::arange(3, 64)});  // every row but the flat one
      const auto rows = [&](const at::Tensor& g) { return g.to(at::kDouble).index_select(0, others); };
      const double composed_error = rel_error(rows(composed_leaf.grad()), rows(leaf64.grad()));
      const double error = rel_error(rows(leaf.grad()), rows(leaf64.grad()));
      INFO("closed form " << error << ", composition " << composed_error);
      CHECK(error <= std::max(2 * composed_error, type == at::kFloat ? 1e-6 : 1e-3));
      CHECK(error <= (type == at::kFloat ? 1e-5 : 1e-2));
      const double flat_scale = 2.0 / (static_cast<double>(d) * 1e-3);
      CHECK(leaf.grad()[2].abs().max().item<double>() <= 1e-6 * flat_scale);
      CHECK(leaf.grad()[0].abs().max().item<double>() == 0.0);
    }
  }
}

TEST_CASE("calibrate_thresholds reaches the target shares", "[spectral][router]") {
  auto h = at::arange(0, 1001, at::TensorOptions().dtype(at::kDouble)) / 1000.0;  // 0, 0.001, ..., 1
  // The quantiles fall on sample values (0.33, 0.67, 0.5): each threshold moves
  // halfway to the neighbour on the side whose share is nearer the target.
  auto tau = calibrate_thresholds(h, {0.33, 0.34, 0.33});
  REQUIRE(tau.size() == 2);
  CHECK(tau[0] == Approx(0.3295));  // 330 of 1001 below it: 32.97%, against 33.07% above 0.33
  CHECK(tau[1] == Approx(0.6705));  // 671 of 1001: 67.03%
  const double median = calibrate_thresholds(h, {0.5, 0.5})[0];
  CHECK((median == Approx(0.4995) || median == Approx(0.5005)));
  CHECK(calibrate_thresholds(h, {1.0, 0.0})[0] == Approx(1.0));
  // Between two distinct order statistics the quantile interpolates, as numpy's.
  CHECK(calibrate_thresholds(at::tensor({0.0, 1.0, 2.0, 3.0}, at::kDouble), {0.5, 0.5})[0] == Approx(1.5));
  CHECK_THROWS_WITH(calibrate_thresholds(h, {0.5, 0.6}), "threshold calibration: shares must sum to 1, found 1.100000");
  CHECK_THROWS_WITH(calibrate_thresholds(h, {1.0}), "threshold calibration: need at least 2 shares, found 1");
  CHECK_THROWS_WITH(calibrate_thresholds(at::empty({0}), {0.5, 0.5}),
                    "threshold calibration: the entropy sample is empty");
}

TEST_CASE("calibrate_thresholds keeps a cluster of equal entropies on one side", "[spectral][router]") {
  // Tokens of one type: one entropy in exact arithmetic, a few fp32 ulps
  // apart in fact (1e-7 here), ten of sixteen; the median falls among them.
  std::vector<double> values = {0.1, 0.2, 0.3, 0.4};
  for (int k = 0; k < 10; ++k) values.push_back(0.7 + 1e-7 * k);
  values.insert(values.end(), {0.9, 0.95});
  const auto h = at::tensor(values, at::kDouble);
  const double tau = calibrate_thresholds(h, {0.5, 0.5})[0];
  // Cheap side with the cluster: 14 of 16 (87.5%); without: 4 of 16 (25%),
  // nearer 50%; so the threshold sits halfway between 0.4 and the cluster.
  CHECK(tau == Approx(0.55));
  CHECK((h > tau).sum().item<int64_t>() == 12);
}

TEST_CASE("read_vectors parses lines and names the bad line", "[spectral][cli]") {
  std::istringstream good("1 2 3\n4 5 6\n");
  auto v = engine::read_vectors(good, "in");
  CHECK(v.sizes() == at::IntArrayRef({2, 3}));
  CHECK(v[1][2].item<double>() == 6);
  auto fails = [](const std::string& text) {
    std::istringstream in(text);
    engine::read_vectors(in, "in.txt");
  };
  CHECK_THROWS_WITH(fails("1 2\n3\n"), "in.txt:2: expected 2 numbers (as on line 1), found 1");
  CHECK_THROWS_WITH(fails("1 2\n3 x\n"), "in.txt:2: 'x' is not a finite number");
  CHECK_THROWS_WITH(fails("1 nan\n"), "in.txt:1: 'nan' is not a finite number");
  CHECK_THROWS_WITH(fails(""), "in.txt: no vectors (empty input)");
  CHECK_THROWS_WITH(fails("1 2\n\n3 4\n"), "in.txt:2: empty line (expected 2 numbers)");
}
