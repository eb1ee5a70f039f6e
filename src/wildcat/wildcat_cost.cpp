// Flop and byte model of WildCat attention (include/subquad/cost.h states the conventions).
#include <algorithm>

#include "subquad/wildcat.h"

namespace subquad {

Cost wildcat_attention_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv, int64_t D,
                            int64_t Dv, int64_t rank, int64_t bins, CoresetMethod method) {
  const double d = double(D), dv = double(Dv);
  // The forward's split (wildcat.cpp): min(bins, M) near-equal bins of keys and of the rank,
  // each compressed on its own keys; a bin whose points cover its keys keeps them as they are.
  const int64_t C = std::max<int64_t>(1, std::min(bins, M));
  double compress = 0, points = 0;
  for (int64_t c = 0; c < C; ++c) {
    const double n = double(M / C + (c < M % C ? 1 : 0));
    const double r = double(rank / C + (c < rank % C ? 1 : 0));
    if (r >= n) {
      points += n;
      continue;
    }
    points += r;
    if (method != CoresetMethod::uniform_subsample)
      compress += n * r * r + 2 * n * r * d + 2 * n * r * (dv + 1);
  }
  const double attend = 2 * double(N) * points * (d + dv + 1);
  // float32: q [B, N, H, D], k, v [B, M, Hkv, D | Dv] in, out [B, N, H, Dv] out.
  const double elements =
      double(B) * (double(N) * H * (D + Dv) + double(M) * double(Hkv) * (D + Dv));
  // The coreset is built per kv head and read by every query head of its group.
  return {double(B * Hkv) * compress + double(B * H) * attend, elements * sizeof(float)};
}

}  // namespace subquad
