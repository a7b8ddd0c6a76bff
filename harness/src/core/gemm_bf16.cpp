// gemm_bf16 (chiar/linear.h): oneDNN's bf16 matmul primitives, made for a
// shape or for any size of a layout, or the widening fallback.
#include <ATen/ATen.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chiar/gelu.h"
#include "chiar/linear.h"
#include "chiar/row_kernels.h"
#include "chiar_build_info.h"

#if CHIAR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace chiar {

namespace {

// Tile products run on oneDNN's bf16 kernels (gemm_bf16_tile_count).
std::atomic<uint64_t> g_native_tiles{0};

#if CHIAR_HAVE_ONEDNN
// What a product adds to its sums before writing them: an fp32 bias (n) to
// every row, and then the exact GELU (both in fp32, before a bf16 C's one
// rounding).
enum class Epilogue { None, Bias, BiasGelu };

// trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, then whether C is
// bf16 (else fp32) and the epilogue.
using Shape =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, bool, Epilogue>;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// The memory descriptors of a shape: op(A) and op(B) described by strides,
// so transposed operands are read in place; with any_size, m, n and k are
// left to execution (the strides stay).
struct Descs {
  dnnl::memory::desc a, b, c, bias;  // bias empty without one
};
Descs descs_of(const Shape& s, bool any_size = false) {
  auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, c_bf16, epilogue] = s;
  if (any_size) m = n = k = DNNL_RUNTIME_DIM_VAL;
  using dt = dnnl::memory::data_type;
  return {{{m, k}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1}},
          {{k, n}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1}},
          {{m, n}, c_bf16 ? dt::bf16 : dt::f32, dnnl::memory::dims{ldc, 1}},
          epilogue != Epilogue::None ? dnnl::memory::desc({1, n}, dt::f32, dnnl::memory::dims{n, 1})
                                     : dnnl::memory::desc()};
}

