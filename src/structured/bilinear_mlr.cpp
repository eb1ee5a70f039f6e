// Fast bilinear MLR projection, forward and backward: per level and feature block one GEMM
// over all tokens ([B N, m_l] x [m_l, H r_l]), then per-(token, head, level) LayerNorm.
// O(B N Dm H sum_l r_l) time. Reference: projection_ref.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gemm.h"
#include "common/parallel.h"
#include "structured/projection_common.h"
#include "structured/structured_ops.h"
#include "subquad/checked_size.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {

// Level ranks r_1 .. r_L: at least one level, each >= 1, few enough levels that 2^(L-1)
// stays a size, and sum_l r_l 2^(l-1) within int64.
void check_bilinear_ranks(const std::vector<int64_t>& ranks) {
  check(!ranks.empty() && ranks.size() <= 62, "ranks: expected 1 to 62 levels, got ",
        ranks.size());
  int64_t dim = 0;
  for (size_t l = 0; l < ranks.size(); ++l) {
    check(ranks[l] >= 1, "ranks: expected every rank >= 1, got ", ranks[l], " at level ", l + 1);
    dim = checked_add(dim, checked_mul(ranks[l], int64_t{1} << l, "ranks"), "ranks");
  }
}

double rms_cap_limit(int64_t fan_in, int64_t fan_out) {
  check(fan_in >= 1, "fan_in: expected >= 1, got ", fan_in);
  check(fan_out >= 1, "fan_out: expected >= 1, got ", fan_out);
  return std::sqrt(static_cast<double>(std::min(fan_in, fan_out))) / static_cast<double>(fan_in);
}

std::vector<double> bilinear_mlr_level_scales(const std::vector<int64_t>& ranks, bool mup) {
  check_bilinear_ranks(ranks);
  std::vector<double> scales;
  for (size_t l = 0; l < ranks.size(); ++l) {
    const double width = static_cast<double>(ranks[l] * (int64_t{1} << l));
    scales.push_back(mup ? 8.0 / width : 1.0 / std::sqrt(width));
  }
  return scales;
}

int64_t bilinear_mlr_output_dim(const std::vector<int64_t>& ranks) {
  check_bilinear_ranks(ranks);
  int64_t dim = 0;
  for (size_t l = 0; l < ranks.size(); ++l) dim += ranks[l] * (int64_t{1} << l);
  return dim;
}

namespace {

template <typename T>
void check_arguments(View3<const T> x, const std::vector<View3<const T>>& weights,
                     const BilinearMlrOptions& options, View4<const T> y, const char* y_name) {
  check_view(x, "x");
  const int64_t L = static_cast<int64_t>(options.ranks.size()), Dm = x.dim(2), H = options.heads;
  check(L >= 1 && L <= 30, "ranks: expected 1 to 30 levels, got ", L);
  check(H >= 1, "heads: expected >= 1, got ", H);
  check(Dm % (int64_t{1} << (L - 1)) == 0, "x: expected a feature dim divisible by 2^(L-1) = ",
        int64_t{1} << (L - 1), ", got ", Dm);
  check(static_cast<int64_t>(weights.size()) == L, "weights: expected one per level (", L,
        "), got ", weights.size());
  check(options.level_scale.empty() || static_cast<int64_t>(options.level_scale.size()) == L,
        "level_scale: expected empty or ", L, " values, got ", options.level_scale.size());
  for (double s : options.level_scale) check(s != 0.0, "level_scale: expected non-zero values");
  for (int64_t l = 0; l < L; ++l) {
    const int64_t p = int64_t{1} << l, r = options.ranks[l];
    if (r < 1) throw_error("ranks: expected every rank >= 1, got ", shape_string(options.ranks));
    check_view(weights[l], "weights[l]");
    check(weights[l].shape == std::array<int64_t, 3>{p, Dm / p, H * r} && weights[l].is_contiguous(),
          "weights[", l, "]: expected contiguous shape ", shape_text(std::array<int64_t, 3>{p, Dm / p, H * r}),
          ", got ", shape_text(weights[l].shape));
  }
  check_view(y, y_name);
  const std::array<int64_t, 4> expected{x.dim(0), x.dim(1), H, bilinear_mlr_output_dim(options.ranks)};
  check_shape(y, expected, y_name);
}

// x [B, N, Dm] (strided) -> contiguous [B N, Dm].
template <typename T>
std::vector<T> pack_rows(View3<const T> x) {
  const int64_t B = x.dim(0), N = x.dim(1), Dm = x.dim(2);
  std::vector<T> packed(static_cast<size_t>(B * N * Dm));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) std::copy(x.row(b, n), x.row(b, n) + Dm, packed.data() + (b * N + n) * Dm);
  return packed;
}

