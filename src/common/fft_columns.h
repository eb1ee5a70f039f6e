// Complex FFTs of power-of-two length n straight on [n, columns] float memory (the columns'
// stride-1 axis is the batch): one SIMD vector holds kColumnLanes columns, so every butterfly is
// vertical arithmetic with no shuffles and no transposes. Pairs of real columns travel as one
// complex signal. O(n log n) per column; radix-4 Stockham passes with precomputed twiddles, and
// for n > kColumnFftDirectMax the four-step split n = n1 n2 whose sub-transforms stay in L1/L2.
// Reference: FFTW and a direct DFT in fft_columns_test.cpp.
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

namespace subquad {

// Columns per SIMD vector (float32): 8 with AVX2 (256-bit), 16 with AVX-512. Everything below
// is written in terms of this one constant.
#if defined(__AVX512F__)
inline constexpr int kColumnLanes = 16;
#else
inline constexpr int kColumnLanes = 8;
#endif
// One group: 2 kColumnLanes real columns packed as kColumnLanes complex signals, column
// c + j (real part) with column c + kColumnLanes + j (imaginary part), j < kColumnLanes.
inline constexpr int kColumnGroup = 2 * kColumnLanes;

// Above this length the transform is split in two (four-step); at or below it, one Stockham
// sweep over the whole group (its 64 n bytes stay in L2). Measured: fft_columns_bench.
inline constexpr int64_t kColumnFftDirectMax = 1024;

// A planned column transform of one length, cached (thread-safe) for the program's life.
// Memory is row-major [n, row_stride] floats; a call transforms `columns` consecutive columns
// starting at the pointer, in groups of kColumnGroup (a last, partial group reads the missing
// columns as zeros and writes nothing for them).
//
// Spectra are "packed": group g's complex signal j is x_j = col(16g + j) + i col(16g + 8 + j)
// (for kColumnLanes = 8) and its spectrum X_j[k] is stored at row k as Re in float column
// 16g + j, Im in 16g + 8 + j of a [n, spectrum_stride] array with room for every group's 16
// columns (so a partial group still needs all 16). Both directions are unnormalised:
// inverse(forward(x)) = n x.
class ColumnFft {
 public:
  static const ColumnFft& get(int64_t n);  // n a power of two, 1 <= n <= 2^24

  int64_t size() const { return n_; }
  // Floats of scratch one call needs (the caller's, e.g. a WorkspaceFrame; any alignment).
  int64_t scratch_floats() const;

  // real [n, real_stride] (columns used) -> spectrum [n, spectrum_stride] (16 per group).
  void forward(const float* real, int64_t real_stride, int64_t columns, float* spectrum,
               int64_t spectrum_stride, float* scratch) const;
  // spectrum [n, spectrum_stride] -> real [n, real_stride]: the real parts of each signal's
  // inverse to its first column, the imaginary parts to its second. `spectrum` is kept.
  void inverse(const float* spectrum, int64_t spectrum_stride, int64_t columns, float* real,
               int64_t real_stride, float* scratch) const;
  // out = inverse(filter * forward(in)) for every column: a circular convolution of each real
  // column with the real signal whose spectrum is `filter` [n] (full length, in natural order;
  // normalisation, 1/n included, is the filter's). in and out may be the same array.
  void filter(const float* in, int64_t in_stride, int64_t columns,
              const std::complex<float>* filter, float* out, int64_t out_stride,
              float* scratch) const;

  struct Stage {  // one Stockham pass: radix 4 or 2 over sub-length m
    int radix;
    int64_t m;
    int64_t twiddle_offset;  // into twiddles: (radix - 1) complex per p < m / radix
  };
  struct SubPlan {  // a transform of length n that runs in one sweep
    int64_t n = 1;
    std::vector<Stage> stages;
    std::vector<float> twiddles;  // interleaved re, im
  };

 private:
  explicit ColumnFft(int64_t n);
  int64_t n_, n1_, n2_;  // n = n1 n2; n2 = 1 when direct
  SubPlan first_, second_;          // lengths n1 and n2 (first_ alone when direct)
  std::vector<float> split_twiddles_;  // W_n^{a b}, a < n2, b < n1, at [a n1 + b], re, im
  friend class ColumnFftCache;
};

}  // namespace subquad
