// WildCat: softmax attention over a small weighted coreset of keys chosen by randomly
// pivoted Cholesky on the exponential kernel (Schröder & Mackey 2026), its baselines at the
// same budget, and KV-cache compression (CompressKV) with the StreamingLLM and SnapKV caches.
//   q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] (no lse: the
//   result is an approximation, not a normalised softmax). Query head h reads kv head
//   h / (H / Hkv); one coreset is built per (batch, kv head) and shared by its query heads.
// Cost: O(M r^2 / C^2 + M r (D + Dv) / C) to compress (C bins) plus O(N r (D + Dv)) to
// attend. float32 only.
// src/wildcat/README.md gives the algorithm and the reasons behind each numerical guard.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "subquad/context.h"
#include "subquad/cost.h"
#include "subquad/view.h"

namespace subquad {

// How the r coreset keys of a bin are chosen and weighted.
enum class CoresetMethod {
  wildcat,            // randomly pivoted Cholesky pivots, Nyström weights (the method)
  uniform_nystrom,    // uniformly random pivots, the same Nyström weights
  uniform_subsample,  // uniformly random keys, each weighted n/r (plain attention over them)
};

// The query radius R_Q the kernel temperature assumes (wildcat_temperature): the temperature
// trades the kernel's low-rank approximability (R_K) against the error growth along queries of
// norm up to R_Q. R_Q = R_K is the default: on SmolLM2's queries, whose largest norms are
// outliers up to 1.6 R_K, it has the lower error at r <= 256; on Gaussian inputs the two are
// equal (src/wildcat/README.md, "The query radius").
enum class QueryRadius {
  keys,     // R_Q = R_K, the bin's key radius: the coreset depends on the keys alone (CompressKV's)
  queries,  // max ||q|| over the kv group's queries (the paper's bound, the authors' forward)
};

struct WildcatOptions {
  int64_t rank = 128;           // r: coreset points per (batch, kv head), over all bins; r >= 1
  int64_t bins = 1;             // C contiguous key bins compressed independently; 1 <= C <= r
  uint64_t seed = 0;            // same seed, inputs and thread count give bit-identical output
  std::optional<double> scale;  // softmax scale beta > 0; default 1/sqrt(D)
  CoresetMethod method = CoresetMethod::wildcat;
  QueryRadius query_radius = QueryRadius::keys;
};

// Approximate softmax(beta q k^T) v. Bins do not have to divide M: bin c holds M / C keys,
// plus one for the first M % C bins, and the rank is split the same way (capped at the bin
// size, so r >= M with one bin keeps every key and reproduces exact attention). C > M uses
// M bins. M = 0 writes zeros.
void wildcat_attention(const Context& context, View4<const float> q, View4<const float> k,
                       View4<const float> v, const WildcatOptions& options, View4<float> out);

// Principal branch W0 of the Lambert W function (w e^w = x) for x >= 0, by Halley
// iterations from a log-based start.
double lambert_w0(double x);

// The kernel temperature tau of the spec for n keys of radius key_radius (max norm after
// recentering) and queries of radius query_radius under softmax scale beta. Degenerate
// radii: key_radius = 0 gives 1 (every kernel entry is 1 at any temperature);
// query_radius = 0 falls back to key_radius.
double wildcat_temperature(double beta, double query_radius, double key_radius, int64_t n);

// Weighted key-value entries, held by the caller: attention over them is
//   out = clamp( sum_j p_j v_j / sum_j p_j w_j, value range ),
//   p_j = exp(beta q.k_j + log_scale_j - max_j),
// i.e. ordinary attention over values [v, w] with the log scales added to the scores,
// followed by a division by the last column. Exact entries have v the value, w = 1 and log
// scale 0; a coreset entry has e^{log_scale} [v, w] = [W V, W 1] with max(|v|, |w|) = 1: the
// magnitudes of Nyström rows span far more than float's range when key norms are large, so
// they live in the log scale (-inf: the entry never contributes).
// A row whose denominator cancels to round-off (at most min(L eps, 1/2) sum_j p_j |w_j| for L
// entries) outputs zeros, clamped.
// The entries of B x Hkv heads, each padded to L (entries past a head's length are never
// read; padding with log scale -inf is harmless as well):
struct WeightedKV {
  View4<const float> keys;        // [B, Hkv, L, D], rows contiguous per head
  View4<const float> values;      // [B, Hkv, L, Dv + 1]: v, then w; rows contiguous per head
  View3<const float> log_scales;  // [B, Hkv, L], contiguous per head; finite or -inf
  View2<const int64_t> lengths;   // [B, Hkv] entries of each head, or empty: all L
  // [B, Hkv, Dv] each, or both empty: the outputs are not clamped.
  View3<const float> value_min, value_max;
};

// q [B, N, H, D] -> out [B, N, H, Dv]: every query sees every entry of its kv head
// (h / (H / Hkv)); a head with no entries outputs zeros. Nothing is kept between calls: a
// decode loop appends its tokens (weight 1, log scale 0) to its own arrays.
void weighted_kv_attention(const Context& context, View4<const float> q, const WeightedKV& kv,
                           View4<float> out, std::optional<double> scale = std::nullopt);

// What a KV-cache compressor keeps of M tokens, per (batch, kv head): a list of entries, each
// naming its token (an index into the M) and carrying a value row, a weight and a log scale
// (the entry counts as e^{log_scale} [value, weight]).
// Exact entries (sinks, window, StreamingLLM, SnapKV) carry the token's value, weight 1 and
// log scale 0; a CompressKV coreset entry carries W V and W 1 (Nystrom weights may be
// negative) and its log scale. A compressor selects; the caller stores the entries.
struct KVSelection {
  struct Head {
    std::vector<int64_t> indices;  // [L], into the M tokens
    std::vector<float> values;     // [L, Dv]
    std::vector<float> weights;    // [L]
    std::vector<float> log_scales;  // [L]
  };
  int64_t batch = 0, kv_heads = 0, value_dim = 0;
  std::vector<Head> heads;  // [B * Hkv]

