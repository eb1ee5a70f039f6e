// Causal decoding of MLR attention over caller-owned per-level key caches (mlr_decode,
// subquad/structured.h): level l holds the keys (its r_l columns) of the current level-l
// block only, so the key cache peaks at T sum_l r_l / 2^(l-1) floats per kv head; values are
// kept for every token. Position t costs O(sum_l r_l (t mod s_l) + t Dv) per head.
// Reference: the causal rows of mlr_ref.h; tested against it in mlr_decode_test.cpp.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "common/parallel.h"
#include "structured/mlr_levels.h"
#include "structured/structured_ops.h"
#include "subquad/structured.h"

namespace subquad {

template <typename T>
void mlr_decode(const Context& context, View4<const T> q,
                std::span<const View4<const T>> level_keys, View4<const T> v,
                const MlrOptions& options, int64_t context_length, View4<T> out) {
  check_view(q, "q");
  check_view(v, "v");
  check(context_length >= 1, "context: expected >= 1, got ", context_length);
  const int64_t B = q.dim(0), T_new = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t S = v.dim(1), Hkv = v.dim(2), Dv = v.dim(3);
  const mlr::Levels levels = mlr::make_levels(options.ranks, D, context_length);
  check(v.dim(0) == B, "v: expected [", B, ", S, Hkv, Dv] (the batch of q), got ",
        shape_text(v.shape));
  check(Hkv >= 1 && H % Hkv == 0, "v: expected kv heads dividing the ", H,
        " query heads, got ", Hkv);
  check(S <= context_length, "v: ", S, " positions exceed the context of ", context_length);
  check(T_new <= S, "q: ", T_new, " queries, but v holds only ", S, " positions");
  const int64_t finest = levels.block_sizes[levels.count - 1];
  check(T_new == 0 || (S - T_new) / finest == (S - 1) / finest, "q: positions ", S - T_new,
        " .. ", S - 1, " span more than one block of the finest level (", finest,
        " tokens): decode them in parts split at its boundaries");
  check(static_cast<int64_t>(level_keys.size()) == levels.count, "level_keys: expected ",
        levels.count, " level caches (one per rank), got ", level_keys.size());
  for (int64_t l = 0; l < levels.count; ++l) {
    check_view(level_keys[l], "level_keys");
    check_shape(level_keys[l], {B, Hkv, levels.block_sizes[l], levels.ranks[l]},
                "level_keys (expected [B, Hkv, s_l, r_l] per level)");
  }
  mlr::check_output(out, {B, T_new, H, Dv}, "out");
  dispatch(context, mlr::MlrDecodeParams<T>{level_keys, levels.offsets.data(),
                                            levels.block_sizes.data(), v, options.block_divide,
                                            q, out});
}

template void mlr_decode<float>(const Context&, View4<const float>,
                                std::span<const View4<const float>>, View4<const float>,
                                const MlrOptions&, int64_t, View4<float>);
template void mlr_decode<double>(const Context&, View4<const double>,
                                 std::span<const View4<const double>>, View4<const double>,
                                 const MlrOptions&, int64_t, View4<double>);

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const mlr::MlrDecodeParams<T>& params) {
  const View4<const T> q = params.q, v = params.v;
  const View4<T> out = params.out;
  const int64_t L = static_cast<int64_t>(params.keys.size());
  const int64_t B = out.dim(0), T_new = out.dim(1), H = out.dim(2), Dv = out.dim(3);
  const int64_t S = v.dim(1), Hkv = v.dim(2), group = H / Hkv;
  const int64_t* offsets = params.offsets;
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t h = task % H, b = task / H, hk = h / group;
    std::vector<T> scores(static_cast<size_t>(S));
    std::vector<int64_t> shared(static_cast<size_t>(S));
    for (int64_t token = 0; token < T_new; ++token) {
      const int64_t t = S - T_new + token;  // this row's position
      std::fill(scores.begin(), scores.begin() + t + 1, T(0));
      std::fill(shared.begin(), shared.begin() + t + 1, 0);
      const T* query = q.row(b, token, h);
      for (int64_t l = 0; l < L; ++l) {
        const int64_t size = params.block_sizes[l], r = offsets[l + 1] - offsets[l];
        const int64_t start = t - t % size;  // first position of the current level-l block
        for (int64_t j = start; j <= t; ++j) {
          const T* key = params.keys[l].row(b, hk, j - start);
          T dot = 0;
          for (int64_t c = 0; c < r; ++c) dot += query[offsets[l] + c] * key[c];
          scores[j] += dot / static_cast<T>(r);
          ++shared[j];
        }
      }
      if (params.block_divide)
        for (int64_t j = 0; j <= t; ++j) scores[j] /= static_cast<T>(shared[j]);
      const T row_max = *std::max_element(scores.begin(), scores.begin() + t + 1);
      T sum = 0;
      for (int64_t j = 0; j <= t; ++j) sum += (scores[j] = std::exp(scores[j] - row_max));
      T* o = out.row(b, token, h);
      std::fill(o, o + Dv, T(0));
      for (int64_t j = 0; j <= t; ++j) {
        const T p = scores[j] / sum;
        const T* value = v.row(b, j, hk);
        for (int64_t c = 0; c < Dv; ++c) o[c] += p * value[c];
      }
    }
  });
}

template void run<float>(Backend, const Context&, const mlr::MlrDecodeParams<float>&);
template void run<double>(Backend, const Context&, const mlr::MlrDecodeParams<double>&);

}  // namespace cpu
}  // namespace subquad
