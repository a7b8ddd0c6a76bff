// The routed layer's CUDA kernels (harness/cuda) against the host kernels of
// the same contract and the float64 definition. The [cuda] cases are hidden:
// chiar_tests "[cuda]" runs them on a machine with a GPU (tools/gpu-check.sh).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"
#include "support/reference.h"

using namespace chiar;

namespace {

// Choices in -1..K: out-of-range values included, which land in no list.
at::Tensor random_choices(int64_t n, int64_t K, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(-1, K + 1, {n}, gen, at::TensorOptions().dtype(at::kLong));  // (n,)
}

// Rows of every kind the entropy meets: random, zero (H = 0), one
// coefficient (H = 0), flat (H = 1).
at::Tensor coefficient_rows(int64_t rows, int64_t d, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto c = at::randn({rows, d}, gen, at::TensorOptions().dtype(at::kDouble));  // (rows, d)
  c[0].zero_();
  c[1].zero_();
  c[1][d / 2] = 3.0;
  c[2].fill_(0.5);
  return c;
}

void require_cuda_kernels() {
  REQUIRE(torch::cuda::is_available());
  {
    INFO("this build has no CUDA kernels: configure found no CUDA libtorch or no nvcc (see its 'CUDA kernels:' line)");
    REQUIRE(cuda_kernels_enabled());
  }
  INFO("the CUDA kernels cannot run here: stderr says why (the driver's major version, or no image for this device)");
  REQUIRE(cuda_kernels_usable());
}

}  // namespace

TEST_CASE("rows_by_choice: the host pass lists the same rows as the composition", "[routing][rows]") {
  for (const int64_t n : {0, 1, 255, 257, 4099})
    for (const int64_t K : {1, 2, 3, 5}) {
      const auto choice = random_choices(n, K, static_cast<uint64_t>(n * 10 + K));
      std::vector<at::Tensor> composed;
      {
        ScopedKernelPolicy aten(KernelPolicy::Compositions);
        composed = rows_by_choice(choice, K);
      }
      const uint64_t before = host_kernel_count();
      const auto host = rows_by_choice(choice, K);
      CHECK(host_kernel_count() == before + 1);
      REQUIRE(host.size() == static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) {
        INFO("n " << n << ", K " << K << ", operator " << k);
        CHECK(at::equal(host[static_cast<size_t>(k)], composed[static_cast<size_t>(k)]));
      }
    }
}

TEST_CASE("rows_by_choice_and_host: on the CPU the host lists are the lists", "[routing][rows]") {
  for (const int64_t n : {0, 257})
    for (const int64_t K : {1, 3}) {
      INFO("n " << n << ", K " << K);
      const auto choice = random_choices(n, K, static_cast<uint64_t>(n * 10 + K));
      const auto expected = rows_by_choice(choice, K);
      const RowLists lists = rows_by_choice_and_host(choice, K);
      REQUIRE(lists.rows.size() == static_cast<size_t>(K));
      REQUIRE(lists.host_rows.size() == static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) {
        CHECK(at::equal(lists.rows[static_cast<size_t>(k)], expected[static_cast<size_t>(k)]));
        CHECK(lists.host_rows[static_cast<size_t>(k)].is_same(lists.rows[static_cast<size_t>(k)]));
      }
    }
}

TEST_CASE("rows_in_host_memory: supplied host rows are checked and used, else the rows are copied", "[routing][rows]") {
  const auto rows = at::tensor(std::vector<int64_t>{0, 3, 4, 10, 17}, at::TensorOptions().dtype(at::kLong));  // (5,)
  CHECK(at::equal(rows_in_host_memory(rows, at::Tensor()), rows));
  const auto host = rows.clone();
  CHECK(rows_in_host_memory(rows, host).is_same(host));
  const auto refused = [&](const at::Tensor& supplied) {
    try {
      rows_in_host_memory(rows, supplied);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK(refused(rows.narrow(0, 0, 3)) ==
        "OpContext::host_rows: 3 rows in host memory for 5 rows (a caller that passes its context on to forward_rows "
        "with other rows must reset host_rows)");
  CHECK(refused(rows.to(at::kInt)) ==
        "OpContext::host_rows: expected (N,) int64 rows in host memory, found Int [5] on cpu");
}

// Hidden (as below). The lists a routed layer hands its operators on a GPU,
// and their host copies: the kernel's (one copy brings both) and the
// composition's (a copy after nonzero's). The choices include values
// outside 0..K-1, which land in no list.
TEST_CASE("cuda kernels: the row lists' host copies equal the lists, from the kernel and the composition", "[.cuda]") {
  require_cuda_kernels();
  for (const KernelPolicy policy : {KernelPolicy::Auto, KernelPolicy::Compositions}) {
    ScopedKernelPolicy scoped(policy);
    for (const int64_t n : {0, 1, 257, 4099})
      for (const int64_t K : {1, 2, 3, 5}) {
        INFO(to_string(policy) << ", n " << n << ", K " << K);
        const auto choice = random_choices(n, K, static_cast<uint64_t>(n * 10 + K));
        const auto expected = rows_by_choice(choice, K);
        const uint64_t launched = cuda_kernel_count();
        const RowLists lists = rows_by_choice_and_host(choice.to(at::kCUDA), K);
        CHECK(cuda_kernel_count() == launched + (policy == KernelPolicy::Auto ? 1 : 0));
        REQUIRE(lists.rows.size() == static_cast<size_t>(K));
        REQUIRE(lists.host_rows.size() == static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k) {
          const auto i = static_cast<size_t>(k);
          CHECK(lists.rows[i].is_cuda());
          CHECK(lists.host_rows[i].is_cpu());
          CHECK(at::equal(lists.rows[i].to(at::kCPU), expected[i]));
          CHECK(at::equal(lists.host_rows[i], expected[i]));
        }
      }
  }
}

TEST_CASE("cuda kernels: the row lists on the GPU equal the host pass's", "[.cuda]") {
  require_cuda_kernels();
  // Sizes around the kernel's tile of 256 choices, and many tiles.
  for (const int64_t n : {0, 1, 255, 256, 257, 4099, 70000})
    for (const int64_t K : {1, 2, 3, 5}) {
      const auto choice = random_choices(n, K, static_cast<uint64_t>(n * 10 + K));
      const auto host = rows_by_choice(choice, K);
      const uint64_t before = cuda_kernel_count();
      const auto gpu = rows_by_choice(choice.to(at::kCUDA), K);
      CHECK(cuda_kernel_count() == before + 1);
      REQUIRE(gpu.size() == static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) {
        INFO("n " << n << ", K " << K << ", operator " << k);
        CHECK(gpu[static_cast<size_t>(k)].is_cuda());
        CHECK(at::equal(gpu[static_cast<size_t>(k)].to(at::kCPU), host[static_cast<size_t>(k)]));
      }
    }
  // More operators than a block has threads (the counters' strided loops),
  // the most the kernel takes, and one more, which the composition serves.
  for (const int64_t K : {257, 4096, 4097}) {
    const auto choice = random_choices(70000, K, static_cast<uint64_t>(K));
    const auto host = rows_by_choice(choice, K);
    const uint64_t before = cuda_kernel_count();
    const auto gpu = rows_by_choice(choice.to(at::kCUDA), K);
    CHECK(cuda_kernel_count() == before + (K <= 4096 ? 1 : 0));
    REQUIRE(gpu.size() == static_cast<size_t>(K));
    int64_t differing = 0;
    for (int64_t k = 0; k < K; ++k)
      differing += at::equal(gpu[static_cast<size_t>(k)].to(at::kCPU), host[static_cast<size_t>(k)]) ? 0 : 1;
    INFO("K " << K);
    CHECK(differing == 0);
  }
}

TEST_CASE("cuda kernels: spectral entropy on the GPU equals the float64 definition and the host kernel", "[.cuda]") {
  require_cuda_kernels();
  at::NoGradGuard no_grad;
  for (const int64_t d : {2, 31, 64, 256, 1000}) {
    INFO("d " << d);
    const auto c = coefficient_rows(2053, d, static_cast<uint64_t>(d));  // (2053, d) float64
    const auto c32 = c.to(at::kFloat);
    const auto expected = test::ref::entropy_from_coeffs(c32.to(at::kDouble));  // (2053,)
    const auto host = spectral_entropy_from_coeffs(c32);
    const uint64_t before = cuda_kernel_count();
    const auto gpu = spectral_entropy_from_coeffs(c32.to(at::kCUDA)).to(at::kCPU);
    CHECK(cuda_kernel_count() == before + 1);
    CHECK(gpu.scalar_type() == at::kFloat);
    // fp32 sums of d terms in another order than the host kernel's, and
    // logf for its polynomial: within 1e-5 of H <= 1 (the host kernel's
    // bound against the definition, test_spectral.cpp).
    CHECK((gpu.to(at::kDouble) - expected).abs().max().item<double>() < 1e-5);
    CHECK((gpu - host).abs().max().item<double>() < 1e-5);
    // Decisions at thresholds: equal wherever H is not within that error of tau.
    for (const double tau : {0.3, 0.7, 0.9}) {
      const auto clear = (expected - tau).abs() > 2e-5;
      CHECK(at::equal((gpu.to(at::kDouble) > tau).masked_select(clear), (expected > tau).masked_select(clear)));
    }
    // bf16 and fp16 coefficients: read as they are, sums and H in fp32, as
    // the composition computes them after widening.
    for (const auto type : {at::kBFloat16, at::kHalf}) {
      const auto rounded = c32.to(type);
      const auto reference = test::ref::entropy_from_coeffs(rounded.to(at::kDouble));
      const uint64_t kernels = cuda_kernel_count();
      const auto low = spectral_entropy_from_coeffs(rounded.to(at::kCUDA));
      CHECK(cuda_kernel_count() == kernels + 1);
      CHECK(low.scalar_type() == at::kFloat);
      CHECK((low.to(at::kCPU, at::kDouble) - reference).abs().max().item<double>() < 1e-5);
      CHECK((low.to(at::kCPU) - spectral_entropy_from_coeffs(rounded)).abs().max().item<double>() < 1e-5);
    }
  }
  // A row with a NaN, an infinity, or a square that overflows fp32 gives NaN,
  // as on the host (test_spectral.cpp), not a clamped 0.
  auto bad = at::randn({3, 16});  // (3, 16)
  bad[0][3] = std::numeric_limits<float>::quiet_NaN();
  bad[1][5] = std::numeric_limits<float>::infinity();
  bad[2][0] = 1e30f;
  const uint64_t before = cuda_kernel_count();
  const auto h = spectral_entropy_from_coeffs(bad.to(at::kCUDA)).to(at::kCPU);  // (3,)
  CHECK(cuda_kernel_count() == before + 1);
  CHECK(h.isnan().all().item<bool>());
}

// Hidden (as above). In training the kernel computes H forward and the
// closed form its gradient; both equal the host's (test_spectral.cpp checks
// the host's against float64 autograd).
TEST_CASE("cuda kernels: spectral entropy in training takes the kernel forward; its gradient equals the host's",
          "[.cuda]") {
  require_cuda_kernels();
  at::manual_seed(43);
  for (const int64_t d : {2, 64, 256}) {
    INFO("d " << d);
    const auto c32 = coefficient_rows(515, d, static_cast<uint64_t>(d + 7)).to(at::kFloat);  // (515, d)
    const auto upstream = at::randn({515});                                                  // (515,) dL/dH
    auto host_leaf = c32.clone().requires_grad_(true);
    const auto host = spectral_entropy_from_coeffs(host_leaf);  // (515,)
    (host * upstream).sum().backward();
    auto gpu_leaf = c32.to(at::kCUDA).requires_grad_(true);
    const uint64_t before = cuda_kernel_count();
    const auto gpu = spectral_entropy_from_coeffs(gpu_leaf);  // (515,)
    CHECK(cuda_kernel_count() == before + 1);
    REQUIRE(gpu.requires_grad());
    (gpu * upstream.to(at::kCUDA)).sum().backward();
    CHECK((gpu.detach().to(at::kCPU) - host.detach()).abs().max().item<double>() < 1e-5);
    REQUIRE(gpu_leaf.grad().defined());
    const auto gpu_grad = gpu_leaf.grad().to(at::kCPU, at::kDouble), host_grad = host_leaf.grad().to(at::kDouble);
    CHECK((gpu_grad - host_grad).norm().item<double>() <= 1e-5 * std::max(host_grad.norm().item<double>(), 1e-30));
  }
}
