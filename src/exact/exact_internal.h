// Shared by the exact-attention forward and backward: argument checks at the public
// boundary, the sizes of one call and the tile sizes. The packed copies of K and V the
// tile kernels read are in cpu/pack.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/buffer.h"
#include "common/parallel.h"
#include "cpu/convert.h"
#include "cpu/pack.h"
#include "cpu/simd.h"
#include "exact/exact_ref.h"
#include "subquad/context.h"
#include "subquad/exact.h"
#include "subquad/view.h"

namespace subquad::exact_detail {

// The CPU primitives (SIMD vectors, tile products, packing) live in src/cpu/.
using namespace cpu;  // NOLINT: a private namespace of the exact kernels

struct Sizes {
  int64_t B, N, M, H, Hkv, D, Dv, group;
  double scale;
  bool causal;
  int64_t window;
  KeyRange keys(int64_t i) const { return visible_keys(i, N, M, causal, window); }
};

// Validates q, k, v and the options; returns the sizes. Names arguments in messages.
template <typename T>
Sizes check_inputs(View4<const T> q, View4<const T> k, View4<const T> v,
                   const ExactOptions& options) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  Sizes s{};
  s.B = q.dim(0), s.N = q.dim(1), s.H = q.dim(2), s.D = q.dim(3);
  s.M = k.dim(1), s.Hkv = k.dim(2), s.Dv = v.dim(3);
  check(s.D >= 1, "q: head dim D (dimension 3) must be >= 1, got shape ",
        shape_text(q.shape));
  check(s.Hkv >= 1, "k: kv heads Hkv (dimension 2) must be >= 1, got shape ",
        shape_text(k.shape));
  check(s.H % s.Hkv == 0, "q, k: query heads H = ", s.H,
        " must be a multiple of kv heads Hkv = ", s.Hkv);
  check_shape(k, {s.B, s.M, s.Hkv, s.D}, "k (expected [B, M, Hkv, D] from q [B, N, H, D])");
  check_shape(v, {s.B, s.M, s.Hkv, s.Dv}, "v (expected [B, M, Hkv, Dv] matching k)");
  s.group = s.H / s.Hkv;
  s.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(s.D)));
  check(std::isfinite(s.scale) && s.scale > 0, "options.scale: expected a finite value > 0, got ",
        s.scale);
  // The kernels multiply scores by scale log2(e) in T (float for bfloat16): rounded to 0 it
  // would turn masked scores into -inf * 0 = NaN, rounded to inf finite scores into +-inf.
  check(s.scale * kLog2e >= std::numeric_limits<Compute<T>>::min() &&
            s.scale * kLog2e <= std::numeric_limits<Compute<T>>::max(),
        "options.scale: expected scale * log2(e) within the normal range of the input type, "
        "got scale ", s.scale);
  check(options.window >= 0, "options.window: expected >= 0 (0: no window), got ",
        options.window);
  s.causal = options.causal || options.window > 0;
  // A window of M keys already reaches key 0 from every query (the diagonal is at most
  // M - 1); capping it there keeps index arithmetic with the window from overflowing.
  s.window = std::min(options.window, std::max<int64_t>(s.M, 1));
  return s;
}

// The fast path's tile sizes: queries per tile and keys per block (multiples of the tile
// kernel's row group and column chunk), chosen by measurement (README.md).
template <typename T>
struct Blocks {
  static constexpr int64_t kQuery = 192;
  static constexpr int64_t kKey = 48;
  static constexpr int64_t kBackwardKey = 128;
  // The forward reads head-interleaved K and V rows in place up to this many bytes of them
  // (one batch entry, all kv heads: they stay in cache), and contiguous copies beyond.
  static constexpr double kInPlaceBytes = 4 << 20;
};

}  // namespace subquad::exact_detail