// A matmul primitive for one shape, or for any size of its layout: alpha as
// an output scale (which oneDNN applies to the bias too: gemm_bf16_packed_b_rounded,
// the one caller with a bias, passes no alpha), beta as a sum post-op, the
// GELU as an eltwise post-op after the bias; the scratchpad oneDNN's own, or
// the caller's (user_scratchpad). With packed_b, B in the layout oneDNN
// picks for its kernels (a packed weight's) instead of s's strides.
dnnl::matmul::primitive_desc describe_matmul(const Shape& s, bool user_scratchpad = false, bool any_size = false,
                                             bool packed_b = false) {
  const auto alpha = std::get<8>(s), beta = std::get<9>(s);
  Descs d = descs_of(s, any_size);
  if (packed_b) d.b = {{std::get<4>(s), std::get<3>(s)}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::any};
  dnnl::primitive_attr attr;
  if (user_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  dnnl::post_ops ops;
  if (beta != 0.f) ops.append_sum(beta);
  if (std::get<11>(s) == Epilogue::BiasGelu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f);
  if (ops.len() > 0) attr.set_post_ops(ops);
  const auto desc =
      std::get<11>(s) != Epilogue::None ? dnnl::matmul::desc(d.a, d.b, d.bias, d.c) : dnnl::matmul::desc(d.a, d.b, d.c);
  return dnnl::matmul::primitive_desc(desc, attr, cpu_engine());
}

// Whether oneDNN runs a bf16 product, made for a shape or for any size, on
// a kernel of its own: "ref" is its reference loop, slower than widening to
// sgemm. Probed once per kind by the callers.
bool has_kernel(bool any_size) {
  try {
    const Shape probe{false, false, 64, 64, 64, 64, 64, 64, 1.f, 0.f, false, Epilogue::None};
    return std::string(describe_matmul(probe, false, any_size).impl_info_str()).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

std::atomic<uint64_t> g_made_for_shape{0}, g_made_for_any_size{0};
std::atomic<uint64_t> g_packed_b_reads{0};  // products that read a packed B

struct MadeMatmul {
  dnnl::matmul primitive;
  size_t scratch_bytes;       // what it needs of a user scratchpad
  dnnl::memory::desc b;       // the layout it reads B in
  bool reads_packed = false;  // made for a packed B, and b is gemm_bf16_pack_b's layout
  bool any_size = false;      // made for any size of a layout: its operands' sizes vary
  // A tile primitive made for one shape: its arguments, made at its first
  // product and pointed at each product's data since (gemm_bf16_tile, on
  // the thread whose cache holds it; the process's cache, shared under a
  // lock, never uses them). Made anew, they took about 1 us of a 6-15 us
  // tile product.
  mutable std::unordered_map<int, dnnl::memory> args;
};

bool aligned(const Shape& s) {
  return std::get<2>(s) % 32 == 0 && std::get<3>(s) % 32 == 0 && std::get<4>(s) % 32 == 0;
}

// The layout oneDNN's kernels read a bf16 op(B) (k, n) in: it depends on
// k, n and the CPU, not on the rows (a probe of 32 to 4096 rows at the
// anchor's widths found one layout for all). Kept per (k, n): describing a
// primitive costs 0.3-5 ms.
dnnl::memory::desc packed_b_desc(int64_t n, int64_t k) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, int64_t>, dnnl::memory::desc> made;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = made.find({n, k});
  if (it == made.end()) {
    const Shape probe{false, false, 64, n, k, k, n, n, 1.f, 0.f, false, Epilogue::None};
    it = made.emplace(std::make_pair(n, k), describe_matmul(probe, false, false, /*packed_b=*/true).weights_desc())
             .first;
  }
  return it->second;
}

// The primitives one scope keeps: the process's for gemm_bf16, a thread's
// for gemm_bf16_tile. A primitive made for one shape (oneDNN's brgemm
// kernels, specialised to its sizes) costs 0.3-5 ms to make; one made for
// any size of a layout (transposes, leading dimensions, alpha, beta; oneDNN's
// jit gemm) serves every shape of that layout at about the same rate
// (chiar_bench: product_bf16/any_size/* against product_bf16/gemm_bf16/*;
// in a whole step neither is faster than the machine's noise: bench-train
// --precision bf16 with every product on it, docs/performance.md).
// A model's own shapes repeat every step, but a routed layer's row counts
// and the tiles at its segments' ends change every step, and made a new
// primitive each: 12-14 a step for DCT+Attn at d 128 (DNNL_VERBOSE=2, steps
// 20-60 of configs/bf16_quality.toml's bf16 run: 541 made in 0.54 s). So a shape
// whose sizes are all multiples of 32 (a model's widths, its batch's rows,
// whole tiles) gets a primitive of its own, and any other runs on its
// layout's; such a shape reads a weight packed once (gemm_bf16_packed_b)
// where its caller passes one, which linear() and the LM head always do for
// a weight of multiples of 32. The choice depends on the shape and the
// caller, never on what ran before in the process: a resumed run, or a shard run again on the same CPU with
// the same threads, sums in the same order as one that ran through (their
// metrics are compared bit for bit). Where oneDNN would run a shape of any
// size on its reference loop, every shape gets its own primitive.
class MatmulCache {
 public:
  explicit MatmulCache(bool user_scratchpad) : user_scratchpad_(user_scratchpad) {}

  // packed_b: s's primitive reading B packed (gemm_bf16_pack_b), for a
  // shape of multiples of 32 (onednn_gemm passes no other). It reads B
  // whatever B's stored layout was, so those are not part of its key.
  const MadeMatmul& get(const Shape& s, bool packed_b = false) {
    static const bool any_size_native = has_kernel(/*any_size=*/true);
    if (!aligned(s) && any_size_native) return for_any_size(s);
    auto& made = packed_b ? for_packed_b_ : for_shape_;
    Shape key = s;
    if (packed_b) std::get<1>(key) = false, std::get<6>(key) = 0;  // trans_b, ldb
    auto it = made.find(key);
    if (it == made.end()) {
      if (made.size() >= 4096) made.clear();  // shapes that never repeat (a sweep): start over
      g_made_for_shape.fetch_add(1, std::memory_order_relaxed);
      it = made.emplace(key, make(s, /*any_size=*/false, packed_b)).first;
    }
    return it->second;
  }

  // The primitive for any size of s's layout.
  const MadeMatmul& for_any_size(const Shape& s) {
    Shape layout = s;
    std::get<2>(layout) = std::get<3>(layout) = std::get<4>(layout) = 0;
    auto it = for_any_size_.find(layout);
    if (it == for_any_size_.end()) {
      // Leading dimensions are part of a layout, and a tile's are its key count.
      if (for_any_size_.size() >= 4096) for_any_size_.clear();
      g_made_for_any_size.fetch_add(1, std::memory_order_relaxed);
      it = for_any_size_.emplace(layout, make(s, /*any_size=*/true)).first;
    }
    return it->second;
  }

 private:
  MadeMatmul make(const Shape& s, bool any_size, bool packed_b = false) const {
    const auto pd = describe_matmul(s, user_scratchpad_, any_size, packed_b);
    // Compared once here, not per product: packed_b_desc takes a lock.
    const bool reads_packed = packed_b && pd.weights_desc() == packed_b_desc(std::get<3>(s), std::get<4>(s));
    return {dnnl::matmul(pd), pd.scratchpad_desc().get_size(), pd.weights_desc(), reads_packed, any_size, {}};
  }

  bool user_scratchpad_;
  std::map<Shape, MadeMatmul> for_shape_;
  std::map<Shape, MadeMatmul> for_packed_b_;
  std::map<Shape, MadeMatmul> for_any_size_;
};

// Where a product writes: C, fp32 or bf16 as its Shape says, and the bias
// (n) fp32 the Shape adds, or null.
struct Output {
  void* c;
  const float* bias = nullptr;
};

// b_desc: B's layout where it is not s's strides (a packed B).
// A product's arguments (null pointers: memory without data yet, pointed
// at it later with set_data_handle).
std::unordered_map<int, dnnl::memory> arguments(const Shape& s, const c10::BFloat16* a, const void* b,
                                                const Output& out, const dnnl::memory* scratch = nullptr,
                                                const dnnl::memory::desc* b_desc = nullptr) {
  auto& engine = cpu_engine();
  const Descs d = descs_of(s);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, {d.a, engine, const_cast<c10::BFloat16*>(a)}},
                                             {DNNL_ARG_WEIGHTS, {b_desc ? *b_desc : d.b, engine, const_cast<void*>(b)}},
                                             {DNNL_ARG_DST, {d.c, engine, out.c}}};
  if (std::get<11>(s) != Epilogue::None)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(d.bias, engine, const_cast<float*>(out.bias)));
  if (scratch) args.emplace(DNNL_ARG_SCRATCHPAD, *scratch);
  return args;
}

