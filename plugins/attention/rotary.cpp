#include "rotary.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <vector>

#include "chiar/row_kernels.h"  // CHIAR_ROW_KERNEL: the plugin is built for the baseline ISA

namespace chiar_attention {

namespace {

// Positions per transposed block: the block's rows are rotated into a small
// buffer (16 KiB at dh 64), then written a feature at a time as runs of
// kBlock positions (four cache lines each).
constexpr int64_t kBlock = 64;

struct Layout {
  int64_t G, L, heads, dh, half;
  int64_t s0, s1, s2;  // the projection side's strides over g, position, head
  const float* cos;
  const float* sin;
  const int64_t* pos;  // (L) or (G, L), or null
  int64_t pos_stride;  // L when positions differ per sequence, else 0
  float scale;
};

// n rows of dh features, row j at position p_j (pos[j], or first + j when
// pos is null), turned by that position's angles (cos, sin: (P, half)) times
// scale; sign -1 turns back (the rotation's transpose): out[i], out[i + half]
// of each row. One call per run of rows, so that a short head (dh 16) is not
// a call per row.
CHIAR_ROW_KERNEL
void turn_rows(const float* __restrict cos, const float* __restrict sin, const int64_t* pos, int64_t first, int64_t n,
               int64_t half, float scale, float sign, const float* __restrict in, int64_t in_stride,
               float* __restrict out, int64_t out_stride) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = pos ? pos[j] : first + j;
    const float* c = cos + p * half;
    const float* s = sin + p * half;
    const float* a = in + j * in_stride;
    float* o = out + j * out_stride;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x = a[i], y = a[i + half], cs = c[i] * scale, sn = sign * s[i] * scale;
      o[i] = x * cs - y * sn;
      o[i + half] = x * sn + y * cs;
    }
  }
}

// A block's n rows of dh features (rows, row-major) <-> the same features as
// dh runs of n positions in a (dh, ld) matrix (cols): a feature at a time,
// vectorised along the run, so that the big matrix is read (or written) in
// whole vectors and the strided side is the small buffer, which stays in L1.
CHIAR_ROW_KERNEL
void rows_to_cols(const float* __restrict rows, int64_t n, int64_t dh, float* __restrict cols, int64_t ld) {
  for (int64_t i = 0; i < dh; ++i) {
    float* __restrict run = cols + i * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) run[j] = rows[j * dh + i];
  }
}
CHIAR_ROW_KERNEL
void cols_to_rows(const float* __restrict cols, int64_t ld, int64_t n, int64_t dh, float* __restrict rows) {
  for (int64_t i = 0; i < dh; ++i) {
    const float* __restrict run = cols + i * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) rows[j * dh + i] = run[j];
  }
}

// Between the projection's side, (G, L, h, dh) at strides s0, s1, s2, and
// the core's layout (contiguous; transposed for the keys): forward turns
// `in` (projection side) into `out` (core side); back turns `in` (the core's
// gradient) by the transposed rotation into `out` (the projection side's
// gradient).
template <bool back>
void pass(const Layout& l, const float* in, float* out, bool transposed) {
  const float sign = back ? -1.f : 1.f;
  // Rows [t0, t0 + n) of (sequence g, head): on the projection side a row
  // every s1 floats, in the core's layout every dh.
  const auto turn = [&](int64_t g, int64_t t0, int64_t n, const float* from, int64_t from_stride, float* to,
                        int64_t to_stride) {
    const int64_t* pos = l.pos ? l.pos + g * l.pos_stride + t0 : nullptr;
    turn_rows(l.cos, l.sin, pos, t0, n, l.half, l.scale, sign, from, from_stride, to, to_stride);
  };
  const auto side = [&](auto* base, int64_t g, int64_t t, int64_t head) {
    return base + g * l.s0 + t * l.s1 + head * l.s2;
  };
  const auto core = [&](auto* base, int64_t g, int64_t t, int64_t head) {
    return base + ((g * l.heads + head) * l.L + t) * l.dh;
  };
  // One task per (sequence, block of positions), every head inside it.
  const int64_t blocks = (l.L + kBlock - 1) / kBlock;
  if (!transposed) {
    at::parallel_for(0, l.G * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t g = task / blocks, t0 = task % blocks * kBlock, n = std::min(kBlock, l.L - t0);
        for (int64_t head = 0; head < l.heads; ++head)
          if constexpr (back)
            turn(g, t0, n, core(in, g, t0, head), l.dh, side(out, g, t0, head), l.s1);
          else
            turn(g, t0, n, side(in, g, t0, head), l.s1, core(out, g, t0, head), l.dh);
      }
    });
    return;
  }
  // The keys go through a small buffer of rows: a position's keys of all
  // heads are one run of the projection's row, read (or written) once.
  at::parallel_for(0, l.G * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(static_cast<size_t>(kBlock * l.dh));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / blocks, t0 = task % blocks * kBlock, n = std::min(kBlock, l.L - t0);
      for (int64_t head = 0; head < l.heads; ++head) {
        // This block's keys of this head in the core's (dh, L) layout.
        const int64_t keys = (g * l.heads + head) * l.dh * l.L + t0;
        if constexpr (back) {
          cols_to_rows(in + keys, l.L, n, l.dh, rows.data());
          turn(g, t0, n, rows.data(), l.dh, side(out, g, t0, head), l.s1);
        } else {
          turn(g, t0, n, side(in, g, t0, head), l.s1, rows.data(), l.dh);
          rows_to_cols(rows.data(), n, l.dh, out + keys, l.L);
        }
      }
    }
  });
}

