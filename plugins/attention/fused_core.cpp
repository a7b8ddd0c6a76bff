#include "fused_core.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "chiar/linear.h"
#include "chiar/row_kernels.h"

namespace chiar_attention {

namespace {

constexpr float kMasked = std::numeric_limits<float>::lowest();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A (G, h, rows, cols) operand read (or written) as one row-major matrix per
// (g, head), of fp32 or of bf16 (T: float or c10::BFloat16).
template <class T>
struct Matrices {
  T* data;
  int64_t s0, s1, ld;  // strides of g, head and a row, in elements
  T* at(int64_t g, int64_t head) const { return data + g * s0 + head * s1; }
  T* row(int64_t g, int64_t head, int64_t r) const { return at(g, head) + r * ld; }
};

// Unit last stride and rows that do not overlap, or a contiguous copy.
at::Tensor readable(const at::Tensor& t) { return t.stride(3) == 1 && t.stride(2) >= t.size(3) ? t : t.contiguous(); }

template <class T>
Matrices<T> matrices(const at::Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

// C = op(A) op(B) + beta C, C fp32, for one tile on the calling thread: fp32
// operands on the process's GEMM library, or bf16 operands summed in fp32.
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  chiar::sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
}
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const c10::BFloat16* a, int64_t lda,
             const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  chiar::gemm_bf16_tile(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
}

// A tile's fp32 weights or scores' gradient (rows x keys) as the next
// product's operand, each row's keys past ends[i] read as 0: itself in fp32,
// where the caller zeroed them; in bf16, the rows' first ends[i] keys
// rounded into this thread's buffer and the rest zeroed there (the fp32
// tails are then never written).
const float* as_operand(const float* tile, int64_t, int64_t, const int64_t*, const float*) { return tile; }
const c10::BFloat16* as_operand(const float* tile, int64_t rows, int64_t keys, const int64_t* ends,
                                const c10::BFloat16*) {
  thread_local std::vector<c10::BFloat16> rounded;
  const auto n = static_cast<size_t>(rows * keys);
  if (rounded.size() < n) rounded.resize(n);
  auto* out = reinterpret_cast<uint16_t*>(rounded.data());
  for (int64_t i = 0; i < rows; ++i) {
    chiar::round_to_bf16(tile + i * keys, out + i * keys, ends[i]);
    std::fill(out + i * keys + ends[i], out + (i + 1) * keys, uint16_t{0});
  }
  return rounded.data();
}

// The keys of a row past `end` as 0 in fp32 operands (bf16 ones are zeroed
// as they are rounded, as_operand).
template <class T>
void zero_tail(float* row, int64_t end, int64_t keys) {
  if constexpr (std::is_same_v<T, float>) std::fill(row + end, row + keys, 0.f);
}

// What every tile needs to know, shared by forward and backward. T is the
// products' operand type: q, kt and v are T, scores and their softmax fp32.
template <class T>
struct Problem {
  int64_t G, GK, heads, m, dh, L, block;  // G query batches, GK key batches (equal unless segmented)
  Matrices<T> q, kt, v;
  const int64_t* qpos = nullptr;  // (G or 1, m), or none
  int64_t qpos_stride = 0;        // m when positions differ per sequence, else 0
  const bool* valid = nullptr;    // (GK, L), or none

  // Query rows [r0, r0 + rows) of query batch qg that read keys [0, keys)
  // of key batch kg: a causal block or a segment, or a part of one.
  struct Tile {
    int64_t r0, rows, keys, qg, kg;
  };
  std::vector<Tile> tiles;
  std::vector<std::vector<size_t>> tiles_of;  // per key batch, its tiles in order