void execute(const dnnl::matmul& prim, dnnl::stream& stream, const Shape& s, const c10::BFloat16* a, const void* b,
             const Output& out, const dnnl::memory* scratch = nullptr, const dnnl::memory::desc* b_desc = nullptr) {
  prim.execute(stream, arguments(s, a, b, out, scratch, b_desc));
  stream.wait();
}

// any_size: always the layout's primitive for any size (gemm_bf16_any_size).
// packed_b: B packed as well (gemm_bf16_pack_b), read where s's primitive
// reads that layout.
void onednn_gemm(const Shape& s, const c10::BFloat16* a, const c10::BFloat16* b, const Output& c, bool any_size = false,
                 const at::Tensor* packed_b = nullptr) {
  static std::mutex mutex;
  static MatmulCache made(/*user_scratchpad=*/false);
  dnnl::matmul primitive;  // a handle: held here, it outlives the cache's clearing
  const bool packed = packed_b && packed_b->defined() && !any_size && aligned(s);
  dnnl::memory::desc b_desc;
  bool reads_packed = false;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const MadeMatmul& m = any_size ? made.for_any_size(s) : made.get(s, packed);
    primitive = m.primitive;
    b_desc = m.b;
    reads_packed = m.reads_packed;
  }
  dnnl::stream stream(cpu_engine());
  const int64_t n = std::get<3>(s), k = std::get<4>(s);
  if (packed && reads_packed && packed_b->sizes() == at::IntArrayRef{k, n} && packed_b->storage_offset() == 0 &&
      packed_b->storage().nbytes() >= b_desc.get_size()) {
    execute(primitive, stream, s, a, packed_b->data_ptr(), c, nullptr, &b_desc);
    g_packed_b_reads.fetch_add(1, std::memory_order_relaxed);
  } else if (packed)  // a primitive that wants another layout: B as it is stored
    onednn_gemm(s, a, b, c);
  else
    execute(primitive, stream, s, a, b, c);
}