// The same passes on bf16 (as bits), turned in fp32. A block's positions
// are widened (forward) or rounded (backward) a whole projection row at a
// time, every head in one run (rotary() gives bf16 x its heads side by
// side, stride dh), through a buffer of the block's rows in fp32; each head's rows are turned
// between it and the core's side, which is rounded or widened once a head.
template <bool back>
void pass_bf16(const Layout& l, const uint16_t* in, uint16_t* out, bool transposed) {
  const float sign = back ? -1.f : 1.f;
  const int64_t blocks = (l.L + kBlock - 1) / kBlock, width = l.heads * l.dh;  // l.s2 == l.dh (rotary())
  at::parallel_for(0, l.G * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> side_rows(static_cast<size_t>(kBlock * width));             // (n, h * dh) the projection's side
    std::vector<float> core_rows(static_cast<size_t>(kBlock * l.dh));              // (n, dh) one head, the core's side
    std::vector<float> cols(transposed ? static_cast<size_t>(kBlock * l.dh) : 0);  // (dh, n) the keys, transposed
    // Between position t0 + j's projection row, its heads side by side, and
    // row j of side_rows.
    const auto each_run = [&](int64_t g, int64_t t0, int64_t n, const auto& move) {
      for (int64_t j = 0; j < n; ++j) move(g * l.s0 + (t0 + j) * l.s1, side_rows.data() + j * width, width);
    };
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / blocks, t0 = task % blocks * kBlock, n = std::min(kBlock, l.L - t0);
      const int64_t* pos = l.pos ? l.pos + g * l.pos_stride + t0 : nullptr;
      if constexpr (!back)
        each_run(g, t0, n, [&](int64_t at, float* to, int64_t len) { chiar::widen_bf16(in + at, to, len); });
      for (int64_t head = 0; head < l.heads; ++head) {
        // The core's rows t0 .. t0 + n of (g, head): contiguous, or for the
        // keys columns of the (dh, L) matrix.
        const int64_t core = (g * l.heads + head) * l.L * l.dh + (transposed ? t0 : t0 * l.dh);
        float* side_head = side_rows.data() + head * l.dh;  // (n, dh) at stride width
        if constexpr (!back) {
          turn_rows(l.cos, l.sin, pos, t0, n, l.half, l.scale, sign, side_head, width, core_rows.data(), l.dh);
          if (!transposed) {
            chiar::round_to_bf16(core_rows.data(), out + core, n * l.dh);
          } else {  // transposed in fp32 (whole vectors), then a feature's run of n keys rounded at a time
            rows_to_cols(core_rows.data(), n, l.dh, cols.data(), n);
            for (int64_t i = 0; i < l.dh; ++i) chiar::round_to_bf16(cols.data() + i * n, out + core + i * l.L, n);
          }
        } else {
          if (!transposed) {
            chiar::widen_bf16(in + core, core_rows.data(), n * l.dh);
          } else {
            for (int64_t i = 0; i < l.dh; ++i) chiar::widen_bf16(in + core + i * l.L, cols.data() + i * n, n);
            cols_to_rows(cols.data(), n, n, l.dh, core_rows.data());
          }
          turn_rows(l.cos, l.sin, pos, t0, n, l.half, l.scale, sign, core_rows.data(), l.dh, side_head, width);
        }
      }
      if constexpr (back)
        each_run(g, t0, n, [&](int64_t at, float* from, int64_t len) { chiar::round_to_bf16(from, out + at, len); });
    }
  });
}

