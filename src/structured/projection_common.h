// Pieces shared by the bilinear MLR and BTT projections (fast paths and references):
// weight RMS capping W' = g W, g = 1 / max(1, rms(W) / c), and LayerNorm without affine,
// each with its backward. O(size) each.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "subquad/structured.h"

namespace subquad::projection {

inline constexpr double kRmsEpsilon = 1e-8;   // inside the rms, as in the authors' code
inline constexpr double kLayerNormEpsilon = 1e-5;

// The capped copy of w [n] (the factor g is 1 when disabled or when rms <= c).
template <typename T>
struct CappedWeight {
  std::vector<T> values;
  double gain = 1.0;   // g
  double rms = 0.0;
  bool capped = false;  // rms > c: g = c / rms depends on W
};

template <typename T>
CappedWeight<T> cap_weight(const T* w, int64_t n, int64_t fan_in, int64_t fan_out, bool enable) {
  CappedWeight<T> result;
  result.values.assign(w, w + n);
  if (!enable) return result;
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += double(w[i]) * double(w[i]);
  result.rms = std::sqrt(squares / double(n) + kRmsEpsilon);
  const double limit = rms_cap_limit(fan_in, fan_out);
  if (result.rms > limit) {
    result.capped = true;
    result.gain = limit / result.rms;
    for (T& x : result.values) x = static_cast<T>(x * result.gain);
  }
  return result;
}

// dW from dW' (grad [n], in place) through W' = g(W) W. With g = c / rms:
//   dW = g dW' - g (sum W * dW') W / (n rms^2).
template <typename T>
void cap_weight_backward(const T* w, int64_t n, const CappedWeight<T>& cap, T* grad) {
  if (!cap.capped) return;
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += double(w[i]) * double(grad[i]);
  const double correction = cap.gain * dot / (double(n) * cap.rms * cap.rms);
  for (int64_t i = 0; i < n; ++i)
    grad[i] = static_cast<T>(cap.gain * grad[i] - correction * w[i]);
}

// In place over x [n] (strided by `stride`): x <- (x - mean) / sqrt(var + eps) * scale.
// Returns 1 / sqrt(var + eps) for the backward.
template <typename T>
T layer_norm(T* x, int64_t n, int64_t stride, T scale) {
  T mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i * stride];
  mean /= static_cast<T>(n);
  T var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i * stride] - mean) * (x[i * stride] - mean);
  var /= static_cast<T>(n);
  const T inv_std = T(1) / std::sqrt(var + static_cast<T>(kLayerNormEpsilon));
  for (int64_t i = 0; i < n; ++i) x[i * stride] = (x[i * stride] - mean) * inv_std * scale;
  return inv_std;
}

// Backward of y = scale * xhat, xhat = (x - mean) * inv_std, given y and dy (both strided,
// y is read, dy is overwritten with dx):
//   dx = inv_std (g - mean(g) - xhat mean(g xhat)),  g = scale dy.
template <typename T>
void layer_norm_backward(const T* y, T* dy, int64_t n, int64_t stride, T scale, T inv_std) {
  T mean_g = 0, mean_gx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T g = scale * dy[i * stride], xhat = y[i * stride] / scale;
    mean_g += g;
    mean_gx += g * xhat;
  }
  mean_g /= static_cast<T>(n);
  mean_gx /= static_cast<T>(n);
  for (int64_t i = 0; i < n; ++i) {
    const T g = scale * dy[i * stride], xhat = y[i * stride] / scale;
    dy[i * stride] = inv_std * (g - mean_g - xhat * mean_gx);
  }
}

}  // namespace subquad::projection
