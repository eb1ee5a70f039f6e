// RealFftPlan over FFTW's guru-free advanced interface (fftw_plan_many_dft_r2c/c2r).
// Each layout gets two plan pairs: one for 64-byte aligned arrays (SIMD codelets) and one
// planned with FFTW_UNALIGNED for arbitrary user pointers; execute picks by alignment.
#include <fftw3.h>

#include <atomic>
#include <list>
#include <mutex>

#include "subquad/error.h"
#include "subquad/fft.h"

namespace subquad {
namespace {

std::atomic<FftEffort> g_effort{FftEffort::estimate};

template <typename T>
struct Fftw;

template <>
struct Fftw<float> {
  using Plan = fftwf_plan;
  using Complex = fftwf_complex;
  static void* malloc(size_t bytes) { return fftwf_malloc(bytes); }
  static void free(void* p) { fftwf_free(p); }
  static Plan r2c(int rank, const int* n, int howmany, float* in, int istride, int idist,
                  Complex* out, int ostride, int odist, unsigned flags) {
    return fftwf_plan_many_dft_r2c(rank, n, howmany, in, nullptr, istride, idist, out, nullptr,
                                   ostride, odist, flags);
  }
  static Plan c2r(int rank, const int* n, int howmany, Complex* in, int istride, int idist,
                  float* out, int ostride, int odist, unsigned flags) {
    return fftwf_plan_many_dft_c2r(rank, n, howmany, in, nullptr, istride, idist, out, nullptr,
                                   ostride, odist, flags);
  }
  static void destroy(Plan p) { fftwf_destroy_plan(p); }
  static void cleanup() { fftwf_cleanup(); }
  static void execute_r2c(Plan p, float* in, Complex* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void execute_c2r(Plan p, Complex* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
  static int alignment_of(float* p) { return fftwf_alignment_of(p); }
};

template <>
struct Fftw<double> {
  using Plan = fftw_plan;
  using Complex = fftw_complex;
  static void* malloc(size_t bytes) { return fftw_malloc(bytes); }
  static void free(void* p) { fftw_free(p); }
  static Plan r2c(int rank, const int* n, int howmany, double* in, int istride, int idist,
                  Complex* out, int ostride, int odist, unsigned flags) {
    return fftw_plan_many_dft_r2c(rank, n, howmany, in, nullptr, istride, idist, out, nullptr,
                                  ostride, odist, flags);
  }
  static Plan c2r(int rank, const int* n, int howmany, Complex* in, int istride, int idist,
                  double* out, int ostride, int odist, unsigned flags) {
    return fftw_plan_many_dft_c2r(rank, n, howmany, in, nullptr, istride, idist, out, nullptr,
                                  ostride, odist, flags);
  }
  static void destroy(Plan p) { fftw_destroy_plan(p); }
  static void cleanup() { fftw_cleanup(); }
  static void execute_r2c(Plan p, double* in, Complex* out) { fftw_execute_dft_r2c(p, in, out); }
  static void execute_c2r(Plan p, Complex* in, double* out) { fftw_execute_dft_c2r(p, in, out); }
  static int alignment_of(double* p) { return fftw_alignment_of(p); }
};

template <typename T>
struct PlanSet {
  RealFftLayout layout;
  typename Fftw<T>::Plan forward_aligned, inverse_aligned;
  typename Fftw<T>::Plan forward_unaligned, inverse_unaligned;
};

// FFTW's planner (for both precisions) must not run concurrently: one mutex for all.
std::mutex g_planner_mutex;

int checked_int(int64_t value, const char* what) {
  check(value >= 0 && value <= INT32_MAX, "fft layout: ", what, " = ", value,
        " is outside FFTW's int range");
  return static_cast<int>(value);
}

template <typename T>
PlanSet<T> make_plans(const RealFftLayout& layout) {
  using F = Fftw<T>;
  check(layout.rank == 1 || layout.rank == 2, "fft layout: rank must be 1 or 2, got ",
        layout.rank);
  check(layout.n0 >= 1 && layout.n1 >= 1 && layout.batch >= 1,
        "fft layout: sizes must be positive, got n0 = ", layout.n0, ", n1 = ", layout.n1,
        ", batch = ", layout.batch);
  const int n[2] = {checked_int(layout.n0, "n0"), checked_int(layout.n1, "n1")};
  const int64_t real_distance = layout.real_distance ? layout.real_distance : layout.real_size();
  const int64_t complex_distance =
      layout.complex_distance ? layout.complex_distance : layout.spectrum_size();
  const int howmany = checked_int(layout.batch, "batch");
  const int istride = checked_int(layout.real_stride, "real_stride");
  const int idist = checked_int(real_distance, "real_distance");
  const int ostride = checked_int(layout.complex_stride, "complex_stride");
  const int odist = checked_int(complex_distance, "complex_distance");

  // Scratch arrays big enough for the layout; FFTW_MEASURE overwrites them while planning.
  const int64_t last_real = (layout.batch - 1) * real_distance +
                            (layout.real_size() - 1) * layout.real_stride + 1;
  const int64_t last_complex = (layout.batch - 1) * complex_distance +
                               (layout.spectrum_size() - 1) * layout.complex_stride + 1;
  T* real = static_cast<T*>(F::malloc(sizeof(T) * (last_real + 1)));
  auto* spectrum =
      static_cast<typename F::Complex*>(F::malloc(sizeof(typename F::Complex) * last_complex));
  const unsigned effort =
      g_effort.load() == FftEffort::measure ? FFTW_MEASURE : FFTW_ESTIMATE;

  PlanSet<T> set{layout, {}, {}, {}, {}};
  set.forward_aligned = F::r2c(layout.rank, n, howmany, real, istride, idist, spectrum, ostride,
                               odist, effort);
  set.inverse_aligned = F::c2r(layout.rank, n, howmany, spectrum, ostride, odist, real, istride,
                               idist, effort | FFTW_DESTROY_INPUT);
  // Unaligned plans are planned on a deliberately misaligned real array.
  set.forward_unaligned = F::r2c(layout.rank, n, howmany, real + 1, istride, idist, spectrum,
                                 ostride, odist, effort | FFTW_UNALIGNED);
  set.inverse_unaligned = F::c2r(layout.rank, n, howmany, spectrum, ostride, odist, real + 1,
                                 istride, idist, effort | FFTW_UNALIGNED | FFTW_DESTROY_INPUT);
  F::free(real);
  F::free(spectrum);
  check(set.forward_aligned && set.inverse_aligned && set.forward_unaligned &&
            set.inverse_unaligned,
        "fft layout: FFTW could not plan rank ", layout.rank, " n0 = ", layout.n0,
        " n1 = ", layout.n1, " batch = ", layout.batch);
  return set;
}

// The cache owns its plans and frees them, and FFTW's planner state, at program exit.
template <typename T>
struct PlanCache {
  std::list<PlanSet<T>> entries;  // a list: entries never move, so handles stay valid
  ~PlanCache() {
    for (PlanSet<T>& set : entries)
      for (auto plan : {set.forward_aligned, set.inverse_aligned, set.forward_unaligned,
                        set.inverse_unaligned})
        Fftw<T>::destroy(plan);
    Fftw<T>::cleanup();
  }
};

template <typename T>
std::list<PlanSet<T>>& plan_cache() {
  static PlanCache<T> cache;
  return cache.entries;
}

template <typename T>
const PlanSet<T>& find_or_make(const RealFftLayout& layout) {
  std::lock_guard<std::mutex> lock(g_planner_mutex);
  for (const PlanSet<T>& set : plan_cache<T>())
    if (set.layout == layout) return set;
  plan_cache<T>().push_back(make_plans<T>(layout));
  return plan_cache<T>().back();
}

}  // namespace

void set_fft_effort(FftEffort effort) { g_effort.store(effort); }

template <typename T>
RealFftPlan<T> RealFftPlan<T>::get(const RealFftLayout& layout) {
  const PlanSet<T>& set = find_or_make<T>(layout);
  return RealFftPlan<T>(&set.layout, &set);
}

template <typename T>
void RealFftPlan<T>::forward(const T* real, std::complex<T>* spectrum) const {
  using F = Fftw<T>;
  const auto* set = static_cast<const PlanSet<T>*>(plans_);
  T* in = const_cast<T*>(real);  // r2c without FFTW_DESTROY_INPUT leaves the input intact
  auto* out = reinterpret_cast<typename F::Complex*>(spectrum);
  const bool aligned = F::alignment_of(in) == 0 && F::alignment_of(reinterpret_cast<T*>(out)) == 0;
  F::execute_r2c(aligned ? set->forward_aligned : set->forward_unaligned, in, out);
}

template <typename T>
void RealFftPlan<T>::inverse(std::complex<T>* spectrum, T* real) const {
  using F = Fftw<T>;
  const auto* set = static_cast<const PlanSet<T>*>(plans_);
  auto* in = reinterpret_cast<typename F::Complex*>(spectrum);
  const bool aligned = F::alignment_of(real) == 0 && F::alignment_of(reinterpret_cast<T*>(in)) == 0;
  F::execute_c2r(aligned ? set->inverse_aligned : set->inverse_unaligned, in, real);
}

template class RealFftPlan<float>;
template class RealFftPlan<double>;

}  // namespace subquad