  // qpos_, valid_, segments_: empty for none; segments_ (S, 4) int64 rows
  // (start, count, key batch, keys) of a single query batch; arrays:
  // score-sized scratch arrays per tile (forward 1, backward 2), which sets
  // the rows per tile.
  Problem(const at::Tensor& q_, const at::Tensor& kt_, const at::Tensor& v_, const at::Tensor& qpos_,
          const at::Tensor& valid_, const at::Tensor& segments_, int64_t block_, int64_t arrays)
      : G(q_.size(0)),
        GK(kt_.size(0)),
        heads(q_.size(1)),
        m(q_.size(2)),
        dh(q_.size(3)),
        L(kt_.size(3)),
        block(block_),
        q(matrices<T>(q_)),
        kt(matrices<T>(kt_)),
        v(matrices<T>(v_)) {
    if (qpos_.numel() > 0) {
      qpos = qpos_.data_ptr<int64_t>();
      qpos_stride = qpos_.size(0) == G && G > 1 ? m : 0;
    }
    if (valid_.numel() > 0) valid = valid_.data_ptr<bool>();
    if (segments_.numel() > 0)
      cut_segments(segments_, arrays);
    else
      cut_tiles(arrays);
    tiles_of.resize(static_cast<size_t>(GK));
    for (size_t i = 0; i < tiles.size(); ++i) tiles_of[static_cast<size_t>(tiles[i].kg)].push_back(i);
  }

  // Rows per tile for `keys` keys: the most (a power of two, 16 to 128)
  // whose `arrays` score arrays fit kTileBytes.
  static int64_t rows_for(int64_t keys, int64_t arrays) {
    const int64_t fit = kTileBytes / (static_cast<int64_t>(sizeof(float)) * arrays * std::max<int64_t>(keys, 1));
    int64_t rows = kMaxTileRows;
    while (rows > kMinTileRows && rows > fit) rows /= 2;
    return rows;
  }

  void cut_tiles(int64_t arrays) {
    const int64_t span = block > 0 ? block : std::max<int64_t>(m, 1);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t s = 0; s < m; s += span) {
        const int64_t end = std::min(m, s + span), keys = block > 0 ? std::min(L, end) : L;
        const int64_t rows = rows_for(keys, arrays);
        for (int64_t r0 = s; r0 < end; r0 += rows) tiles.push_back({r0, std::min(rows, end - r0), keys, g, g});
      }
  }

  void cut_segments(const at::Tensor& segments, int64_t arrays) {
    const auto* seg = segments.data_ptr<int64_t>();
    for (int64_t i = 0; i < segments.size(0); ++i) {
      const int64_t start = seg[4 * i], count = seg[4 * i + 1], kg = seg[4 * i + 2], keys = seg[4 * i + 3];
      const int64_t rows = rows_for(keys, arrays);
      for (int64_t r0 = start; r0 < start + count; r0 += rows)
        tiles.push_back({r0, std::min(rows, start + count - r0), keys, 0, kg});
    }
  }

  // Keys [0, n) that row i of tile t may read: all of them, or those up to
  // its causal position. The softmax's passes skip the rest, which are only
  // zeroed for the products: a third of the entries of the anchor's causal
  // blocks (T 256 in blocks of 128).
  int64_t readable_keys(const Tile& t, int64_t i) const {
    const int64_t r = t.r0 + i;
    const int64_t pos = block > 0 ? r : qpos ? qpos[t.qg * qpos_stride + r] : t.keys - 1;
    return std::clamp<int64_t>(pos + 1, 0, t.keys);
  }

