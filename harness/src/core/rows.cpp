#include "chiar/rows.h"

#include <ATen/ATen.h>

namespace chiar {

RowGroups group_rows(const at::Tensor& key) {
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

at::Tensor pack_rows(const at::Tensor& values, const RowGroups& g) {
  std::vector<int64_t> shape{g.count, g.width};
  for (int64_t i = 1; i < values.dim(); ++i) shape.push_back(values.size(i));
  auto packed = at::zeros(shape, values.options());
  return packed.index_put({g.group, g.slot}, values);
}

at::Tensor unpack_rows(const at::Tensor& packed, const RowGroups& g) {
  return packed.index({g.group, g.slot});
}

}  // namespace chiar
