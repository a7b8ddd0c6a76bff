#pragma once
// The language model head's loss on a GPU, behind a plain C++ interface (raw
// device pointers, a stream): core/chunked_cross_entropy.cpp calls it on each
// block of logits, between the block's forward product and its two gradient
// products. libtorch's way reads and writes the (N, V) logits five or six
// times in fp32 (upcast, log-softmax, its gradient, the downcast); this reads
// a block twice and writes it once, in its own type.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "real_type.h"

namespace chiar::cuda {

// For each row r of the logits x (rows, V), in fp32 whatever their storage:
//   nll[r] = logsumexp(x_r) - x_r[t_r]
// and, when write_grads, the loss's gradient in place of the logits:
//   x_r <- w_r (softmax(x_r) - onehot(t_r))
// A row holding a NaN or an infinity, or whose target lies outside [0, V),
// gets NaN for its nll and every gradient (as the host kernel does).
//   logits  (rows, V) with rows row_stride apart (>= V), on the device
//   targets (rows,) int64; weights (rows,) fp32, read only when write_grads
//   nll     (rows,) fp32
// Arguments out of range return cudaErrorInvalidValue before any launch.
cudaError_t softmax_cross_entropy_rows(void* logits, Real type, int64_t rows, int64_t V, int64_t row_stride,
                                       const int64_t* targets, const float* weights, bool write_grads, float* nll,
                                       cudaStream_t stream);

}  // namespace chiar::cuda
