#include "reference.h"

#include <cmath>

namespace chiar::test::ref {
namespace {

using Vec = std::vector<double>;

Vec row(const at::Tensor& x2d, int64_t i) {
  auto a = x2d.accessor<double, 2>();
  Vec v(static_cast<size_t>(x2d.size(1)));
  for (int64_t j = 0; j < x2d.size(1); ++j) v[j] = a[i][j];
  return v;
}

Vec affine(const Linear& l, const Vec& x) {
  auto w = l.weight.accessor<double, 2>();
  auto b = l.bias.accessor<double, 1>();
  Vec y(static_cast<size_t>(l.weight.size(0)));
  for (int64_t o = 0; o < l.weight.size(0); ++o) {
    double s = b[o];
    for (int64_t i = 0; i < l.weight.size(1); ++i) s += w[o][i] * x[i];
    y[o] = s;
  }
  return y;
}

Vec norm(const Vec& x, const at::Tensor& weight, const at::Tensor& bias) {
  const double n = static_cast<double>(x.size());
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  auto g = weight.accessor<double, 1>();
  auto b = bias.accessor<double, 1>();
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + 1e-5) * g[i] + b[i];
  return y;
}

// Rotates one head vector u (dh) at position p: pairs (i, i + dh/2).
void rope(double* u, int64_t dh, int64_t p, double base) {
  const int64_t half = dh / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double theta = static_cast<double>(p) * std::pow(base, -2.0 * i / static_cast<double>(dh));
    const double a = u[i], b = u[i + half];
    u[i] = a * std::cos(theta) - b * std::sin(theta);
    u[i + half] = a * std::sin(theta) + b * std::cos(theta);
  }
}

bool allowed(const at::Tensor& valid, int64_t b, int64_t t, int64_t s, bool causal) {
  if (causal && s > t) return false;
  return !valid.defined() || valid[b][s].item<bool>();
}

at::Tensor to_tensor(const std::vector<Vec>& rows, at::IntArrayRef shape) {
  Vec flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat, at::TensorOptions().dtype(at::kDouble)).view(shape);
}

}  // namespace

at::Tensor dct_matrix(int64_t d) {
  auto m = at::empty({d, d}, at::TensorOptions().dtype(at::kDouble));
  auto a = m.accessor<double, 2>();
  for (int64_t k = 0; k < d; ++k)
    for (int64_t n = 0; n < d; ++n) a[k][n] = std::sqrt((k == 0 ? 1.0 : 2.0) / d) * std::cos(M_PI * (n + 0.5) * k / d);
  return m;
}

at::Tensor dct(const at::Tensor& x) {
  auto xd = x.to(at::kDouble).contiguous();
  auto out = at::empty_like(xd);
  auto in = xd.accessor<double, 2>();
  auto o = out.accessor<double, 2>();
  const int64_t d = xd.size(1);
  for (int64_t r = 0; r < xd.size(0); ++r)
    for (int64_t k = 0; k < d; ++k) {
      double s = 0;
      for (int64_t n = 0; n < d; ++n) s += in[r][n] * std::cos(M_PI * (n + 0.5) * k / d);
      o[r][k] = s * std::sqrt((k == 0 ? 1.0 : 2.0) / d);
    }
  return out;
}

at::Tensor entropy(const at::Tensor& x) { return entropy_from_coeffs(dct(x)); }

at::Tensor entropy_from_coeffs(const at::Tensor& coeffs) {
  auto c = coeffs.to(at::kDouble).contiguous();
  auto a = c.accessor<double, 2>();
  const int64_t d = c.size(1);
  auto h = at::zeros({c.size(0)}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t r = 0; r < c.size(0); ++r) {
    double total = 0;
    for (int64_t k = 0; k < d; ++k) total += a[r][k] * a[r][k];
    if (total == 0 || d == 1) continue;
    double s = 0;
    for (int64_t k = 0; k < d; ++k) {
      const double p = a[r][k] * a[r][k] / total;
      if (p > 0) s -= p * std::log(p);
    }
    h[r] = s / std::log(static_cast<double>(d));
  }
  return h;
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  std::vector<Vec> rows;
  for (int64_t i = 0; i < x.size(0); ++i) rows.push_back(norm(row(x, i), weight, bias));
  return to_tensor(rows, x.sizes());
}