  // Scores of one tile into s (rows x keys, leading dimension keys); each
  // row's readable keys, rounded up to whole vectors, in ends[i], the keys
  // masked among them set to kMasked. A row with no key to read is kMasked
  // throughout and reads all keys: uniform weights, as the unfused path
  // gives it.
  void scores(int64_t head, const Tile& t, float* s, int64_t* ends) const {
    product(false, false, t.rows, t.keys, dh, q.row(t.qg, head, t.r0), q.ld, kt.at(t.kg, head), kt.ld, 0.f, s, t.keys);
    const bool* ok = valid ? valid + t.kg * L : nullptr;
    for (int64_t i = 0; i < t.rows; ++i) {
      float* row = s + i * t.keys;
      int64_t end = readable_keys(t, i), open = end;
      if (ok)
        for (int64_t j = 0; j < end; ++j)
          if (!ok[j]) row[j] = kMasked, --open;
      if (open == 0) {
        std::fill(row, row + t.keys, kMasked);
        end = t.keys;
      }
      // To whole vectors of the row kernels (chiar::kRowLanes), the extra
      // keys masked.
      const int64_t whole = std::min(t.keys, (end + chiar::kRowLanes - 1) / chiar::kRowLanes * chiar::kRowLanes);
      std::fill(row + end, row + whole, kMasked);
      ends[i] = whole;
    }
  }
};

// Runs tasks 0..n-1 over the intra-op threads, each thread a set of them
// balanced by cost (largest first, each to the least loaded thread).
// at::parallel_for would hand each thread one contiguous range, and the
// costs of a causal problem's tiles, or of segments ordered by block end,
// grow along it: with two threads, one sequence's second half of the query
// blocks holds three quarters of its work.
template <class Cost, class Run>
void run_balanced(int64_t n, const Cost& cost, const Run& run) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < n; ++i) run(i);
    return;
  }
  std::vector<double> costs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) costs[static_cast<size_t>(i)] = cost(i);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[static_cast<size_t>(a)] > costs[static_cast<size_t>(b)]; });
  std::vector<std::vector<int64_t>> bins(static_cast<size_t>(threads));
  std::vector<double> load(static_cast<size_t>(threads), 0.0);
  for (const int64_t i : order) {
    const auto least = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    bins[least].push_back(i);
    load[least] += costs[static_cast<size_t>(i)];
  }
  for (auto& bin : bins) std::sort(bin.begin(), bin.end());  // back in memory order
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (const int64_t i : bins[static_cast<size_t>(b)]) run(i);
  });
}

