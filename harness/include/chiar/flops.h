#pragma once
#include <cstdint>

namespace chiar {

// Floating-point operations of one call, a multiply-add counted as 2.
// backward covers the gradients of that call (inputs and parameters).
struct FlopCount {
  int64_t forward = 0;
  int64_t backward = 0;

  int64_t total() const { return forward + backward; }
  FlopCount& operator+=(const FlopCount& o) {
    forward += o.forward;
    backward += o.backward;
    return *this;
  }
  FlopCount& operator-=(const FlopCount& o) {
    forward -= o.forward;
    backward -= o.backward;
    return *this;
  }
  friend FlopCount operator+(FlopCount a, const FlopCount& b) { return a += b; }
  friend FlopCount operator-(FlopCount a, const FlopCount& b) { return a -= b; }
  friend FlopCount operator*(FlopCount a, int64_t k) {
    a.forward *= k;
    a.backward *= k;
    return a;
  }
  friend bool operator==(const FlopCount& a, const FlopCount& b) {
    return a.forward == b.forward && a.backward == b.backward;
  }
};

// FLOPs of x(m,k) @ w(k,n) forward and of its gradients (input and weight).
inline FlopCount matmul_flops(int64_t m, int64_t k, int64_t n, bool weight_grad = true) {
  const int64_t f = 2 * m * k * n;
  return {f, weight_grad ? 2 * f : f};
}

}  // namespace chiar
