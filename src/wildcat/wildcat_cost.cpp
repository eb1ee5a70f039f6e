// Flop and byte model of WildCat attention (include/subquad/cost.h states the conventions).
#include <algorithm>

#include "subquad/wildcat.h"

namespace subquad {

Cost wildcat_attention_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv, int64_t D,
                            int64_t Dv, int64_t rank, int64_t bins) {
  const double m = double(M), r = std::min<double>(double(rank), m);
  const double c = double(std::max<int64_t>(bins, 1)), d = double(D), dv = double(Dv);
  const double compress = m * r * r / c + 2 * m * r * d + 2 * m * r * (dv + 1);
  const double attend = 2 * double(N) * r * (d + dv + 1);
  // float32: q [B, N, H, D], k, v [B, M, Hkv, D | Dv] in, out [B, N, H, Dv] out.
  const double elements =
      double(B) * (double(N) * H * (D + Dv) + m * double(Hkv) * (D + Dv));
  // The coreset is built per kv head and read by every query head of its group.
  return {double(B * Hkv) * compress + double(B * H) * attend, elements * sizeof(float)};
}

}  // namespace subquad