at::Tensor attention(const at::Tensor& x, const AttentionWeights& w, bool causal, const at::Tensor& valid) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), h = w.heads, dh = d / h;
  std::vector<Vec> out_rows;
  for (int64_t b = 0; b < B; ++b) {
    auto xb = x[b].contiguous();
    std::vector<Vec> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      q[t] = affine(w.q, row(xb, t));
      const Vec kv = affine(w.kv, row(xb, t));
      k[t].assign(kv.begin(), kv.begin() + d);
      v[t].assign(kv.begin() + d, kv.end());
      if (w.rope)
        for (int64_t j = 0; j < h; ++j) {
          rope(&q[t][j * dh], dh, t, w.rope_base);
          rope(&k[t][j * dh], dh, t, w.rope_base);
        }
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec o(d, 0.0);
      for (int64_t j = 0; j < h; ++j) {
        Vec score(T, -INFINITY);
        double mx = -INFINITY;
        for (int64_t s = 0; s < T; ++s) {
          if (!allowed(valid, b, t, s, causal)) continue;
          double dot = 0;
          for (int64_t i = 0; i < dh; ++i) dot += q[t][j * dh + i] * k[s][j * dh + i];
          score[s] = dot / std::sqrt(static_cast<double>(dh));
          mx = std::max(mx, score[s]);
        }
        double z = 0;
        for (int64_t s = 0; s < T; ++s) z += std::isinf(score[s]) ? 0 : std::exp(score[s] - mx);
        for (int64_t s = 0; s < T; ++s) {
          if (std::isinf(score[s])) continue;
          const double p = std::exp(score[s] - mx) / z;
          for (int64_t i = 0; i < dh; ++i) o[j * dh + i] += p * v[s][j * dh + i];
        }
      }
      Vec y = affine(w.out, o);
      const Vec xt = row(xb, t);
      for (int64_t i = 0; i < d; ++i) y[i] += xt[i];
      out_rows.push_back(norm(y, w.norm_weight, w.norm_bias));
    }
  }
  return to_tensor(out_rows, x.sizes());
}

at::Tensor rbf_quadratic(const at::Tensor& x, const RbfWeights& w, bool causal, const at::Tensor& valid) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), R = w.omega.size(1);
  auto om = w.omega.accessor<double, 2>();
  auto phi = [&](const Vec& u) {
    Vec f(2 * R);
    for (int64_t r = 0; r < R; ++r) {
      double p = 0;
      for (int64_t i = 0; i < d; ++i) p += u[i] * om[i][r];
      f[r] = std::cos(p) / std::sqrt(static_cast<double>(R));
      f[R + r] = std::sin(p) / std::sqrt(static_cast<double>(R));
    }
    return f;
  };
  std::vector<Vec> out_rows;
  for (int64_t b = 0; b < B; ++b) {
    auto xb = x[b].contiguous();
    std::vector<Vec> fq(T), fk(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      fq[t] = phi(affine(w.q, row(xb, t)));
      const Vec kv = affine(w.kv, row(xb, t));
      fk[t] = phi(Vec(kv.begin(), kv.begin() + d));
      v[t].assign(kv.begin() + d, kv.end());
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec num(d, 0.0);
      double den = 0, count = 0;
      for (int64_t s = 0; s < T; ++s) {
        if (!allowed(valid, b, t, s, causal)) continue;
        double a = 0;
        for (int64_t i = 0; i < 2 * R; ++i) a += fq[t][i] * fk[s][i];
        for (int64_t i = 0; i < d; ++i) num[i] += a * v[s][i];
        den += a;
        count += 1;
      }
      const double floor = w.eps * std::max(count, 1.0);
      const double denom = std::max(den, floor);
      for (auto& n : num) n /= denom;
      Vec y = affine(w.out, num);
      const Vec xt = row(xb, t);
      for (int64_t i = 0; i < d; ++i) y[i] += xt[i];
      out_rows.push_back(norm(y, w.norm_weight, w.norm_bias));
    }
  }
  return to_tensor(out_rows, x.sizes());
}

}  // namespace chiar::test::ref
