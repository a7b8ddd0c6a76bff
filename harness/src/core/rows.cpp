#include "chiar/rows.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar_build_info.h"
#if CHIAR_CUDA_KERNELS
#include "cuda_routing.h"
#endif

namespace chiar {

namespace {

// The same groups by one pass on the host: the tensor path's five ops and
// its host sync are a fixed cost per call that weighs on a routed layer at
// small T (chiar_bench: routed_dct_attn/sparse/128/256/*).
RowGroups group_rows_host(const at::Tensor& key) {
  const auto k = key.contiguous();
  const int64_t n = k.numel();
  const int64_t* in = k.data_ptr<int64_t>();
  const auto options = k.options();
  RowGroups g;
  g.group = at::empty({n}, options);
  g.slot = at::empty({n}, options);
  int64_t* group = g.group.data_ptr<int64_t>();
  int64_t* slot = g.slot.data_ptr<int64_t>();
  std::vector<int64_t> keys;
  int64_t run = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || in[i] != in[i - 1]) {
      keys.push_back(in[i]);
      run = 0;
    }
    group[i] = static_cast<int64_t>(keys.size()) - 1;
    slot[i] = run++;
    g.width = std::max(g.width, run);
  }
  g.count = static_cast<int64_t>(keys.size());
  g.keys = at::empty({g.count}, options);
  std::copy(keys.begin(), keys.end(), g.keys.data_ptr<int64_t>());
  return g;
}

}  // namespace

#if CHIAR_CUDA_KERNELS
namespace {

// Whether the CUDA compaction kernel takes these choices.
bool cuda_compaction_takes(const at::Tensor& choice, int64_t K) {
  return cuda_kernels_enabled() && choice.is_cuda() && choice.scalar_type() == at::kLong && K >= 1 &&
         K <= kMaxCudaOperators && cuda_kernels_usable();
}

}  // namespace
#endif

std::vector<at::Tensor> rows_by_choice(const at::Tensor& choice, int64_t K) {
  if (choice.dim() != 1) throw UserError("rows_by_choice: expected a (N,) choice tensor");
  std::vector<at::Tensor> rows;
#if CHIAR_CUDA_KERNELS
  if (cuda_compaction_takes(choice, K)) return rows_by_choice_cuda(choice, K, /*with_host=*/false).rows;
#endif
  if (!host_kernels_enabled() || !choice.device().is_cpu() || choice.scalar_type() != at::kLong) {
    for (int64_t k = 0; k < K; ++k) rows.push_back((choice == k).nonzero().squeeze(1));
    return rows;
  }
  // One pass over the choices instead of K comparisons and K nonzero()
  // calls, each a host sync.
  count_host_kernel();
  const auto c = choice.contiguous();
  const int64_t n = c.numel();
  const int64_t* in = c.data_ptr<int64_t>();
  std::vector<int64_t> count(static_cast<size_t>(K), 0);
  for (int64_t i = 0; i < n; ++i)
    if (in[i] >= 0 && in[i] < K) ++count[static_cast<size_t>(in[i])];
  std::vector<int64_t*> out;
  for (int64_t k = 0; k < K; ++k) {
    rows.push_back(at::empty({count[static_cast<size_t>(k)]}, c.options()));
    out.push_back(rows.back().data_ptr<int64_t>());
  }
  for (int64_t i = 0; i < n; ++i)
    if (in[i] >= 0 && in[i] < K) *out[static_cast<size_t>(in[i])]++ = i;
  return rows;
}

RowLists rows_by_choice_and_host(const at::Tensor& choice, int64_t K) {
  if (choice.dim() != 1) throw UserError("rows_by_choice_and_host: expected a (N,) choice tensor");
#if CHIAR_CUDA_KERNELS
  if (cuda_compaction_takes(choice, K)) return rows_by_choice_cuda(choice, K, /*with_host=*/true);
#endif
  RowLists lists{rows_by_choice(choice, K), {}};
  if (choice.device().is_cpu() || lists.rows.empty()) {
    lists.host_rows = lists.rows;
    return lists;
  }
  // The composition's lists (their sizes already read back by nonzero): one
  // more copy brings them all.
  const auto host = at::cat(lists.rows).cpu();  // (sum N_k,)
  int64_t start = 0;
  for (const auto& r : lists.rows) {
    lists.host_rows.push_back(host.narrow(0, start, r.numel()));  // (N_k,)
    start += r.numel();
  }
  return lists;
}

at::Tensor rows_in_host_memory(const at::Tensor& rows, const at::Tensor& host_rows) {
  if (!host_rows.defined()) return rows.cpu();
  if (!host_rows.device().is_cpu() || host_rows.scalar_type() != at::kLong || host_rows.dim() != 1)
    throw UserError("OpContext::host_rows: expected (N,) int64 rows in host memory, found " +
                    std::string(c10::toString(host_rows.scalar_type())) + " " + c10::str(host_rows.sizes()) + " on " +
                    host_rows.device().str());
  if (host_rows.numel() != rows.numel())
    throw UserError("OpContext::host_rows: " + std::to_string(host_rows.numel()) + " rows in host memory for " +
                    std::to_string(rows.numel()) +
                    " rows (a caller that passes its context on to forward_rows with other rows must reset "
                    "host_rows)");
  return host_rows;
}