// The level-l features u [B N, H, p r] of every token (before LayerNorm).
template <typename T>
void level_features(const std::vector<T>& x, int64_t tokens, int64_t Dm, const T* w, int64_t p,
                    int64_t r, int64_t H, T* u) {
  const int64_t m = Dm / p, width = H * r;
  std::vector<T> block(static_cast<size_t>(tokens * width));
  for (int64_t k = 0; k < p; ++k) {
    gemm(Transpose::no, Transpose::no, tokens, width, m, T(1), x.data() + k * m, Dm,
         w + k * m * width, width, T(0), block.data(), width);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::copy(block.data() + t * width + h * r, block.data() + t * width + (h + 1) * r,
                  u + (t * H + h) * p * r + k * r);
  }
}

}  // namespace

template <typename T>
void bilinear_mlr_project_forward(const Context& context, View3<const T> x,
                                  const std::vector<View3<const T>>& weights,
                                  const BilinearMlrOptions& options, View4<T> y) {
  check_arguments(x, weights, options, View4<const T>(y), "y");
  dispatch(context, projection::BilinearForwardParams<T>{x, weights, options, y});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const projection::BilinearForwardParams<T>& params) {
  const View3<const T> x = params.x;
  const std::vector<View3<const T>>& weights = params.weights;
  const BilinearMlrOptions& options = params.options;
  const View4<T> y = params.y;
  const int64_t B = x.dim(0), N = x.dim(1), Dm = x.dim(2), H = options.heads, tokens = B * N;
  const std::vector<T> packed = pack_rows(x);
  int64_t offset = 0;
  for (size_t l = 0; l < options.ranks.size(); ++l) {
    const int64_t p = int64_t{1} << l, r = options.ranks[l], width = p * r;
    const T scale = options.level_scale.empty() ? T(1) : T(options.level_scale[l]);
    const auto cap = projection::cap_weight(weights[l].data, weights[l].size(), Dm / p, H * r,
                                            options.rms_cap);
    std::vector<T> u(static_cast<size_t>(tokens * H * width));
    level_features(packed, tokens, Dm, cap.values.data(), p, r, H, u.data());
    parallel_for(context, tokens, [&](int64_t t) {
      for (int64_t h = 0; h < H; ++h) {
        T* row = u.data() + (t * H + h) * width;
        if (options.layer_norm)
          projection::layer_norm(row, width, 1, scale);
        else
          for (int64_t c = 0; c < width; ++c) row[c] *= scale;
        std::copy(row, row + width, y.row(t / N, t % N, h) + offset);
      }
    });
    offset += width;
  }
}

template void run<float>(Backend, const Context&, const projection::BilinearForwardParams<float>&);
template void run<double>(Backend, const Context&, const projection::BilinearForwardParams<double>&);

}  // namespace cpu