// Per-thread scratch, kept between calls and grown when a longer sequence
// comes: slot 0 for a tile's scores (and their gradient), which each tile
// sizes anew; slot 1 for a backward task's fp32 accumulators, which live
// across its tiles.
float* scratch(size_t floats, int slot = 0) {
  thread_local std::vector<float> buffers[2];
  auto& buffer = buffers[slot];
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

// o (G, h, m, dh) in T and, per query, the maximum score and the log of the
// sum of exp(score - maximum): stats (2, G, h, m). A bf16 o is each tile's
// fp32 product rounded once, as the output projection would round it.
template <class T>
void forward_tiles(const Problem<T>& p, const Matrices<T>& o, float* stats) {
  const int64_t per_seq = p.heads * p.m;
  float* log_sums = stats + p.G * per_seq;
  const auto tile_cost = [&](int64_t task) {
    const auto& t = p.tiles[static_cast<size_t>(task / p.heads)];
    return static_cast<double>(t.rows) * static_cast<double>(t.keys);
  };
  run_balanced(static_cast<int64_t>(p.tiles.size()) * p.heads, tile_cost, [&](int64_t task) {
    const auto& t = p.tiles[static_cast<size_t>(task / p.heads)];
    const int64_t head = task % p.heads;
    const size_t area = static_cast<size_t>(t.rows * t.keys);
    // (rows, keys) scores, then in bf16 the tile's fp32 output (rows, dh)
    float* s = scratch(area + (std::is_same_v<T, float> ? 0 : static_cast<size_t>(t.rows * p.dh)));
    int64_t ends[kMaxTileRows];
    p.scores(head, t, s, ends);
    // Each row's exp(score - maximum), unnormalised: the output's rows are
    // divided by their sums after the product, (rows, dh) instead of
    // (rows, keys) divisions.
    float inverse_sums[kMaxTileRows];
    const int64_t first = t.qg * per_seq + head * p.m + t.r0;
    for (int64_t i = 0; i < t.rows; ++i) {
      float* row = s + i * t.keys;
      const int64_t end = ends[i];
      bool finite = true;
      const float top = chiar::row_max(row, end, &finite);
      // An infinite or NaN score makes the row NaN, as +inf and NaN do in
      // libtorch's softmax (a lone -inf, which libtorch would weigh 0,
      // needs q k^T to overflow; it is NaN here too).
      if (!finite) {
        std::fill(row, row + t.keys, kNaN);
        ends[i] = t.keys;
        stats[first + i] = log_sums[first + i] = inverse_sums[i] = kNaN;
        continue;
      }
      const float sum = chiar::exp_shifted(row, end, top, 0.f);
      zero_tail<T>(row, end, t.keys);
      stats[first + i] = top;
      log_sums[first + i] = std::log(sum);
      inverse_sums[i] = 1.f / sum;
    }
    if constexpr (std::is_same_v<T, float>) {
      product(false, false, t.rows, p.dh, t.keys, s, t.keys, p.v.at(t.kg, head), p.v.ld, 0.f, o.row(t.qg, head, t.r0),
              o.ld);
      for (int64_t i = 0; i < t.rows; ++i) chiar::scale_row(o.row(t.qg, head, t.r0 + i), p.dh, inverse_sums[i]);
    } else {
      float* out = s + area;  // (rows, dh)
      product(false, false, t.rows, p.dh, t.keys, as_operand(s, t.rows, t.keys, ends, p.v.data), t.keys,
              p.v.at(t.kg, head), p.v.ld, 0.f, out, p.dh);
      for (int64_t i = 0; i < t.rows; ++i)
        chiar::scale_to_bf16(out + i * p.dh, inverse_sums[i], reinterpret_cast<uint16_t*>(o.row(t.qg, head, t.r0 + i)),
                             p.dh);
    }
  });
}

// Gradients of q, kt and v from dout and the forward's o and stats. In
// fp32, given k = kt^T (GK, h, L, dh) and vt = v^T (GK, h, dh, L) contiguous:
// with them every product of a tile reads row-major operands or transposes
// only its short side (oneDNN's sgemm reading kt and v against the grain
// ran long sequences' backward slower; chiar_bench:
// attention_core/fused/fwd+bwd/2048/*). In bf16, k and vt are null: those
// two products read kt and v themselves, transposed, and gemm_bf16_tile
// makes the rows of a tile of multiples of 32 dense where they are not
// (others run on the any-size primitives, strided), which cost less than the
// two copies from T 256 to 2048 (docs/performance.md, 'The fused attention
// core'). dq (G, h, m, dh), dk (GK, h, L, dh) and
// dv (GK, h, L, dh) contiguous: rows of dh, as the projection's gradient
// takes them (the caller hands dk on as kt's gradient, transposed, which
// RoPE's backward reads as rows). Written as (dh, L) they had to be gathered
// an element at a time into the projection's (G, L, 2, h, dh) gradient
// (bench-train: attention's backward 1-2% faster so). One task per (key
// batch, head), so that the tiles adding into its keys' and values'
// gradients run one after another. o and dout in T, as forward wrote o and
// the products read dout; the softmax's backward reads o and dout in fp32
// only (below).
//
// D, the gradients' type: fp32, or bf16 where q, kt and v were bf16 (the
// operator's bf16 projections). A bf16 dq is each tile's fp32 product
// rounded once; dk and dv are summed over the tiles in fp32 accumulators of
// the task's own and rounded once at its end.
template <class T, class D>
void backward_tiles(const Problem<T>& p, const Matrices<T>& o, const float* stats, const Matrices<T>& dout, const T* k,
                    const T* vt, D* dq, D* dk, D* dv) {
  constexpr bool fp32_grads = std::is_same_v<D, float>;
  constexpr bool transposed = !std::is_same_v<T, float>;  // reads kt and v, not k and vt
  const int64_t per_seq = p.heads * p.m;
  const float* log_sums = stats + p.G * per_seq;
  std::vector<double> batch_cost(static_cast<size_t>(p.GK), 0.0);  // score elements per key batch
  for (const auto& t : p.tiles) batch_cost[static_cast<size_t>(t.kg)] += static_cast<double>(t.rows * t.keys);
  const auto task_cost = [&](int64_t task) { return batch_cost[static_cast<size_t>(task / p.heads)]; };
  const int64_t size = p.L * p.dh;  // one (key batch, head)'s keys, values or their gradients
  run_balanced(p.GK * p.heads, task_cost, [&](int64_t task) {
    const int64_t kg = task / p.heads, head = task % p.heads;
    // op(B) of dq's product, k[:keys] (keys, dh), and of the weights'
    // gradient's, v[:keys]^T (dh, keys): k (L, dh) and vt (dh, L) read
    // row-major, or kt (dh, L) and v (L, dh) read transposed.
    const T* k_gh = transposed ? p.kt.at(kg, head) : k + task * size;
    const int64_t k_ld = transposed ? p.kt.ld : p.dh;
    const T* vt_gh = transposed ? p.v.at(kg, head) : vt + task * size;
    const int64_t vt_ld = transposed ? p.v.ld : p.L;
    float* dk_gh;  // (L, dh): the gradient itself, or its fp32 accumulator
    float* dv_gh;  // (L, dh)
    if constexpr (fp32_grads) {
      dk_gh = dk + task * size;
      dv_gh = dv + task * size;
    } else {
      dk_gh = scratch(static_cast<size_t>(2 * size), /*slot=*/1);
      dv_gh = dk_gh + size;
    }
    std::fill(dk_gh, dk_gh + size, 0.f);
    std::fill(dv_gh, dv_gh + size, 0.f);
    for (const size_t index : p.tiles_of[static_cast<size_t>(kg)]) {
      const auto& t = p.tiles[index];
      const size_t area = static_cast<size_t>(t.rows * t.keys);
      // (rows, keys): the weights, then the scores' gradient; for a bf16 dq
      // its tile in fp32 (rows, dh)
      float* weights = scratch(2 * area + (fp32_grads ? 0 : static_cast<size_t>(t.rows * p.dh)));
      float* grad = weights + area;
      int64_t ends[kMaxTileRows];
      p.scores(head, t, weights, ends);
      const int64_t first = t.qg * per_seq + head * p.m + t.r0;
      for (int64_t i = 0; i < t.rows; ++i) {
        float* row = weights + i * t.keys;
        if (std::isnan(stats[first + i])) {
          std::fill(row, row + t.keys, kNaN);
          ends[i] = t.keys;
        } else {
          chiar::exp_shifted(row, ends[i], stats[first + i], log_sums[first + i]);
          zero_tail<T>(row, ends[i], t.keys);
        }
      }
      const T* dout_t = dout.row(t.qg, head, t.r0);
      // dv[:keys] += weights^T dout
      product(true, false, t.keys, p.dh, t.rows, as_operand(weights, t.rows, t.keys, ends, k_gh), t.keys, dout_t,
              dout.ld, 1.f, dv_gh, p.dh);
      // d weights = dout vt[:, :keys], then through the softmax
      product(false, transposed, t.rows, t.keys, p.dh, dout_t, dout.ld, vt_gh, vt_ld, 0.f, grad, t.keys);
      for (int64_t i = 0; i < t.rows; ++i) {
        float* w_row = weights + i * t.keys;
        float* g_row = grad + i * t.keys;
        // delta = sum_j p_j dp_j, which dout . o equals. In bf16 the d
        // weights come from rounded operands and dout . o does not match
        // them (a query with one key would get a gradient that should be
        // 0), so the row's own sum, in fp32.
        float delta;
        if constexpr (std::is_same_v<T, float>)
          delta = chiar::dot(dout.row(t.qg, head, t.r0 + i), o.row(t.qg, head, t.r0 + i), p.dh);
        else
          delta = chiar::dot(w_row, g_row, ends[i]);
        chiar::softmax_backward_row(w_row, g_row, ends[i], delta);
        zero_tail<T>(g_row, ends[i], t.keys);
      }
      // dq = d scores k[:keys]; dk[:keys] += d scores^T q
      const T* grad_op = as_operand(grad, t.rows, t.keys, ends, k_gh);
      if constexpr (fp32_grads) {
        product(false, transposed, t.rows, p.dh, t.keys, grad_op, t.keys, k_gh, k_ld, 0.f, dq + first * p.dh, p.dh);
      } else {
        float* dq_tile = grad + area;
        product(false, transposed, t.rows, p.dh, t.keys, grad_op, t.keys, k_gh, k_ld, 0.f, dq_tile, p.dh);
        chiar::round_to_bf16(dq_tile, reinterpret_cast<uint16_t*>(dq + first * p.dh), t.rows * p.dh);
      }
      product(true, false, t.keys, p.dh, t.rows, grad_op, t.keys, p.q.row(t.qg, head, t.r0), p.q.ld, 1.f, dk_gh, p.dh);
    }
    if constexpr (!fp32_grads) {
      chiar::round_to_bf16(dk_gh, reinterpret_cast<uint16_t*>(dk + task * size), size);
      chiar::round_to_bf16(dv_gh, reinterpret_cast<uint16_t*>(dv + task * size), size);
    }
  });
}

// t as the bf16 products read it: itself when it is bf16 already (the
// operator's bf16 projections, read in place), else a contiguous bf16 copy
// in one pass.
at::Tensor as_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16
             ? t
             : t.to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
}

