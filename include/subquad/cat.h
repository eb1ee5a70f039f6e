// CAT: circular-convolutional attention (Yamada, NeurIPS 2025), 1D. One score per token and
// head, s = softmax(z) over the sequence, and the attention matrix is the circulant of s:
// O(N log N) per head and value column with FFTs (src/cat/README.md has the math).
//   z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv]
// Conventions: roll (default) A[i, j] = s[(j - i) mod N]; conv A[i, j] = s[(i - j) mod N].
// Causal variant (lag convention, prefix normaliser):
//   out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]).
// Scores are checked: a non-finite z throws Error naming z (an O(N) pass). Non-finite v
// propagates as IEEE arithmetic does (through the FFT it reaches every row of the head).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "subquad/buffer.h"
#include "subquad/context.h"
#include "subquad/view.h"

namespace subquad {

enum class CatConvention { roll, conv };

// automatic: the direct O(N^2 Dv) gather for small N (below a measured crossover), the FFT
// path above it. direct / fft force one path (tests use direct as a second oracle).
enum class CatPath { automatic, direct, fft };

struct CatOptions {
  CatConvention convention = CatConvention::roll;
  CatPath path = CatPath::automatic;
};

template <typename T>
void cat_forward(const Context& context, View3<const T> z, View4<const T> v,
                 const CatOptions& options, View4<T> out);

// dz [B, N, H] and dv [B, N, H, Dv] are overwritten.
template <typename T>
void cat_backward(const Context& context, View3<const T> z, View4<const T> v,
                  View4<const T> dout, const CatOptions& options, View3<T> dz, View4<T> dv);

// Benchmark baselines ("FFT lower bounds"): the forward and inverse transforms of v's columns
// alone, in contiguous rows (one signal per plan), without the softmax, spectral products or
// gather/scatter. `real_columns` transforms each column as a real signal (the bound as the
// operator's cost is usually stated); `packed_pairs` transforms column pairs packed as complex
// signals x + i y, as cat_forward does (FFTW's complex transforms run faster here per column
// than its real ones; see src/cat/README.md). The constructor copies v into that layout;
// run() performs the transforms for every head.
enum class CatFftPacking { real_columns, packed_pairs };

template <typename T>
class CatFftLowerBound {
 public:
  explicit CatFftLowerBound(View4<const T> v, CatFftPacking packing = CatFftPacking::real_columns);
  void run(const Context& context);

 private:
  CatFftPacking packing_;
  int64_t heads_, length_, columns_, signals_, distance_;
  // [B H, signals, distance] rows of T (real columns) or std::complex<T> (packed pairs),
  // 64-byte aligned as the kernel's rows.
  Buffer<T> rows_, inverse_;
};

// Averaged-key variant: z[b, i, h] = scale * <q[b, i, h], mean_j k[b, j, h]>, then CAT.
// q, k [B, N, H, D], v [B, N, H, Dv]; scale defaults to 1/sqrt(D).
struct CatAvgKeyOptions {
  std::optional<double> scale;
  CatConvention convention = CatConvention::roll;
  CatPath path = CatPath::automatic;
};

template <typename T>
void cat_avgkey_forward(const Context& context, View4<const T> q, View4<const T> k,
                        View4<const T> v, const CatAvgKeyOptions& options, View4<T> out);

// dq, dk [B, N, H, D] and dv [B, N, H, Dv] are overwritten.
template <typename T>
void cat_avgkey_backward(const Context& context, View4<const T> q, View4<const T> k,
                         View4<const T> v, View4<const T> dout, const CatAvgKeyOptions& options,
                         View4<T> dq, View4<T> dk, View4<T> dv);

// Causal variant. automatic: exact direct blocks near the diagonal of the lag structure and
// float64 FFT blocks elsewhere, each with its own exponent shift, so that every row is
// accurate relative to its own normaliser (README: "Causal scheme"); direct: O(N^2 Dv);
// fft: FFT blocks down to single rows (no direct leaves; a test oracle for the FFT blocks).
// The result is shift-invariant: adding any constant to every z of a head (with z + c
// finite) leaves the output unchanged up to the rounding of z + c itself.
struct CatCausalOptions {
  CatPath path = CatPath::automatic;
};

template <typename T>
void cat_causal_forward(const Context& context, View3<const T> z, View4<const T> v,
                        const CatCausalOptions& options, View4<T> out);

// Needs the forward's `out`. dz [B, N, H] and dv [B, N, H, Dv] are overwritten.
template <typename T>
void cat_causal_backward(const Context& context, View3<const T> z, View4<const T> v,
                         View4<const T> out, View4<const T> dout,
                         const CatCausalOptions& options, View3<T> dz, View4<T> dv);

// Token-by-token causal CAT for one sequence of H heads: append(z [H], v [H, Dv]) returns the
// output of the new token [H, Dv], equal to row i of cat_causal_forward. Caches z and v
// only (no keys); O(i Dv) per head for token i.
template <typename T>
class CatCausalDecoder {
 public:
  CatCausalDecoder(int64_t heads, int64_t value_dim);

  void append(View1<const T> z, View2<const T> v, View2<T> out);
  int64_t length() const { return length_; }

 private:
  int64_t heads_, value_dim_, length_ = 0;
  std::vector<double> z_;       // [length, H]
  std::vector<T> v_;            // [length, H, Dv]
  std::vector<double> max_;     // [H] running max of z
  std::vector<double> sum_;     // [H] sum_k exp(z[k] - max)
};

}  // namespace subquad
