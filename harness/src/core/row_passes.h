#pragma once
// Spreading per-row kernels over the cores, shared by the core's fused
// passes (GELU, LayerNorm, the LM loss).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "chiar/row_kernels.h"

namespace chiar {

// Whether t is an fp32 tensor on the CPU, the fused passes' fast path.
inline bool fp32_cpu(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

// The fewest elements an at::parallel_for task of these passes takes.
constexpr int64_t kElementsPerTask = 16384;

// Rows of n elements per at::parallel_for task: at least kElementsPerTask.
inline int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(n, 1)); }

// row(r) for r in [0, rows), spread over the cores.
template <class Row>
void for_each_row(int64_t rows, int64_t n, const Row& row) {
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(r);
  });
}

// t as a contiguous bf16 tensor, with no autograd history. Contiguous fp32
// on the CPU is rounded by the row kernel (round_to_bf16: c10's rounding, bit
// for bit, on the conversion instruction where the CPU has one) in chunks over
// the cores, faster than libtorch's conversion, which gives the same bits but
// for a NaN's (its vector loop writes 0xffff): bench-train --precision bf16
// --op-times, chiar::to_bf16. Any other tensor goes through libtorch's, which
// reads a strided one in place.
inline at::Tensor to_bf16(const at::Tensor& t) {
  RECORD_FUNCTION("chiar::to_bf16", std::vector<c10::IValue>({t}));
  if (!fp32_cpu(t) || !t.is_contiguous()) return t.detach().to(at::kBFloat16).contiguous();
  auto out = at::empty(t.sizes(), t.options().dtype(at::kBFloat16));
  const float* src = t.data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  at::parallel_for(0, t.numel(), kElementsPerTask,
                   [&](int64_t begin, int64_t end) { round_to_bf16(src + begin, dst + begin, end - begin); });
  return out;
}

// row(r, sums) for r in [0, rows), where each of up to four parts per thread
// adds its rows' contributions into its own `width` floats; returns the
// parts' totals (width,) in `options`, added up in float64 so the result
// does not depend on how many rows a part held.
template <class Row>
at::Tensor for_each_row_with_sums(int64_t rows, int64_t width, const at::TensorOptions& options, const Row& row) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(rows, 4 * at::get_num_threads()));
  auto partial = at::zeros({parts, width}, options);  // (parts, width)
  float* sums = partial.data_ptr<float>();
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t r = rows * p / parts; r < rows * (p + 1) / parts; ++r) row(r, sums + p * width);
  });
  return partial.to(at::kDouble).sum(0).to(options.dtype());
}

}  // namespace chiar