// bf16: the products take q, kt, v, the tiles' weights and gradients in
// bf16 and sum in fp32 (chiar::cpu_bf16_products, decided at forward and
// kept for backward); scores, softmax and statistics stay fp32. q, kt and v
// come in bf16 from the operator's bf16 projections, read in place, and get
// bf16 gradients; fp32 ones are rounded into copies and get fp32 gradients.
// The output is bf16, each entry rounded once from its fp32 sum: only the
// output projection reads it, and its gradient comes back in bf16, as the
// products take it.
struct FusedAttention : public torch::autograd::Function<FusedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& kt,
                            const at::Tensor& v, const at::Tensor& qpos, const at::Tensor& valid,
                            const at::Tensor& segments, int64_t block, bool bf16) {
    // The operands as the products read them: q, kt and v themselves (fp32,
    // or bf16 under bf16 products), or bf16 copies of fp32 ones.
    const auto qo = bf16 ? as_bf16(q) : q, kto = bf16 ? as_bf16(kt) : kt, vo = bf16 ? as_bf16(v) : v;
    // Stored as (G, m, h, dh): the heads side by side per query, so that the
    // caller's (G, m, h * dh) for the output projection is a view, not a copy.
    const auto out_options = q.options().dtype(bf16 ? at::kBFloat16 : at::kFloat);
    auto o = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, out_options).transpose(1, 2);  // (G, h, m, dh)
    auto stats = at::empty({2, q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    if (bf16)
      forward_tiles(Problem<c10::BFloat16>(qo, kto, vo, qpos, valid, segments, block, /*arrays=*/1),
                    matrices<c10::BFloat16>(o), stats.data_ptr<float>());
    else
      forward_tiles(Problem<float>(qo, kto, vo, qpos, valid, segments, block, /*arrays=*/1), matrices<float>(o),
                    stats.data_ptr<float>());
    ctx->save_for_backward({qo, kto, vo, o, stats});
    ctx->saved_data["qpos"] = qpos;
    ctx->saved_data["valid"] = valid;
    ctx->saved_data["segments"] = segments;
    ctx->saved_data["block"] = block;
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["types"] =
        std::vector<int64_t>{static_cast<int64_t>(q.scalar_type()), static_cast<int64_t>(kt.scalar_type()),
                             static_cast<int64_t>(v.scalar_type())};
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &kt = saved[1], &v = saved[2], &o = saved[3], &stats = saved[4];
    const auto dout = readable(grads[0]);
    const auto qpos = ctx->saved_data["qpos"].toTensor(), valid = ctx->saved_data["valid"].toTensor(),
               segments = ctx->saved_data["segments"].toTensor();
    const int64_t block = ctx->saved_data["block"].toInt();
    // Each gradient in its input's type: bf16 for the operator's bf16
    // projections (written so by backward_tiles), else fp32.
    const auto types = ctx->saved_data["types"].toIntVector();
    const bool bf16_grads = std::all_of(types.begin(), types.end(),
                                        [](int64_t t) { return static_cast<at::ScalarType>(t) == at::kBFloat16; });
    const auto grad_options = q.options().dtype(bf16_grads ? at::kBFloat16 : at::kFloat);
    auto dq = at::empty(q.sizes(), grad_options);                                         // (G, h, m, dh)
    auto dk = at::empty({kt.size(0), kt.size(1), kt.size(3), kt.size(2)}, grad_options);  // (GK, h, L, dh)
    auto dv = at::empty(dk.sizes(), grad_options);                                        // (GK, h, L, dh)
    if (ctx->saved_data["bf16"].toBool()) {
      // dout arrives in bf16 (o's type) and is read in place, as are kt and v.
      const auto dout_op = readable(as_bf16(dout));
      const Problem<c10::BFloat16> p(q, kt, v, qpos, valid, segments, block, /*arrays=*/2);
      const c10::BFloat16* no_copy = nullptr;  // no k or vt: kt and v are read transposed
      if (bf16_grads)
        backward_tiles(p, matrices<c10::BFloat16>(o), stats.data_ptr<float>(), matrices<c10::BFloat16>(dout_op),
                       no_copy, no_copy, dq.data_ptr<c10::BFloat16>(), dk.data_ptr<c10::BFloat16>(),
                       dv.data_ptr<c10::BFloat16>());
      else
        backward_tiles(p, matrices<c10::BFloat16>(o), stats.data_ptr<float>(), matrices<c10::BFloat16>(dout_op),
                       no_copy, no_copy, dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>());
    } else {
      const auto k = kt.transpose(2, 3).contiguous();  // (GK, h, L, dh)
      const auto vt = v.transpose(2, 3).contiguous();  // (GK, h, dh, L)
      backward_tiles(Problem<float>(q, kt, v, qpos, valid, segments, block, /*arrays=*/2), matrices<float>(o),
                     stats.data_ptr<float>(), matrices<float>(dout), k.data_ptr<float>(), vt.data_ptr<float>(),
                     dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>());
    }
    // Mixed types (not the operator's): cast where they differ.
    const auto typed = [&](const at::Tensor& g, size_t i) { return g.to(static_cast<at::ScalarType>(types[i])); };
    const at::Tensor none;  // the masks, segments, block and flag take no gradient
    return {typed(dq, 0), typed(dk.transpose(2, 3), 1), typed(dv, 2), none, none, none, none, none};
  }
};