// The (rows, cols) matrix at p with leading dimension ld (updated), itself
// where its rows are dense, else copied into buffer.
const c10::BFloat16* dense_rows(const c10::BFloat16* p, int64_t rows, int64_t cols, int64_t& ld,
                                std::vector<c10::BFloat16>& buffer) {
  if (ld == cols) return p;
  const auto n = static_cast<size_t>(rows * cols);
  if (buffer.size() < n) buffer.resize(n);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(buffer.data() + r * cols, p + r * ld, sizeof(c10::BFloat16) * cols);
  ld = cols;
  return buffer.data();
}

// A tile's product on the calling thread (gemm_bf16_tile): primitives made
// on this thread and kept in its own cache, each run with this thread's
// scratch. The user scratchpad is what lets tiles run side by side: oneDNN's
// own (library mode) may not serve one primitive on two threads at once, nor
// one made on another thread, and its primitive cache hands threads the same
// kernels anyway. A primitive made for one shape keeps its arguments
// (MadeMatmul::args) and points them at each product's data.
//
// oneDNN 2.6 takes its brgemm kernels for a bf16 product only where each
// operand's rows are dense (leading dimension = row length); a tile of a
// wider matrix (a head's values within the kv projection's rows, the first
// keys of a head's kt, a head's rows of the output's gradient) went to its
// jit gemm, which packs both operands on every call and took up to 1.6x
// the brgemm kernels' time for the core's tile shapes (DNNL_VERBOSE=1 exec
// times of a bench-train --precision bf16 run). Such an operand of an
// aligned shape is copied to a dense buffer of this thread's first, per
// tile: keys x dh values, 8-32 KiB at the anchor (docs/performance.md, 'The
// fused attention core', has the A/B from T 256 to 2048).
void onednn_gemm_tile(Shape s, const c10::BFloat16* a, const c10::BFloat16* b, float* c) {
  if (aligned(s)) {
    const bool ta = std::get<0>(s), tb = std::get<1>(s);
    const int64_t rows = std::get<2>(s), cols = std::get<3>(s), depth = std::get<4>(s);  // m, n, k
    thread_local std::vector<c10::BFloat16> dense_a, dense_b;
    a = dense_rows(a, ta ? depth : rows, ta ? rows : depth, std::get<5>(s), dense_a);  // lda updated
    b = dense_rows(b, tb ? cols : depth, tb ? depth : cols, std::get<6>(s), dense_b);  // ldb updated
  }
  thread_local MatmulCache made(/*user_scratchpad=*/true);
  const MadeMatmul& m = made.get(s);
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < std::max<size_t>(1, m.scratch_bytes)) scratch.resize(std::max<size_t>(1, m.scratch_bytes));
  const auto scratch_memory = [] {
    return dnnl::memory({{static_cast<int64_t>(scratch.size())}, dnnl::memory::data_type::u8, {1}}, cpu_engine(),
                        scratch.data());
  };
  thread_local dnnl::stream stream(cpu_engine());
  if (m.any_size) {
    const auto scratch_mem = scratch_memory();
    execute(m.primitive, stream, s, a, b, Output{c}, &scratch_mem);
  } else {
    if (m.args.empty()) {
      const auto scratch_mem = scratch_memory();
      m.args = arguments(s, nullptr, nullptr, Output{nullptr}, &scratch_mem);
    }
    m.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<c10::BFloat16*>(a), stream);
    m.args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<c10::BFloat16*>(b), stream);
    m.args.at(DNNL_ARG_DST).set_data_handle(c, stream);
    m.args.at(DNNL_ARG_SCRATCHPAD).set_data_handle(scratch.data(), stream);
    m.primitive.execute(stream, m.args);
    stream.wait();
  }
  g_native_tiles.fetch_add(1, std::memory_order_relaxed);
}
#endif

}  // namespace

