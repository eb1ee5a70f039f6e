// Fast BTT projection, forward and backward: stage 1 is one GEMM per row block i over all
// tokens ([B N, b] x [b, H b s]); stage 2, a batch of H b tiny [a, a s] matrices per token,
// runs as loops vectorised along beta over a transposed copy of W2 (GEMMs of width a were
// overhead-bound); then LayerNorm over D per head. O(B N H D s (a + b)) time.
// Reference: projection_ref.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gemm.h"
#include "common/parallel.h"
#include "structured/projection_common.h"
#include "structured/structured_ops.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {

BttFactors btt_factors(int64_t dim) {
  check(dim >= 2, "dim: expected >= 2 for a BTT factorisation, got ", dim);
  // The smallest divisor b with b^2 > dim, as dim / a for the largest divisor a with a^2 < dim:
  // an O(sqrt(dim)) scan, bounded so that it finishes at once.
  constexpr int64_t kMaxDim = int64_t(1) << 40;
  check(dim <= kMaxDim, "dim: expected at most ", kMaxDim, ", got ", dim);
  int64_t a = 1;
  while ((a + 1) * (a + 1) < dim) ++a;
  for (; a > 1; --a)
    if (dim % a == 0) return {a, dim / a};
  return {1, dim};
}

namespace {

template <typename T>
void check_arguments(View3<const T> x, View3<const T> w1, View3<const T> w2,
                     const BttOptions& options, View4<const T> y, const char* y_name) {
  check_view(x, "x");
  check_view(w1, "w1");
  check_view(w2, "w2");
  check_view(y, y_name);
  check(options.heads >= 1, "heads: expected >= 1, got ", options.heads);
  check(options.rank >= 1, "rank: expected >= 1, got ", options.rank);
  const BttFactors f = btt_factors(x.dim(2));
  const int64_t H = options.heads, s = options.rank;
  const std::array<int64_t, 3> shape1{f.a, f.b, H * f.b * s}, shape2{H * f.b, f.a, f.a * s};
  check(w1.shape == shape1 && w1.is_contiguous(), "w1: expected contiguous shape ",
        shape_text(shape1), " for D = ", x.dim(2), ", got ", shape_text(w1.shape));
  check(w2.shape == shape2 && w2.is_contiguous(), "w2: expected contiguous shape ",
        shape_text(shape2), ", got ", shape_text(w2.shape));
  const std::array<int64_t, 4> expected{x.dim(0), x.dim(1), H, x.dim(2)};
  check_shape(y, expected, y_name);
}

// W2'^T laid out [(i, sigma), alpha, (h, beta)] from w2 [(h, beta), alpha, (i, sigma)], so
// that stage 2 reads b consecutive weights per (i, sigma, alpha, h).
template <typename T>
std::vector<T> transpose_w2(const T* w2, int64_t hb_count, int64_t a, int64_t as) {
  std::vector<T> t(static_cast<size_t>(as * a * hb_count));
  for (int64_t hb = 0; hb < hb_count; ++hb)
    for (int64_t alpha = 0; alpha < a; ++alpha)
      for (int64_t k = 0; k < as; ++k) t[(k * a + alpha) * hb_count + hb] = w2[(hb * a + alpha) * as + k];
  return t;
}

template <typename T>
struct BttPass {
  int64_t tokens, D, a, b, H, s, width;  // width = H b s
  std::vector<T> x;                      // [tokens, D]
  projection::CappedWeight<T> w1, w2;
  std::vector<T> w2t;                    // [a s, a, H b]: W2' transposed (transpose_w2)
  std::vector<T> z;                      // [tokens, a, width]
  std::vector<T> y;                      // [tokens, H, D], before LayerNorm