// bits of a bf16 tensor
const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>()); }
uint16_t* bits(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>()); }

Layout layout(const at::Tensor& x_shape, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& pos,
              double scale) {
  Layout l{};
  l.G = x_shape.size(0);
  l.L = x_shape.size(1);
  l.heads = x_shape.size(2);
  l.dh = x_shape.size(3);
  l.half = l.dh / 2;
  l.cos = cos.data_ptr<float>();
  l.sin = sin.data_ptr<float>();
  if (pos.numel() > 0) {
    l.pos = pos.data_ptr<int64_t>();
    l.pos_stride = pos.dim() == 2 && pos.size(0) == l.G && l.G > 1 ? l.L : 0;
  }
  l.scale = static_cast<float>(scale);
  return l;
}

struct Rotary : public torch::autograd::Function<Rotary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& pos, double scale, bool transposed) {
    Layout l = layout(x, cos, sin, pos, scale);
    l.s0 = x.stride(0);
    l.s1 = x.stride(1);
    l.s2 = x.stride(2);
    auto out = transposed ? at::empty({l.G, l.heads, l.dh, l.L}, x.options())
                          : at::empty({l.G, l.heads, l.L, l.dh}, x.options());
    if (x.scalar_type() == at::kBFloat16)
      pass_bf16</*back=*/false>(l, bits(x), bits(out), transposed);
    else
      pass</*back=*/false>(l, x.data_ptr<float>(), out.data_ptr<float>(), transposed);
    ctx->save_for_backward({cos, sin, pos});
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["transposed"] = transposed;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    // The gradient in x's type (autograd hands it so): bf16 x, bf16 both ways.
    const bool bf16 = grads[0].scalar_type() == at::kBFloat16;
    auto gx = at::empty(shape, grads[0].options());
    Layout l = layout(gx, saved[0], saved[1], saved[2], ctx->saved_data["scale"].toDouble());
    l.s0 = gx.stride(0);
    l.s1 = gx.stride(1);
    l.s2 = gx.stride(2);
    // The keys' gradient as the fused core gives it, (G, h, L, dh) rows
    // transposed to the (G, h, dh, L) of kt, is read as those rows: the
    // rows' pass, with no transposing copy first.
    const bool transposed = ctx->saved_data["transposed"].toBool();
    const bool as_rows = transposed && grads[0].transpose(2, 3).is_contiguous();
    const auto grad = as_rows ? grads[0].transpose(2, 3) : grads[0].contiguous();
    const bool columns = transposed && !as_rows;  // the (dh, L) layout, read a feature's run at a time
    if (bf16)
      pass_bf16</*back=*/true>(l, bits(grad), bits(gx), columns);
    else
      pass</*back=*/true>(l, grad.data_ptr<float>(), gx.data_ptr<float>(), columns);
    return {gx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& pos,
                  double scale, bool keys_transposed) {
  RECORD_FUNCTION("chiar::rotary", std::vector<c10::IValue>({x}));
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && cos.dim() == 2 && cos.size(1) * 2 == x.size(3) &&
                  sin.sizes() == cos.sizes(),
              "rotary: x ", x.sizes(), " and tables ", cos.sizes(), " do not match");
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "rotary: x must be fp32 or bf16 and the tables fp32, found ", x.scalar_type(), " and ",
              cos.scalar_type());
  // bf16 x is read a position's heads at a time (pass_bf16): the projections'
  // views are so already.
  const bool readable = x.stride(3) == 1 && (x.scalar_type() != at::kBFloat16 || x.stride(2) == x.size(3));
  const auto input = readable ? x : x.contiguous();
  const auto positions = pos.defined() ? pos.to(at::kLong).contiguous() : at::empty({0}, x.options().dtype(at::kLong));
  return Rotary::apply(input, cos.contiguous(), sin.contiguous(), positions, scale, keys_transposed);
}

}  // namespace chiar_attention