// Both operands to fp32 (exactly), then sgemm. Plain buffers, not tensors,
// so that a tile inside at::parallel_for may take it too (the conversion's
// parallel_for then runs on the calling thread alone); freed on return,
// since the fused head's operands run to hundreds of MiB.
void gemm_bf16_widened(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
                       int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // The stored matrices: (m, k) or (k, m) for A, (k, n) or (n, k) for B.
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const auto widen = [](const c10::BFloat16* from, int64_t rows, int64_t cols, int64_t ld) {
    std::vector<float> to(static_cast<size_t>(std::max<int64_t>(1, rows * cols)));
    at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cols)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t i = begin; i < end; ++i)
                         for (int64_t j = 0; j < cols; ++j)
                           to[static_cast<size_t>(i * cols + j)] = static_cast<float>(from[i * ld + j]);
                     });
    return to;
  };
  const auto wa = widen(a, a_rows, a_cols, lda), wb = widen(b, b_rows, b_cols, ldb);
  sgemm(trans_a, trans_b, m, n, k, alpha, wa.data(), std::max<int64_t>(1, a_cols), wb.data(),
        std::max<int64_t>(1, b_cols), beta, c, ldc);
}

uint64_t gemm_bf16_tile_count() { return g_native_tiles.load(std::memory_order_relaxed); }