// The optional masks as the autograd function takes them (its arguments are
// all defined, so "none" is an empty tensor): positions as (rows, -1) int64,
// valid (G, L) bool, checked against the key batches.
struct Masks {
  at::Tensor none, positions, keys;
};
Masks masks(const char* who, const at::Tensor& qpos, int64_t position_rows, const at::Tensor& valid, int64_t G,
            int64_t L) {
  TORCH_CHECK(!valid.defined() || valid.numel() == 0 || (valid.dim() == 2 && valid.size(0) == G && valid.size(1) == L),
              who, ": valid ", valid.sizes(), " does not match ", G, " sequences of ", L, " keys");
  Masks m;
  m.none = at::empty({0}, at::TensorOptions().dtype(at::kLong));
  m.positions =
      qpos.defined() && qpos.numel() > 0 ? qpos.reshape({position_rows, -1}).to(at::kLong).contiguous() : m.none;
  m.keys = valid.defined() && valid.numel() > 0 ? valid.to(at::kBool).contiguous() : m.none;
  return m;
}

// fp32 operands, or bf16 ones where the products are bf16 (the operator's
// bf16 projections under chiar::cpu_bf16_products).
void check_types(const char* who, const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v) {
  const bool bf16 = chiar::cpu_bf16_products();
  for (const at::Tensor* t : {&q, &kt, &v})
    TORCH_CHECK(t->scalar_type() == at::kFloat || (bf16 && t->scalar_type() == at::kBFloat16), who,
                ": operands must be fp32, or bf16 under bf16 products; found ", t->scalar_type());
}

}  // namespace

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v, const at::Tensor& qpos,
                           const at::Tensor& valid, int64_t block) {
  RECORD_FUNCTION("chiar::fused_attention", std::vector<c10::IValue>({q, kt, v}));
  TORCH_CHECK(q.dim() == 4 && kt.dim() == 4 && v.dim() == 4 && kt.size(2) == q.size(3) && v.size(3) == q.size(3) &&
                  v.size(2) == kt.size(3) && kt.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                  kt.size(1) == q.size(1) && v.size(1) == q.size(1),
              "fused_attention: q ", q.sizes(), ", kt ", kt.sizes(), " and v ", v.sizes(), " do not match");
  TORCH_CHECK(block == 0 || (!qpos.defined() && q.size(2) == kt.size(3)),
              "fused_attention: causal blocks need a query per key and no positions");
  TORCH_CHECK(
      !qpos.defined() || qpos.numel() == 0 || qpos.numel() == q.size(2) || qpos.numel() == q.size(0) * q.size(2),
      "fused_attention: positions ", qpos.sizes(), " do not match queries ", q.sizes());
  const Masks m =
      masks("fused_attention", qpos, qpos.defined() && qpos.dim() > 0 ? qpos.size(0) : 1, valid, q.size(0), kt.size(3));
  check_types("fused_attention", q, kt, v);
  return FusedAttention::apply(readable(q), readable(kt), readable(v), m.positions, m.keys, m.none, block,
                               chiar::cpu_bf16_products());
}