template <typename T>
void bilinear_mlr_project_backward(const Context& context, View3<const T> x,
                                   const std::vector<View3<const T>>& weights,
                                   View4<const T> dy, const BilinearMlrOptions& options,
                                   View3<T> dx, const std::vector<View3<T>>& dweights) {
  check_arguments(x, weights, options, dy, "dy");
  check_view(dx, "dx");
  check(dx.shape == x.shape, "dx: expected shape ", shape_text(x.shape), ", got ",
        shape_text(dx.shape));
  check(dweights.size() == weights.size(), "dweights: expected ", weights.size(), " views, got ",
        dweights.size());
  for (size_t l = 0; l < weights.size(); ++l)
    check(dweights[l].shape == weights[l].shape && dweights[l].is_contiguous() && dweights[l].data,
          "dweights[", l, "]: expected contiguous shape ", shape_text(weights[l].shape), ", got ",
          shape_text(dweights[l].shape));
  dispatch(context,
           projection::BilinearBackwardParams<T>{x, weights, dy, options, dx, dweights});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const projection::BilinearBackwardParams<T>& params) {
  const View3<const T> x = params.x;
  const std::vector<View3<const T>>& weights = params.weights;
  const View4<const T> dy = params.dy;
  const BilinearMlrOptions& options = params.options;
  const View3<T> dx = params.dx;
  const std::vector<View3<T>>& dweights = params.dweights;
  const int64_t B = x.dim(0), N = x.dim(1), Dm = x.dim(2), H = options.heads, tokens = B * N;
  const std::vector<T> packed = pack_rows(x);
  std::vector<T> dpacked(packed.size(), T(0));
  int64_t offset = 0;
  for (size_t l = 0; l < options.ranks.size(); ++l) {
    const int64_t p = int64_t{1} << l, r = options.ranks[l], width = p * r, m = Dm / p;
    const int64_t cols = H * r;
    const T scale = options.level_scale.empty() ? T(1) : T(options.level_scale[l]);
    const auto cap = projection::cap_weight(weights[l].data, weights[l].size(), m, cols,
                                            options.rms_cap);
    // du [B N, H, p r]: dy through the scale and LayerNorm (recomputed from u).
    std::vector<T> u(static_cast<size_t>(tokens * H * width)), du(u.size());
    level_features(packed, tokens, Dm, cap.values.data(), p, r, H, u.data());
    parallel_for(context, tokens, [&](int64_t t) {
      for (int64_t h = 0; h < H; ++h) {
        T* row = u.data() + (t * H + h) * width;
        T* grad = du.data() + (t * H + h) * width;
        const T* g = dy.row(t / N, t % N, h) + offset;
        std::copy(g, g + width, grad);
        if (options.layer_norm) {
          const T inv_std = projection::layer_norm(row, width, 1, scale);
          projection::layer_norm_backward(row, grad, width, 1, scale, inv_std);
        } else {
          for (int64_t c = 0; c < width; ++c) grad[c] *= scale;
        }
      }
    });
    // Per feature block k: dU_k [B N, H r]; dX_k += dU_k W'_k^T, dW'_k = X_k^T dU_k.
    T* dw = dweights[l].data;
    std::vector<T> block(static_cast<size_t>(tokens * cols));
    for (int64_t k = 0; k < p; ++k) {
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h = 0; h < H; ++h)
          std::copy(du.data() + (t * H + h) * width + k * r, du.data() + (t * H + h) * width + (k + 1) * r,
                    block.data() + t * cols + h * r);
      gemm(Transpose::no, Transpose::yes, tokens, m, cols, T(1), block.data(), cols,
           cap.values.data() + k * m * cols, cols, T(1), dpacked.data() + k * m, Dm);
      gemm(Transpose::yes, Transpose::no, m, cols, tokens, T(1), packed.data() + k * m, Dm,
           block.data(), cols, T(0), dw + k * m * cols, cols);
    }
    projection::cap_weight_backward(weights[l].data, weights[l].size(), cap, dw);
    offset += width;
  }
  for (int64_t t = 0; t < tokens; ++t)
    std::copy(dpacked.data() + t * Dm, dpacked.data() + (t + 1) * Dm, dx.row(t / N, t % N));
}

template void run<float>(Backend, const Context&, const projection::BilinearBackwardParams<float>&);
template void run<double>(Backend, const Context&, const projection::BilinearBackwardParams<double>&);

}  // namespace cpu

#define SUBQUAD_INSTANTIATE(T)                                                                 \
  template void bilinear_mlr_project_forward<T>(const Context&, View3<const T>,                \
                                                const std::vector<View3<const T>>&,            \
                                                const BilinearMlrOptions&, View4<T>);          \
  template void bilinear_mlr_project_backward<T>(                                              \
      const Context&, View3<const T>, const std::vector<View3<const T>>&, View4<const T>,      \
      const BilinearMlrOptions&, View3<T>, const std::vector<View3<T>>&);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad
