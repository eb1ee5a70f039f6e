// Naive bilinear MLR and BTT projections, forward and backward, templated on float/double:
// per-token loops straight from the formulas of structured.h (capping and LayerNorm
// included). The reference for bilinear_mlr.cpp and btt.cpp. O(B N H D (block size)).
#pragma once

#include <cstdint>
#include <vector>

#include "structured/projection_common.h"
#include "subquad/structured.h"

namespace subquad {

// ---- bilinear MLR ----------------------------------------------------------------------

template <typename T>
void bilinear_mlr_reference_forward(View3<const T> x, const std::vector<View3<const T>>& weights,
                                    const BilinearMlrOptions& options, View4<T> y) {
  const int64_t B = x.dim(0), N = x.dim(1), Dm = x.dim(2), H = options.heads;
  int64_t offset = 0;
  for (size_t l = 0; l < options.ranks.size(); ++l) {
    const int64_t p = int64_t{1} << l, m = Dm / p, r = options.ranks[l];
    const T scale = options.level_scale.empty() ? T(1) : T(options.level_scale[l]);
    const auto cap = projection::cap_weight(weights[l].data, p * m * H * r, m, H * r,
                                            options.rms_cap);
    const T* w = cap.values.data();  // [p, m, H r]
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h) {
          T* out = y.row(b, n, h) + offset;  // [p r]
          for (int64_t k = 0; k < p; ++k)
            for (int64_t j = 0; j < r; ++j) {
              T u = 0;
              for (int64_t i = 0; i < m; ++i) u += x(b, n, k * m + i) * w[(k * m + i) * H * r + h * r + j];
              out[k * r + j] = u;
            }
          if (options.layer_norm)
            projection::layer_norm(out, p * r, 1, scale);
          else
            for (int64_t c = 0; c < p * r; ++c) out[c] *= scale;
        }
    offset += p * r;
  }
}

// Backward: y_l = s LN(u_l) (or s u_l), u_l[k r + j] = sum_i x[k m + i] W'[k, i, h r + j]:
//   du = LN backward of s dy, dx[k m + i] += sum_{h, j} du W', dW' += x du^T, dW from dW'
//   through the capping.
template <typename T>
void bilinear_mlr_reference_backward(View3<const T> x, const std::vector<View3<const T>>& weights,
                                     View4<const T> dy, const BilinearMlrOptions& options,
                                     View3<T> dx, const std::vector<View3<T>>& dweights) {
  const int64_t B = x.dim(0), N = x.dim(1), Dm = x.dim(2), H = options.heads;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < Dm; ++c) dx(b, n, c) = 0;
  int64_t offset = 0;
  for (size_t l = 0; l < options.ranks.size(); ++l) {
    const int64_t p = int64_t{1} << l, m = Dm / p, r = options.ranks[l], size = p * m * H * r;
    const T scale = options.level_scale.empty() ? T(1) : T(options.level_scale[l]);
    const auto cap = projection::cap_weight(weights[l].data, size, m, H * r, options.rms_cap);
    const T* w = cap.values.data();
    std::vector<T> dw(static_cast<size_t>(size), T(0)), u(static_cast<size_t>(p * r)),
        du(u.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t k = 0; k < p; ++k)
            for (int64_t j = 0; j < r; ++j) {
              T acc = 0;
              for (int64_t i = 0; i < m; ++i) acc += x(b, n, k * m + i) * w[(k * m + i) * H * r + h * r + j];
              u[k * r + j] = acc;
            }
          const T* g = dy.row(b, n, h) + offset;
          for (int64_t c = 0; c < p * r; ++c) du[c] = g[c];
          if (options.layer_norm) {
            const T inv_std = projection::layer_norm(u.data(), p * r, 1, scale);
            projection::layer_norm_backward(u.data(), du.data(), p * r, 1, scale, inv_std);
          } else {
            for (int64_t c = 0; c < p * r; ++c) du[c] *= scale;
          }
          for (int64_t k = 0; k < p; ++k)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < r; ++j) {
                const int64_t wi = (k * m + i) * H * r + h * r + j;
                dx(b, n, k * m + i) += du[k * r + j] * w[wi];
                dw[wi] += x(b, n, k * m + i) * du[k * r + j];
              }
        }
    projection::cap_weight_backward(weights[l].data, size, cap, dw.data());
    std::copy(dw.begin(), dw.end(), dweights[l].data);
    offset += p * r;
  }
}

// ---- BTT -------------------------------------------------------------------------------

// One token: x [D] -> y [H, D] (before LayerNorm), with capped w1 [a, b, H b s] and
// w2 [H b, a, a s]; z receives the stage-1 output [a, H b s].
template <typename T>
void btt_reference_token(const T* x, const T* w1, const T* w2, int64_t a, int64_t b,
                         int64_t H, int64_t s, T* z, T* y) {
  const int64_t width = H * b * s;
  for (int64_t i = 0; i < a; ++i)
    for (int64_t col = 0; col < width; ++col) {
      T acc = 0;
      for (int64_t j = 0; j < b; ++j) acc += x[i * b + j] * w1[(i * b + j) * width + col];
      z[i * width + col] = acc;
    }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t beta = 0; beta < b; ++beta)
      for (int64_t alpha = 0; alpha < a; ++alpha) {
        T acc = 0;
        for (int64_t i = 0; i < a; ++i)
          for (int64_t sigma = 0; sigma < s; ++sigma)
            acc += w2[((h * b + beta) * a + alpha) * a * s + i * s + sigma] *
                   z[i * width + (h * b + beta) * s + sigma];
        y[h * a * b + alpha * b + beta] = acc;
      }
}

template <typename T>
void btt_reference_forward(View3<const T> x, View3<const T> w1, View3<const T> w2,
                           const BttOptions& options, View4<T> y) {
  const int64_t B = x.dim(0), N = x.dim(1), D = x.dim(2), H = options.heads, s = options.rank;
  const int64_t a = w1.dim(0), b = w1.dim(1);
  const auto cap1 = projection::cap_weight(w1.data, w1.size(), b, H * b * s, options.rms_cap);
  const auto cap2 = projection::cap_weight(w2.data, w2.size(), a * s, a, options.rms_cap);
  std::vector<T> z(static_cast<size_t>(a * H * b * s)), out(static_cast<size_t>(H * D));
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t n = 0; n < N; ++n) {
      btt_reference_token(x.row(bb, n), cap1.values.data(), cap2.values.data(), a, b, H, s,
                          z.data(), out.data());
      for (int64_t h = 0; h < H; ++h) {
        if (options.layer_norm) projection::layer_norm(out.data() + h * D, D, 1, T(1));
        std::copy(out.begin() + h * D, out.begin() + (h + 1) * D, y.row(bb, n, h));
      }
    }
}

// Backward: dY = LN backward of dy; stage 2: dZ[i, (h, beta, sigma)] = sum_alpha
// W2'[(h, beta), alpha, (i, sigma)] dY[h, beta, alpha], dW2' += dY Z; stage 1:
// dx[i b + j] = sum_col W1'[i, j, col] dZ[i, col], dW1' += x dZ; then through the capping.
template <typename T>
void btt_reference_backward(View3<const T> x, View3<const T> w1, View3<const T> w2,
                            View4<const T> dy, const BttOptions& options, View3<T> dx,
                            View3<T> dw1, View3<T> dw2) {
  const int64_t B = x.dim(0), N = x.dim(1), D = x.dim(2), H = options.heads, s = options.rank;
  const int64_t a = w1.dim(0), b = w1.dim(1), width = H * b * s;
  const auto cap1 = projection::cap_weight(w1.data, w1.size(), b, width, options.rms_cap);
  const auto cap2 = projection::cap_weight(w2.data, w2.size(), a * s, a, options.rms_cap);
  const T* v1 = cap1.values.data();
  const T* v2 = cap2.values.data();
  std::vector<T> g1(static_cast<size_t>(w1.size()), T(0)), g2(static_cast<size_t>(w2.size()), T(0));
  std::vector<T> z(static_cast<size_t>(a * width)), dz(z.size()), out(static_cast<size_t>(H * D)),
      dout(out.size());
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t n = 0; n < N; ++n) {
      const T* xt = x.row(bb, n);
      btt_reference_token(xt, v1, v2, a, b, H, s, z.data(), out.data());
      for (int64_t h = 0; h < H; ++h) {
        std::copy(dy.row(bb, n, h), dy.row(bb, n, h) + D, dout.begin() + h * D);
        if (options.layer_norm) {
          const T inv_std = projection::layer_norm(out.data() + h * D, D, 1, T(1));
          projection::layer_norm_backward(out.data() + h * D, dout.data() + h * D, D, 1, T(1),
                                          inv_std);
        }
      }
      std::fill(dz.begin(), dz.end(), T(0));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t beta = 0; beta < b; ++beta)
          for (int64_t alpha = 0; alpha < a; ++alpha) {
            const T g = dout[h * D + alpha * b + beta];
            for (int64_t i = 0; i < a; ++i)
              for (int64_t sigma = 0; sigma < s; ++sigma) {
                const int64_t wi = ((h * b + beta) * a + alpha) * a * s + i * s + sigma;
                const int64_t zi = i * width + (h * b + beta) * s + sigma;
                dz[zi] += v2[wi] * g;
                g2[wi] += z[zi] * g;
              }
          }
      T* dxt = dx.row(bb, n);
      for (int64_t i = 0; i < a; ++i)
        for (int64_t j = 0; j < b; ++j) {
          T acc = 0;
          for (int64_t col = 0; col < width; ++col) {
            acc += v1[(i * b + j) * width + col] * dz[i * width + col];
            g1[(i * b + j) * width + col] += xt[i * b + j] * dz[i * width + col];
          }
          dxt[i * b + j] = acc;
        }
    }
  projection::cap_weight_backward(w1.data, w1.size(), cap1, g1.data());
  projection::cap_weight_backward(w2.data, w2.size(), cap2, g2.data());
  std::copy(g1.begin(), g1.end(), dw1.data);
  std::copy(g2.begin(), g2.end(), dw2.data);
}

}  // namespace subquad