RowGroups group_rows(const at::Tensor& key) {
  if (host_kernels_enabled() && key.scalar_type() == at::kLong && key.dim() == 1) {
    count_host_kernel();
    if (key.device().is_cpu()) return group_rows_host(key);
    // One wait for the copy, where unique_consecutive and the width's read
    // each wait.
    return groups_on_device(group_rows_host(key.cpu()), key.device());
  }
  RowGroups g;
  auto [keys, inverse, counts] = at::unique_consecutive(key, /*return_inverse=*/true,
                                                        /*return_counts=*/true);
  g.keys = keys;
  g.group = inverse;
  g.count = keys.size(0);
  g.width = g.count ? counts.max().item<int64_t>() : 0;
  auto starts = counts.cumsum(0) - counts;  // (G,) first row of each group
  g.slot = at::arange(key.size(0), key.options()) - starts.index_select(0, inverse);
  return g;
}

std::vector<at::Tensor> indices_to_device(const std::vector<at::Tensor>& host, const at::Device& device) {
  if (device.is_cpu()) return host;
  int64_t total = 0;
  for (const auto& h : host) total += h.numel();
  auto staged = at::empty({total}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t offset = 0;
  for (const auto& h : host) {
    staged.narrow(0, offset, h.numel()).copy_(h.reshape({-1}));
    offset += h.numel();
  }
  const auto moved = staged.to(device, /*non_blocking=*/true);
  std::vector<at::Tensor> views;
  offset = 0;
  for (const auto& h : host) {
    views.push_back(moved.narrow(0, offset, h.numel()).view(h.sizes()));
    offset += h.numel();
  }
  return views;
}

RowGroups groups_on_device(const RowGroups& host, const at::Device& device) {
  RowGroups g = host;
  const auto moved = indices_to_device({host.keys, host.group, host.slot}, device);
  g.keys = moved[0], g.group = moved[1], g.slot = moved[2];
  return g;
}

namespace {

// Whether rows (N,) int64 in host memory rise strictly inside [0, R).
bool rise_within(const at::Tensor& rows, int64_t R) {
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0, next = 0; i < rows.numel(); next = r[i++] + 1)
    if (r[i] < next || r[i] >= R) return false;
  return true;
}

// Bytes of one row of t (R, ...): what the copies below move per row.
size_t row_bytes(const at::Tensor& t) {
  return static_cast<size_t>(t.size(0) > 0 ? t.numel() / t.size(0) : 0) * t.element_size();
}

// Rows of `bytes` each: out's row i is in's row r[i] (N of them).
void copy_rows(const char* in, const int64_t* r, int64_t n, size_t bytes, char* out) {
  if (bytes == 0) return;  // rows of nothing: no pointer to copy from
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(out + static_cast<size_t>(i) * bytes, in + static_cast<size_t>(r[i]) * bytes, bytes);
  });
}

// The reverse: out's row r[i] is in's row i (N of them); other rows untouched.
void scatter_rows(const char* in, const int64_t* r, int64_t n, size_t bytes, char* out) {
  if (bytes == 0) return;
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(out + static_cast<size_t>(r[i]) * bytes, in + static_cast<size_t>(i) * bytes, bytes);
  });
}

// out's R rows of `bytes` each: row r[i] is in's row i, every other row
// zeros; r (N,) strictly increasing. Each task finds its first listed row by
// bisection, then walks both in step.
void place_rows_or_zeros(const char* in, const int64_t* r, int64_t n, size_t bytes, int64_t R, char* out) {
  if (bytes == 0) return;
  at::parallel_for(0, R, 256, [&](int64_t begin, int64_t end) {
    int64_t i = std::lower_bound(r, r + n, begin) - r;
    for (int64_t t = begin; t < end; ++t) {
      char* row = out + static_cast<size_t>(t) * bytes;
      if (i < n && r[i] == t)
        std::memcpy(row, in + static_cast<size_t>(i++) * bytes, bytes);
      else
        std::memset(row, 0, bytes);
    }
  });
}

struct GatherRows : public torch::autograd::Function<GatherRows> {
  // x (R, ...), rows (N,) strictly increasing inside [0, R) -> (N, ...)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& rows) {
    ctx->save_for_backward({rows});  // as a variable: rows changed in place before backward make autograd raise
    ctx->saved_data["sizes"] = x.sizes().vec();
    const auto in = x.contiguous();  // (R, ...)
    auto shape = x.sizes().vec();
    shape[0] = rows.numel();
    auto out = at::empty(shape, x.options());  // (N, ...)
    copy_rows(static_cast<const char*>(in.data_ptr()), rows.data_ptr<int64_t>(), rows.numel(), row_bytes(in),
              static_cast<char*>(out.data_ptr()));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto rows = ctx->get_saved_variables()[0];  // (N,)
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    // create_graph: a composition that is itself differentiable.
    if (torch::autograd::GradMode::is_enabled())
      return {at::zeros(sizes, grads[0].options()).index_copy(0, rows, grads[0]), at::Tensor()};
    const auto g = grads[0].contiguous();     // (N, ...)
    auto gx = at::empty(sizes, g.options());  // (R, ...)
    place_rows_or_zeros(static_cast<const char*>(g.data_ptr()), rows.data_ptr<int64_t>(), rows.numel(), row_bytes(gx),
                        sizes[0], static_cast<char*>(gx.data_ptr()));
    return {gx, at::Tensor()};
  }
};