  const Head& head(int64_t b, int64_t hkv) const {
    return heads[static_cast<size_t>(b * kv_heads + hkv)];
  }
  // The most entries of any head.
  int64_t max_entries() const;
};

// The entries of a selection of k [B, M, Hkv, D], v [B, M, Hkv, Dv] as arrays the caller
// owns, padded to the longest head (keys and values 0, log scale -inf): each entry's key is
// k's row at its index; the value range is that of all of v. Throws Error naming the index
// of an entry outside the M tokens, or a weight that is not finite or a log scale that is
// NaN or +inf.
struct WeightedKVEntries {
  int64_t batch = 0, kv_heads = 0, entries = 0, head_dim = 0, value_dim = 0;  // B, Hkv, L, D, Dv
  std::vector<float> keys;        // [B, Hkv, L, D]
  std::vector<float> values;      // [B, Hkv, L, Dv + 1]
  std::vector<float> log_scales;  // [B, Hkv, L]
  std::vector<int64_t> lengths;   // [B, Hkv]
  std::vector<float> value_min, value_max;  // [B, Hkv, Dv]

  WeightedKV view() const;
};
WeightedKVEntries weighted_kv_entries(View4<const float> k, View4<const float> v,
                                      const KVSelection& selection);

struct CompressKVOptions {
  int64_t sink = 32;    // first tokens kept exactly
  int64_t window = 32;  // last tokens kept exactly
  // Fraction of the middle (between sinks and window) removed: 0.75 keeps 25%.
  double compression_ratio = 0.75;
  int64_t bin_rank = 16;  // coreset points per bin; bins = max(1, kept middle / bin_rank)
  uint64_t seed = 0;
  std::optional<double> scale;  // default 1/sqrt(D)
};

// CompressKV: after prefill, keeps sinks and window exactly and compresses the middle of
// each (batch, kv head) bin by bin to WildCat coresets built without queries (R_Q = R_K).
class CompressKV {
 public:
  explicit CompressKV(const CompressKVOptions& options);
  // k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> the entries kept: per head the sinks, the
  // coreset of each bin of the middle (pivot order), then the window. A head with a
  // non-finite key or value keeps its middle exactly.
  KVSelection select(const Context& context, View4<const float> k, View4<const float> v) const;
  // Coreset bins the middle of M tokens is split into.
  int64_t bins(int64_t M) const;

 private:
  CompressKVOptions options_;
};

// StreamingLLM: the first `sink` and last `window` tokens (all of them when M <= sink +
// window), weight 1.
KVSelection streaming_llm_select(View4<const float> k, View4<const float> v, int64_t sink,
                                 int64_t window);

struct SnapKVOptions {
  int64_t capacity = 256;       // entries kept per (batch, kv head), observation window included
  int64_t pool_kernel = 7;      // odd width of the average pooling of the votes
  std::optional<double> scale;  // default 1/sqrt(D)
};

// SnapKV: the observation-window queries q_obs [B, W, H, D] (those of the last W prompt
// tokens, W <= capacity) vote with their causal softmax over the prefix keys; votes are summed over
// the window and over the query heads of a kv head, average-pooled, and the top capacity - W prefix
// tokens are kept in order, followed by the W window tokens (weight 1).
KVSelection snapkv_select(const Context& context, View4<const float> q_obs, View4<const float> k,
                          View4<const float> v, const SnapKVOptions& options);

// ---- flop and byte models (conventions: subquad/cost.h) ----------------------------
// Per (batch, kv head), the forward's min(C, M) bins of n keys and r_c points each (near-equal
// splits of M and r): RPC residual updates n r_c^2, kernel rows 2 n r_c D and Nystrom values
// 2 n r_c (Dv + 1) per bin whose points do not cover its keys (one that does keeps its n keys);
// per (batch, query head) attention 2 N (points kept) (D + Dv + 1). With C bins compression is
// about M r^2 / C^2 + 2 M r (D + Dv + 1) / C. uniform_subsample only draws its points: no
// compression flops.
Cost wildcat_attention_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv, int64_t D,
                            int64_t Dv, int64_t rank, int64_t bins,
                            CoresetMethod method = CoresetMethod::wildcat);

}  // namespace subquad
