#pragma once
// The floating types the harness's CUDA kernels read and write, named
// without libtorch's headers (nvcc compiles the kernels without them).
namespace chiar::cuda {

enum class Real { F32, BF16, F16 };

}  // namespace chiar::cuda