  BttPass(const Context& context, View3<const T> input, View3<const T> w1_in,
          View3<const T> w2_in, const BttOptions& o)
      : tokens(input.dim(0) * input.dim(1)), D(input.dim(2)), a(w1_in.dim(0)), b(w1_in.dim(1)),
        H(o.heads), s(o.rank), width(H * b * s) {
    x.resize(static_cast<size_t>(tokens * D));
    for (int64_t t = 0; t < tokens; ++t)
      std::copy(input.row(t / input.dim(1), t % input.dim(1)),
                input.row(t / input.dim(1), t % input.dim(1)) + D, x.data() + t * D);
    w1 = projection::cap_weight(w1_in.data, w1_in.size(), b, width, o.rms_cap);
    w2 = projection::cap_weight(w2_in.data, w2_in.size(), a * s, a, o.rms_cap);
    w2t = transpose_w2(w2.values.data(), H * b, a, a * s);
    z.resize(static_cast<size_t>(tokens * a * width));
    y.assign(static_cast<size_t>(tokens * H * D), T(0));
    for (int64_t i = 0; i < a; ++i)
      gemm(Transpose::no, Transpose::no, tokens, width, b, T(1), x.data() + i * b, D,
           w1.values.data() + i * b * width, width, T(0), z.data() + i * width, a * width);
    // y[t, h, alpha b + beta] = sum_{i, sigma} W2'[(h, beta), alpha, (i, sigma)]
    //                                           Z[t, i, (h b + beta) s + sigma].
    parallel_for(context, tokens, [&](int64_t t) {
      const T* zt = z.data() + t * a * width;
      T* yt = y.data() + t * H * D;
      for (int64_t k = 0; k < a * s; ++k) {
        const T* zk = zt + (k / s) * width + k % s;  // zk[hb s]
        for (int64_t alpha = 0; alpha < a; ++alpha) {
          const T* wk = w2t.data() + (k * a + alpha) * H * b;  // wk[hb]
          for (int64_t h = 0; h < H; ++h) {
            T* out = yt + h * D + alpha * b;
            const T* zh = zk + h * b * s;
            const T* wh = wk + h * b;
            for (int64_t beta = 0; beta < b; ++beta) out[beta] += wh[beta] * zh[beta * s];
          }
        }
      }
    });
  }
};

}  // namespace

template <typename T>
void btt_project_forward(const Context& context, View3<const T> x, View3<const T> w1,
                         View3<const T> w2, const BttOptions& options, View4<T> y) {
  check_arguments(x, w1, w2, options, View4<const T>(y), "y");
  dispatch(context, projection::BttForwardParams<T>{x, w1, w2, options, y});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const projection::BttForwardParams<T>& params) {
  const View3<const T> x = params.x, w1 = params.w1, w2 = params.w2;
  const BttOptions& options = params.options;
  const View4<T> y = params.y;
  BttPass<T> pass(context, x, w1, w2, options);
  const int64_t N = x.dim(1), H = options.heads, D = pass.D;
  parallel_for(context, pass.tokens, [&](int64_t t) {
    for (int64_t h = 0; h < H; ++h) {
      T* row = pass.y.data() + (t * H + h) * D;
      if (options.layer_norm) projection::layer_norm(row, D, 1, T(1));
      std::copy(row, row + D, y.row(t / N, t % N, h));
    }
  });
}

template void run<float>(Backend, const Context&, const projection::BttForwardParams<float>&);
template void run<double>(Backend, const Context&, const projection::BttForwardParams<double>&);

}  // namespace cpu

