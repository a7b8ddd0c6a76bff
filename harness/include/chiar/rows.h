#pragma once
// Helpers for Operator::forward_rows: selected rows grouped by a key (the
// sequence they belong to, or a chunk of it) and packed into a padded
// (groups, width, ...) block, so per-group work runs as one batched matmul.
#include <cstdint>
#include <numeric>
#include <vector>

#include <ATen/core/Tensor.h>

#include "chiar/export.h"
#include "chiar/flops.h"

namespace chiar {

struct RowGroups {
  at::Tensor keys;    // (G,) int64 distinct keys, ascending
  at::Tensor group;   // (N,) int64 group index of each row
  at::Tensor slot;    // (N,) int64 position of each row inside its group
  int64_t count = 0;  // G
  int64_t width = 0;  // largest group
};

// The rows each of K operators takes, from a routed layer's flattened
// choices (N,) int64: K index tensors (N_k,) int64, ascending. Choices
// outside 0..K-1 land in no list (the caller counts what was written).
CHIAR_API std::vector<at::Tensor> rows_by_choice(const at::Tensor& choice, int64_t K);

// rows_by_choice's lists together with the same lists in host memory, for
// OpContext::host_rows. On a GPU, the one copy that reads the lists' sizes
// back brings the lists with it (N + K int64 instead of K: one wait either
// way); on the CPU the host lists are the lists themselves.
struct RowLists {
  std::vector<at::Tensor> rows;       // K x (N_k,) int64 on the choices' device
  std::vector<at::Tensor> host_rows;  // K x (N_k,) int64 in host memory, the same values
};
CHIAR_API RowLists rows_by_choice_and_host(const at::Tensor& choice, int64_t K);

// forward_rows's rows in host memory, for planning on the host: `host_rows`
// (OpContext::host_rows) when the caller supplied them, else a copy of
// `rows`, which on a GPU waits. Supplied ones are checked without waiting
// (an int64 host tensor of the rows' length), since a caller that passes its
// context on with other rows must reset them; throws UserError, e.g.
//   OpContext::host_rows: 7 rows in host memory for 5 rows (...)
// Plan with them only: index device tensors by `rows`.
CHIAR_API at::Tensor rows_in_host_memory(const at::Tensor& rows, const at::Tensor& host_rows);

// key: (N,) int64, non-decreasing (true for sorted rows and monotone keys).
// The groups are on key's device. A GPU's keys are grouped on the host from
// one copy of them (the one wait: the count and width are shapes), the
// labels sent back by indices_to_device.
CHIAR_API RowGroups group_rows(const at::Tensor& key);

// Host int64 tensors on `device`, as tensors of the same shapes, in one copy
// that does not wait for the device (staged in pinned memory, which
// libtorch's host allocator keeps until the copy has run); on the CPU, the
// tensors themselves. For index tensors planned on the host from one read
// of the device, so that a forward_rows waits for its GPU once.
CHIAR_API std::vector<at::Tensor> indices_to_device(const std::vector<at::Tensor>& host, const at::Device& device);
// Host groups (group_rows of a host key) on `device`, by indices_to_device.
CHIAR_API RowGroups groups_on_device(const RowGroups& host, const at::Device& device);

// x[rows]: x (R, ...) contiguous or not, rows (N,) int64 -> (N, ...), as
// x.index_select(0, rows). Differentiable in x. Rows strictly increasing (a
// forward_rows's) in host memory with x on the CPU take row copies side by
// side, and backward writes the (R, ...) gradient in one pass, each row
// either its gradient or zeros (under create_graph, a differentiable
// composition instead): index_select's backward zero-fills it and then adds
// the rows one by one (bench-train --op-times: aten::index_select_backward).
// Any other rows or device, a conjugate, negative or quantized x, or the
// "aten" kernel policy take index_select itself (which checks the rows'
// range).
CHIAR_API at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& rows);

// gather_rows' reverse: (R, ...) whose rows lists[k] are parts[k] (N_k,
// ...), differentiable in every part (a routed layer's outputs put back in
// token order). The caller promises that the lists are disjoint and
// together name every row 0..R-1 (rows_by_choice's lists for choices in
// range); the output is not zeroed first. On the CPU, with host int64 lists
// and parts of one dtype and row shape, row copies side by side, and each
// part's gradient its rows of the output's (gather_rows): a chain of
// index_copy_ took a noticeable share of a routed layer (chiar_bench:
// routed_dct_attn/sparse/512/256/*), and its backward clones and fills the
// whole gradient once per part (bench-train --op-times: IndexCopyBackward0).
// Elsewhere index_copy_ into the uninitialised output.
CHIAR_API at::Tensor place_rows(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& lists, int64_t R);

// values (N, ...) -> (G, width, ...), zeros where a group is shorter.
CHIAR_API at::Tensor pack_rows(const at::Tensor& values, const RowGroups& g);
// (G, width, ...) -> (N, ...) in the original row order.
CHIAR_API at::Tensor unpack_rows(const at::Tensor& packed, const RowGroups& g);

// Positions 0 .. T-1: every row of a sequence, for Operator::flops_at.
inline std::vector<int64_t> every_position(int64_t T) {
  std::vector<int64_t> p(static_cast<size_t>(T));
  std::iota(p.begin(), p.end(), int64_t{0});
  return p;
}

// FLOPs of LayerNorm over n vectors of size d, and of a residual add.
inline FlopCount layernorm_flops(int64_t n, int64_t d) { return {8 * n * d, 16 * n * d}; }
inline FlopCount elementwise_flops(int64_t n, int64_t d, int64_t ops = 1) { return {ops * n * d, ops * n * d}; }

}  // namespace chiar
