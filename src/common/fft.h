// Real and complex FFT plans over FFTW, float32 and float64, 1D and 2D, batched over
// contiguous rows. Plans are created once per (shape, batch, layout) and reused from a
// thread-safe cache: FFTW's planner is not thread-safe, its execute functions are.
//
// Normalisation: forward and inverse are both unnormalised (inverse(forward(x)) = n x);
// callers apply 1/n once, explicitly.
#pragma once

#include <complex>
#include <cstdint>

namespace subquad {

// A batch of `batch` real signals of logical shape [n0] (rank 1) or [n0, n1] (rank 2).
// Real signal b starts at real_in + b * real_distance, its elements (i, j) at
// i * real_row_stride + j ... (row-major, contiguous last dimension): see `RealFftLayout`.
// The half spectrum has shape [n0 / 2 + 1] or [n0, n1 / 2 + 1].
struct RealFftLayout {
  int rank = 1;
  int64_t n0 = 1;
  int64_t n1 = 1;            // used when rank == 2
  int64_t batch = 1;
  int64_t real_stride = 1;   // distance between consecutive elements of one signal
  int64_t real_distance = 0; // distance between signals; 0 means n0 * n1 (contiguous)
  int64_t complex_stride = 1;
  int64_t complex_distance = 0;  // 0 means the half-spectrum size

  int64_t real_size() const { return rank == 1 ? n0 : n0 * n1; }
  int64_t spectrum_size() const { return rank == 1 ? n0 / 2 + 1 : n0 * (n1 / 2 + 1); }
  bool operator==(const RealFftLayout&) const = default;
};

// A planned pair of real-to-complex and complex-to-real transforms for one layout. The
// plan is owned by the cache and lives until program exit; handles are cheap to copy.
template <typename T>
class RealFftPlan {
 public:
  // Returns the cached plan for `layout`, creating it on first use (thread-safe).
  static RealFftPlan get(const RealFftLayout& layout);

  // real [batch x real_size] -> spectrum [batch x spectrum_size]. `real` is not modified.
  void forward(const T* real, std::complex<T>* spectrum) const;
  // spectrum -> real, unnormalised. FFTW's c2r destroys its input: `spectrum` is clobbered.
  void inverse(std::complex<T>* spectrum, T* real) const;

  const RealFftLayout& layout() const { return *layout_; }

 private:
  RealFftPlan(const RealFftLayout* layout, const void* plans) : layout_(layout), plans_(plans) {}
  const RealFftLayout* layout_;
  const void* plans_;  // the cache's FFTW plans for this layout
};

// A batch of `batch` complex signals of shape [n0] (rank 1) or [n0, n1] (rank 2), input and
// output alike: signal b starts at b * distance, element (i, j) at (i * n1 + j) * stride.
// `in_place` plans transform an array onto itself (one buffer of the signal's size); other
// plans need distinct input and output arrays and leave the input intact.
struct ComplexFftLayout {
  int rank = 1;
  int64_t n0 = 1;
  int64_t n1 = 1;        // used when rank == 2
  int64_t batch = 1;
  int64_t stride = 1;
  int64_t distance = 0;  // 0 means n0 * n1 (contiguous)
  bool in_place = false;

  int64_t size() const { return rank == 1 ? n0 : n0 * n1; }
  bool operator==(const ComplexFftLayout&) const = default;
};

// A planned pair of complex transforms for one layout: forward sum_n x[n] e^{-2 pi i f n / n0}
// and inverse with e^{+2 pi i ...}, both unnormalised. Cached like RealFftPlan.
template <typename T>
class ComplexFftPlan {
 public:
  // Returns the cached plan for `layout`, creating it on first use (thread-safe).
  static ComplexFftPlan get(const ComplexFftLayout& layout);

  // in [batch x size] -> out [batch x size]; `in == out` exactly when the layout is in_place.
  void forward(const std::complex<T>* in, std::complex<T>* out) const;
  void inverse(const std::complex<T>* in, std::complex<T>* out) const;

  const ComplexFftLayout& layout() const { return *layout_; }

 private:
  ComplexFftPlan(const ComplexFftLayout* layout, const void* plans)
      : layout_(layout), plans_(plans) {}
  const ComplexFftLayout* layout_;
  const void* plans_;  // the cache's FFTW plans for this layout
};

// How hard FFTW's planner works on first use of a layout: `estimate` plans instantly,
// `measure` times candidate algorithms (seconds for big layouts, faster transforms).
// Applies to plans created after the call; the default is `estimate`.
enum class FftEffort { estimate, measure };
void set_fft_effort(FftEffort effort);

extern template class RealFftPlan<float>;
extern template class RealFftPlan<double>;
extern template class ComplexFftPlan<float>;
extern template class ComplexFftPlan<double>;

}  // namespace subquad
