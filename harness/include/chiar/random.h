#pragma once
// A small, fully specified generator (SplitMix64) so that data order and
// generated data are byte-identical on every machine and standard library.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace chiar {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  // A stream for (seed, a, b): independent draws per epoch, per example, etc.
  SplitMix64(uint64_t seed, uint64_t a, uint64_t b = 0)
      : state_(SplitMix64(SplitMix64(seed ^ 0x9E3779B97F4A7C15ULL).next() ^ a).next() ^ b) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), without modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }
  // Uniform in [lo, hi], inclusive.
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo + 1)));
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

  // 0..n-1 in random order (Fisher-Yates).
  std::vector<int64_t> permutation(int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[i] = i;
    for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[below(static_cast<uint64_t>(i + 1))]);
    return p;
  }

 private:
  uint64_t state_;
};

// 64-bit FNV-1a of text, chained through seed: cache keys and de-duplication.
inline uint64_t fnv1a(const std::string& text, uint64_t seed = 1469598103934665603ULL) {
  uint64_t h = seed;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace chiar