at::Tensor fused_attention_rows(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v,
                                const at::Tensor& segments, const at::Tensor& qpos, const at::Tensor& valid) {
  RECORD_FUNCTION("chiar::fused_attention_rows", std::vector<c10::IValue>({q, kt, v}));
  TORCH_CHECK(q.dim() == 3 && kt.dim() == 4 && v.dim() == 4 && q.size(1) == kt.size(1) && q.size(2) == kt.size(2) &&
                  v.sizes() == at::IntArrayRef({kt.size(0), kt.size(1), kt.size(3), kt.size(2)}),
              "fused_attention_rows: q ", q.sizes(), ", kt ", kt.sizes(), " and v ", v.sizes(), " do not match");
  const auto seg = segments.to(at::kLong).contiguous();
  TORCH_CHECK(seg.dim() == 2 && seg.size(1) == 4, "fused_attention_rows: segments must be (S, 4), found ", seg.sizes());
  const auto* s = seg.data_ptr<int64_t>();
  int64_t covered = 0;
  for (int64_t i = 0; i < seg.size(0); ++i) {
    TORCH_CHECK(s[4 * i] == covered && s[4 * i + 1] > 0 && s[4 * i + 2] >= 0 && s[4 * i + 2] < kt.size(0) &&
                    s[4 * i + 3] > 0 && s[4 * i + 3] <= kt.size(3),
                "fused_attention_rows: segment ", i, " (", s[4 * i], ", ", s[4 * i + 1], ", ", s[4 * i + 2], ", ",
                s[4 * i + 3], ") does not follow on row ", covered, " within ", kt.size(0), " sequences of ",
                kt.size(3), " keys");
    covered += s[4 * i + 1];
  }
  TORCH_CHECK(covered == q.size(0), "fused_attention_rows: segments cover ", covered, " of ", q.size(0), " rows");
  TORCH_CHECK(!qpos.defined() || qpos.numel() == 0 || qpos.numel() == q.size(0), "fused_attention_rows: positions ",
              qpos.sizes(), " do not match ", q.size(0), " rows");
  const Masks m = masks("fused_attention_rows", qpos, 1, valid, kt.size(0), kt.size(3));
  check_types("fused_attention_rows", q, kt, v);
  // One query batch of N rows: (1, h, N, dh), its rows read in place.
  auto o = FusedAttention::apply(readable(q.transpose(0, 1).unsqueeze(0)), readable(kt), readable(v), m.positions,
                                 m.keys, seg, 0, chiar::cpu_bf16_products());  // (1, h, N, dh) stored (1, N, h, dh)
  return o.squeeze(0).transpose(0, 1);                                         // (N, h, dh), contiguous
}

}  // namespace chiar_attention