// (R, ...) whose rows lists[k] hold parts[k] (N_k, ...), by row copies;
// each part's gradient is its rows of the output's, copied back.
struct PlaceRows : public torch::autograd::Function<PlaceRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList parts,
                            const std::vector<at::Tensor>& lists, int64_t R) {
    ctx->saved_data["lists"] = lists;
    auto shape = parts[0].sizes().vec();
    shape[0] = R;
    auto y = at::empty(shape, parts[0].options());  // (R, ...)
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto part = parts[k].contiguous();  // (N_k, ...)
      scatter_rows(static_cast<const char*>(part.data_ptr()), lists[k].data_ptr<int64_t>(), lists[k].numel(),
                   row_bytes(y), static_cast<char*>(y.data_ptr()));
    }
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto lists = ctx->saved_data["lists"].toTensorVector();
    const auto g = grads[0].contiguous();  // (R, ...)
    torch::autograd::variable_list out;
    for (size_t k = 0; k < lists.size(); ++k)
      out.push_back(ctx->needs_input_grad(k) ? gather_rows(g, lists[k]) : at::Tensor());  // (N_k, ...)
    out.emplace_back();                                                                   // lists
    out.emplace_back();                                                                   // R
    return out;
  }
};

// Row copies move raw bytes: a view whose values need a conjugation or
// negation, or a quantized tensor, keeps libtorch's ops.
bool copies_rows(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && t.dim() >= 1 && !t.is_conj() && !t.is_neg() &&
         !t.is_quantized();
}
bool host_index(const at::Tensor& rows) {
  return rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.dim() == 1;
}

}  // namespace

at::Tensor place_rows(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& lists, int64_t R) {
  TORCH_CHECK(!parts.empty() && parts.size() == lists.size(), "place_rows: ", parts.size(), " parts and ", lists.size(),
              " row lists");
  const auto like_first = [&](const at::Tensor& part) {
    return copies_rows(part) && part.scalar_type() == parts[0].scalar_type() &&
           part.sizes().slice(1) == parts[0].sizes().slice(1);
  };
  const auto host_list = [](const at::Tensor& rows) { return host_index(rows) && rows.is_contiguous(); };
  if (host_kernels_enabled() && std::all_of(parts.begin(), parts.end(), like_first) &&
      std::all_of(lists.begin(), lists.end(), host_list)) {
    count_host_kernel();
    return PlaceRows::apply(at::TensorList(parts), lists, R);
  }
  // Not zeroed: every row is some part's (the caller's promise), and zeroing
  // the (R, ...) buffer is a whole extra pass over it (chiar_bench:
  // routed_dct_attn/sparse/2048/256/*).
  auto shape = parts[0].sizes().vec();
  shape[0] = R;
  auto y = at::empty(shape, parts[0].options());  // (R, ...)
  for (size_t k = 0; k < parts.size(); ++k) y.index_copy_(0, lists[k], parts[k]);
  return y;
}

at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& rows) {
  if (host_kernels_enabled() && copies_rows(x) && host_index(rows)) {
    const auto r = rows.contiguous();
    if (rise_within(r, x.size(0))) {
      count_host_kernel();
      return GatherRows::apply(x, r);
    }
  }
  return x.index_select(0, rows);
}

at::Tensor pack_rows(const at::Tensor& values, const RowGroups& g) {
  std::vector<int64_t> shape{g.count, g.width};
  for (int64_t i = 1; i < values.dim(); ++i) shape.push_back(values.size(i));
  auto packed = at::zeros(shape, values.options());
  return packed.index_put({g.group, g.slot}, values);
}

namespace {

// packed[group, slot], whose backward writes each row's gradient into its
// slot: every (group, slot) pair is distinct, so plain stores do, where
// index's own backward accumulates (a serial pass on the CPU;
// docs/performance.md, 'Reading it').
struct UnpackRows : public torch::autograd::Function<UnpackRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& packed, const at::Tensor& group,
                            const at::Tensor& slot) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["slot"] = slot;
    ctx->saved_data["sizes"] = packed.sizes().vec();
    return packed.index({group, slot});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto group = ctx->saved_data["group"].toTensor(), slot = ctx->saved_data["slot"].toTensor();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    auto packed = at::zeros(sizes, grads[0].options()).index_put({group, slot}, grads[0]);
    return {packed, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor unpack_rows(const at::Tensor& packed, const RowGroups& g) {
  return UnpackRows::apply(packed, g.group, g.slot);
}

}  // namespace chiar