uint64_t gemm_bf16_packed_b_reads() {
#if CHIAR_HAVE_ONEDNN
  return g_packed_b_reads.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

GemmBf16Primitives gemm_bf16_primitives_made() {
#if CHIAR_HAVE_ONEDNN
  return {g_made_for_shape.load(std::memory_order_relaxed), g_made_for_any_size.load(std::memory_order_relaxed)};
#else
  return {};
#endif
}

bool gemm_bf16_native() {
#if CHIAR_HAVE_ONEDNN
  static const bool native = has_kernel(/*any_size=*/false);
  return native;
#else
  return false;
#endif
}

void gemm_bf16_tile(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
                    int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
#if CHIAR_HAVE_ONEDNN
  if (k > 0 && gemm_bf16_native()) {
    onednn_gemm_tile(Shape{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, false, Epilogue::None}, a, b, c);
    return;
  }
#endif
  gemm_bf16_widened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

void gemm_bf16_on(bool any_size, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c,
                  int64_t ldc, const at::Tensor* packed_b = nullptr) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: C = beta C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
#if CHIAR_HAVE_ONEDNN
  if (gemm_bf16_native()) {
    onednn_gemm(Shape{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, false, Epilogue::None}, a, b, Output{c},
                any_size, packed_b);
    return;
  }
#else
  (void)any_size;
  (void)packed_b;
#endif
  gemm_bf16_widened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
               int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_bf16_on(false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

at::Tensor gemm_bf16_pack_b(bool trans_b, int64_t n, int64_t k, const c10::BFloat16* b, int64_t ldb) {
#if CHIAR_HAVE_ONEDNN
  if (!gemm_bf16_native() || n <= 0 || k <= 0 || n % 32 != 0 || k % 32 != 0) return {};
  const Shape layout{false, trans_b, 32, n, k, k, ldb, n, 1.f, 0.f, false, Epilogue::None};
  const dnnl::memory::desc to = packed_b_desc(n, k);
  // Its sizes say which op(B) it holds; its storage, the packed layout
  // (padded, so larger than k n values).
  const auto packed =
      at::empty({static_cast<int64_t>(to.get_size() + 1) / 2}, at::kBFloat16).as_strided({k, n}, {n, 1});
  auto& engine = cpu_engine();
  dnnl::memory from_mem(descs_of(layout).b, engine, const_cast<c10::BFloat16*>(b)),
      to_mem(to, engine, packed.data_ptr());
  dnnl::stream stream(engine);
  dnnl::reorder(from_mem, to_mem).execute(stream, from_mem, to_mem);
  stream.wait();
  return packed;
#else
  (void)trans_b, (void)n, (void)k, (void)b, (void)ldb;
  return {};
#endif
}

void gemm_bf16_packed_b(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb,
                        const at::Tensor& packed_b, float beta, float* c, int64_t ldc) {
  gemm_bf16_on(false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, &packed_b);
}

void gemm_bf16_packed_b_rounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const c10::BFloat16* a,
                                int64_t lda, const c10::BFloat16* b, int64_t ldb, const at::Tensor& packed_b,
                                const float* bias, bool gelu, c10::BFloat16* c, int64_t ldc) {
  TORCH_CHECK(!gelu || bias, "gemm_bf16_packed_b_rounded: the GELU comes after a bias");
  if (m <= 0 || n <= 0) return;
#if CHIAR_HAVE_ONEDNN
  if (k > 0 && gemm_bf16_native()) {
    const Epilogue epilogue = gelu ? Epilogue::BiasGelu : bias ? Epilogue::Bias : Epilogue::None;
    onednn_gemm(Shape{trans_a, trans_b, m, n, k, lda, ldb, ldc, 1.f, 0.f, true, epilogue}, a, b, Output{c, bias},
                /*any_size=*/false, &packed_b);
    return;
  }
#else
  (void)packed_b;
#endif
  // The same sums in an fp32 buffer, the bias added and the GELU taken
  // there, rounded once.
  std::vector<float> sums(static_cast<size_t>(m * n), 0.f);  // (m, n)
  if (k > 0) gemm_bf16_widened(trans_a, trans_b, m, n, k, 1.f, a, lda, b, ldb, 0.f, sums.data(), n);
  if (bias) {
    auto wrapped = at::from_blob(sums.data(), {m, n});                        // (m, n) over sums
    const auto b = at::from_blob(const_cast<float*>(bias), {n}, at::kFloat);  // (n)
    if (gelu)
      bias_gelu_(wrapped, b);  // the harness's own, as training's path applies it
    else
      wrapped.add_(b);
  }
  for (int64_t i = 0; i < m; ++i) round_to_bf16(sums.data() + i * n, reinterpret_cast<uint16_t*>(c + i * ldc), n);
}

void gemm_bf16_packed_b_rounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const c10::BFloat16* a,
                                int64_t lda, const c10::BFloat16* b, int64_t ldb, const at::Tensor& packed_b,
                                const float* bias, c10::BFloat16* c, int64_t ldc) {
  gemm_bf16_packed_b_rounded(trans_a, trans_b, m, n, k, a, lda, b, ldb, packed_b, bias, /*gelu=*/false, c, ldc);
}

void gemm_bf16_any_size(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c,
                        int64_t ldc) {
  gemm_bf16_on(true, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace chiar
