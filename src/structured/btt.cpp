// Fast BTT projection, forward and backward: stage 1 is one GEMM per row block i over all
// tokens ([B N, b] x [b, H b s]); stage 2 one GEMM per (head, beta) block on the regrouped
// stage-1 output ([B N, a s] x [a s, a]); then LayerNorm over D per head.
// O(B N H D s (a + b)) time. Reference: projection_ref.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "structured/projection_common.h"
#include "structured/structured_ops.h"
#include "subquad/error.h"
#include "subquad/gemm.h"
#include "subquad/parallel.h"
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
        shape_string(shape1), " for D = ", x.dim(2), ", got ", shape_string(w1.shape));
  check(w2.shape == shape2 && w2.is_contiguous(), "w2: expected contiguous shape ",
        shape_string(shape2), ", got ", shape_string(w2.shape));
  const std::array<int64_t, 4> expected{x.dim(0), x.dim(1), H, x.dim(2)};
  check_shape(y, expected, y_name);
}

template <typename T>
struct BttPass {
  int64_t tokens, D, a, b, H, s, width;  // width = H b s
  std::vector<T> x;                      // [tokens, D]
  projection::CappedWeight<T> w1, w2;
  std::vector<T> z;                      // [tokens, a, width]
  std::vector<T> y;                      // [tokens, H, D], before LayerNorm

  BttPass(View3<const T> input, View3<const T> w1_in, View3<const T> w2_in, const BttOptions& o)
      : tokens(input.dim(0) * input.dim(1)), D(input.dim(2)), a(w1_in.dim(0)), b(w1_in.dim(1)),
        H(o.heads), s(o.rank), width(H * b * s) {
    x.resize(static_cast<size_t>(tokens * D));
    for (int64_t t = 0; t < tokens; ++t)
      std::copy(input.row(t / input.dim(1), t % input.dim(1)),
                input.row(t / input.dim(1), t % input.dim(1)) + D, x.data() + t * D);
    w1 = projection::cap_weight(w1_in.data, w1_in.size(), b, width, o.rms_cap);
    w2 = projection::cap_weight(w2_in.data, w2_in.size(), a * s, a, o.rms_cap);
    z.resize(static_cast<size_t>(tokens * a * width));
    y.resize(static_cast<size_t>(tokens * H * D));
    for (int64_t i = 0; i < a; ++i)
      gemm(Transpose::no, Transpose::no, tokens, width, b, T(1), x.data() + i * b, D,
           w1.values.data() + i * b * width, width, T(0), z.data() + i * width, a * width);
    std::vector<T> packed(static_cast<size_t>(tokens * a * s)), out(static_cast<size_t>(tokens * a));
    for (int64_t hb = 0; hb < H * b; ++hb) {
      gather(hb, packed.data());
      gemm(Transpose::no, Transpose::yes, tokens, a, a * s, T(1), packed.data(), a * s,
           w2.values.data() + hb * a * a * s, a * s, T(0), out.data(), a);
      const int64_t h = hb / b, beta = hb % b;
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t alpha = 0; alpha < a; ++alpha)
          y[(t * H + h) * D + alpha * b + beta] = out[t * a + alpha];
    }
  }

  // packed [tokens, a s] = Z[t, i, hb s + sigma]: the stage-2 input of block (h, beta).
  void gather(int64_t hb, T* packed) const {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < a; ++i)
        std::copy(z.data() + (t * a + i) * width + hb * s, z.data() + (t * a + i) * width + (hb + 1) * s,
                  packed + (t * a + i) * s);
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
  BttPass<T> pass(x, w1, w2, options);
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
  check(dx.shape == x.shape, "dx: expected shape ", shape_string(x.shape), ", got ",
        shape_string(dx.shape));
  check(dw1.shape == w1.shape && dw1.is_contiguous(), "dw1: expected contiguous shape ",
        shape_string(w1.shape), ", got ", shape_string(dw1.shape));
  check(dw2.shape == w2.shape && dw2.is_contiguous(), "dw2: expected contiguous shape ",
        shape_string(w2.shape), ", got ", shape_string(dw2.shape));
  dispatch(context, projection::BttBackwardParams<T>{x, w1, w2, dy, options, dx, dw1, dw2});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const projection::BttBackwardParams<T>& params) {
  const View3<const T> x = params.x, w1 = params.w1, w2 = params.w2;
  const View4<const T> dy = params.dy;
  const BttOptions& options = params.options;
  const View3<T> dx = params.dx, dw1 = params.dw1, dw2 = params.dw2;
  BttPass<T> pass(x, w1, w2, options);
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
  // Stage 2 per (h, beta): dZ_hb = dY_hb W2'_hb, dW2'_hb = dY_hb^T Z_hb.
  std::vector<T> dz(pass.z.size()), packed(static_cast<size_t>(tokens * a * s)),
      dpacked(packed.size()), dout(static_cast<size_t>(tokens * a));
  for (int64_t hb = 0; hb < H * b; ++hb) {
    const int64_t h = hb / b, beta = hb % b;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t alpha = 0; alpha < a; ++alpha)
        dout[t * a + alpha] = grad[(t * H + h) * D + alpha * b + beta];
    pass.gather(hb, packed.data());
    gemm(Transpose::no, Transpose::no, tokens, a * s, a, T(1), dout.data(), a,
         pass.w2.values.data() + hb * a * a * s, a * s, T(0), dpacked.data(), a * s);
    gemm(Transpose::yes, Transpose::no, a, a * s, tokens, T(1), dout.data(), a, packed.data(),
         a * s, T(0), dw2.data + hb * a * a * s, a * s);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < a; ++i)
        std::copy(dpacked.data() + (t * a + i) * s, dpacked.data() + (t * a + i + 1) * s,
                  dz.data() + (t * a + i) * width + hb * s);
  }
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
