// gemm_bf16 (chiar/linear.h): oneDNN's bf16 matmul primitives, one per
// shape, or the widening fallback.
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <mutex>
#include <tuple>

#include "chiar/linear.h"
#include "chiar_build_info.h"

#if CHIAR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace chiar {

namespace {

#if CHIAR_HAVE_ONEDNN
using Shape = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A matmul primitive for one shape: op(A) and op(B) described by strides,
// so transposed operands are read in place; alpha as an output scale, beta
// as a sum post-op.
dnnl::matmul::primitive_desc describe_matmul(const Shape& s) {
  const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta] = s;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a_md({m, k}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b_md({k, n}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c_md({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  if (beta != 0.f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
}

// The primitives made so far, by shape; a step's shapes repeat, so a run
// holds a few dozen.
dnnl::matmul& matmul_for(const Shape& s) {
  static std::mutex mutex;
  static std::map<Shape, dnnl::matmul> made;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = made.find(s);
  if (it == made.end()) {
    if (made.size() >= 512) made.clear();  // shapes that never repeat (a sweep): start over
    it = made.emplace(s, dnnl::matmul(describe_matmul(s))).first;
  }
  return it->second;
}

void onednn_gemm(const Shape& s, const c10::BFloat16* a, const c10::BFloat16* b, float* c) {
  auto& prim = matmul_for(s);
  const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta] = s;
  using dt = dnnl::memory::data_type;
  auto& engine = cpu_engine();
  const dnnl::memory a_mem({{m, k}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1}}, engine,
                           const_cast<c10::BFloat16*>(a));
  const dnnl::memory b_mem({{k, n}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1}}, engine,
                           const_cast<c10::BFloat16*>(b));
  const dnnl::memory c_mem({{m, n}, dt::f32, dnnl::memory::dims{ldc, 1}}, engine, c);
  dnnl::stream stream(engine);
  prim.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  stream.wait();
}
#endif

}  // namespace

// Both operands to fp32 (exactly), then sgemm.
void gemm_bf16_widened(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
                       int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  // The stored matrices: (m, k) or (k, m) for A, (k, n) or (n, k) for B.
  const auto wa = at::from_blob(const_cast<c10::BFloat16*>(a), {trans_a ? k : m, trans_a ? m : k}, {lda, 1}, bf16)
                      .to(at::kFloat)
                      .contiguous();
  const auto wb = at::from_blob(const_cast<c10::BFloat16*>(b), {trans_b ? n : k, trans_b ? k : n}, {ldb, 1}, bf16)
                      .to(at::kFloat)
                      .contiguous();
  sgemm(trans_a, trans_b, m, n, k, alpha, wa.data_ptr<float>(), wa.size(1), wb.data_ptr<float>(), wb.size(1), beta, c,
        ldc);
}

bool gemm_bf16_native() {
#if CHIAR_HAVE_ONEDNN
  static const bool native = [] {
    try {
      // oneDNN reports the kernel it chose; "ref" is its reference loop,
      // slower than widening to sgemm.
      const auto pd = describe_matmul(Shape{false, false, 64, 64, 64, 64, 64, 64, 1.f, 0.f});
      return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
#else
  return false;
#endif
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
               int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: C = beta C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
#if CHIAR_HAVE_ONEDNN
  if (gemm_bf16_native()) {
    onednn_gemm(Shape{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta}, a, b, c);
    return;
  }
#endif
  gemm_bf16_widened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace chiar