template <typename T>
void btt_project_backward(const Context& context, View3<const T> x, View3<const T> w1,
                          View3<const T> w2, View4<const T> dy, const BttOptions& options,
                          View3<T> dx, View3<T> dw1, View3<T> dw2) {
  check_arguments(x, w1, w2, options, dy, "dy");
  check_view(dx, "dx");
  check(dx.shape == x.shape, "dx: expected shape ", shape_text(x.shape), ", got ",
        shape_text(dx.shape));
  check(dw1.shape == w1.shape && dw1.is_contiguous(), "dw1: expected contiguous shape ",
        shape_text(w1.shape), ", got ", shape_text(dw1.shape));
  check(dw2.shape == w2.shape && dw2.is_contiguous(), "dw2: expected contiguous shape ",
        shape_text(w2.shape), ", got ", shape_text(dw2.shape));
  dispatch(context, projection::BttBackwardParams<T>{x, w1, w2, dy, options, dx, dw1, dw2});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const projection::BttBackwardParams<T>& params) {
  const View3<const T> x = params.x, w1 = params.w1, w2 = params.w2;
  const View4<const T> dy = params.dy;
  const BttOptions& options = params.options;
  const View3<T> dx = params.dx, dw1 = params.dw1, dw2 = params.dw2;
  BttPass<T> pass(context, x, w1, w2, options);
  const int64_t N = x.dim(1), H = options.heads, D = pass.D, tokens = pass.tokens;
  const int64_t a = pass.a, b = pass.b, s = pass.s, width = pass.width;
  // dY [tokens, H, D]: dy through the LayerNorm (y recomputed by the pass).
  std::vector<T> grad(static_cast<size_t>(tokens * H * D));
  parallel_for(context, tokens, [&](int64_t t) {
    for (int64_t h = 0; h < H; ++h) {
      T* row = pass.y.data() + (t * H + h) * D;
      T* g = grad.data() + (t * H + h) * D;
      std::copy(dy.row(t / N, t % N, h), dy.row(t / N, t % N, h) + D, g);
      if (options.layer_norm) {
        const T inv_std = projection::layer_norm(row, D, 1, T(1));
        projection::layer_norm_backward(row, g, D, 1, T(1), inv_std);
      }
    }
  });
  // Stage 2, per token and (h, beta): dZ = dY W2', dW2' = sum over tokens of dY^T Z; the
  // weight gradient is accumulated transposed, one (i, sigma) row per task.
  const int64_t hb_count = H * b;
  std::vector<T> dz(pass.z.size(), T(0)), dw2t(pass.w2t.size(), T(0));
  parallel_for(context, tokens, [&](int64_t t) {
    const T* gt = grad.data() + t * H * D;
    T* dzt = dz.data() + t * a * width;
    for (int64_t k = 0; k < a * s; ++k) {
      T* dzk = dzt + (k / s) * width + k % s;
      for (int64_t alpha = 0; alpha < a; ++alpha) {
        const T* wk = pass.w2t.data() + (k * a + alpha) * hb_count;
        for (int64_t h = 0; h < H; ++h) {
          const T* gh = gt + h * D + alpha * b;
          const T* wh = wk + h * b;
          T* dzh = dzk + h * b * s;
          for (int64_t beta = 0; beta < b; ++beta) dzh[beta * s] += gh[beta] * wh[beta];
        }
      }
    }
  });
  parallel_for(context, a * s, [&](int64_t k) {
    for (int64_t t = 0; t < tokens; ++t) {
      const T* gt = grad.data() + t * H * D;
      const T* zk = pass.z.data() + t * a * width + (k / s) * width + k % s;
      for (int64_t alpha = 0; alpha < a; ++alpha) {
        T* dwk = dw2t.data() + (k * a + alpha) * hb_count;
        for (int64_t h = 0; h < H; ++h) {
          const T* gh = gt + h * D + alpha * b;
          const T* zh = zk + h * b * s;
          T* dwh = dwk + h * b;
          for (int64_t beta = 0; beta < b; ++beta) dwh[beta] += gh[beta] * zh[beta * s];
        }
      }
    }
  });
  for (int64_t hb = 0; hb < hb_count; ++hb)
    for (int64_t alpha = 0; alpha < a; ++alpha)
      for (int64_t k = 0; k < a * s; ++k)
        dw2.data[(hb * a + alpha) * a * s + k] = dw2t[(k * a + alpha) * hb_count + hb];
  // Stage 1 per row block i: dX_i = dZ_i W1'_i^T, dW1'_i = X_i^T dZ_i.
  std::vector<T> dpx(static_cast<size_t>(tokens * D));
  for (int64_t i = 0; i < a; ++i) {
    gemm(Transpose::no, Transpose::yes, tokens, b, width, T(1), dz.data() + i * width, a * width,
         pass.w1.values.data() + i * b * width, width, T(0), dpx.data() + i * b, D);
    gemm(Transpose::yes, Transpose::no, b, width, tokens, T(1), pass.x.data() + i * b, D,
         dz.data() + i * width, a * width, T(0), dw1.data + i * b * width, width);
  }
  projection::cap_weight_backward(w1.data, w1.size(), pass.w1, dw1.data);
  projection::cap_weight_backward(w2.data, w2.size(), pass.w2, dw2.data);
  for (int64_t t = 0; t < tokens; ++t)
    std::copy(dpx.data() + t * D, dpx.data() + (t + 1) * D, dx.row(t / N, t % N));
}

template void run<float>(Backend, const Context&, const projection::BttBackwardParams<float>&);
template void run<double>(Backend, const Context&, const projection::BttBackwardParams<double>&);

}  // namespace cpu

#define SUBQUAD_INSTANTIATE(T)                                                                  \
  template void btt_project_forward<T>(const Context&, View3<const T>, View3<const T>,          \
                                       View3<const T>, const BttOptions&, View4<T>);            \
  template void btt_project_backward<T>(const Context&, View3<const T>, View3<const T>,         \
                                        View3<const T>, View4<const T>, const BttOptions&,      \
                                        View3<T>, View3<T>, View3<T>);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad
