// RealFftPlan and ComplexFftPlan over FFTW's advanced interface (fftw_plan_many_dft_r2c/c2r,
// fftw_plan_many_dft). Each layout gets two plan pairs: one for 64-byte aligned arrays (SIMD
// codelets) and one planned with FFTW_UNALIGNED for arbitrary user pointers; execute picks by
// alignment.
#include <fftw3.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <list>
#include <mutex>
#include <string>

#include "common/fft.h"
#include "subquad/checked_size.h"
#include "subquad/error.h"

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
  static Plan dft(int rank, const int* n, int howmany, Complex* in, Complex* out, int stride,
                  int dist, int sign, unsigned flags) {
    return fftwf_plan_many_dft(rank, n, howmany, in, nullptr, stride, dist, out, nullptr, stride,
                              dist, sign, flags);
  }
  static void execute_dft(Plan p, Complex* in, Complex* out) { fftwf_execute_dft(p, in, out); }
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
  static Plan dft(int rank, const int* n, int howmany, Complex* in, Complex* out, int stride,
                  int dist, int sign, unsigned flags) {
    return fftw_plan_many_dft(rank, n, howmany, in, nullptr, stride, dist, out, nullptr, stride,
                              dist, sign, flags);
  }
  static void execute_dft(Plan p, Complex* in, Complex* out) { fftw_execute_dft(p, in, out); }
  static int alignment_of(double* p) { return fftw_alignment_of(p); }
};

template <typename T, typename Layout>
struct PlanSet {
  Layout layout;
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

// FFTW's dims {n0, n1} of a layout, after checking its rank and sizes (real and complex
// layouts alike).
template <typename Layout>
std::array<int, 2> checked_dims(const Layout& layout) {
  check(layout.rank == 1 || layout.rank == 2, "fft layout: rank must be 1 or 2, got ",
        layout.rank);
  check(layout.n0 >= 1 && layout.n1 >= 1 && layout.batch >= 1,
        "fft layout: sizes must be positive, got n0 = ", layout.n0, ", n1 = ", layout.n1,
        ", batch = ", layout.batch);
  return {checked_int(layout.n0, "n0"), checked_int(layout.n1, "n1")};
}

// The planner flag of the current effort.
unsigned planner_effort() {
  return g_effort.load() == FftEffort::measure ? FFTW_MEASURE : FFTW_ESTIMATE;
}

// FFTW ends the process when one of its own allocations fails (fftw_malloc asserts), which
// the planner makes for its scratch arrays, buffers and twiddle tables. Before planning,
// allocate that much and more (the scratch five times over plus 16 MiB) and give it back:
// when it does not fit, the failure is an OutOfMemory naming the transform, not an abort.
void check_planning_memory(int64_t scratch_elements, size_t element_bytes, int64_t n0,
                           int64_t n1, int64_t batch) {
  const std::string what = "the scratch of an FFT plan (n0 = " + std::to_string(n0) +
                           ", n1 = " + std::to_string(n1) + ", batch = " + std::to_string(batch) +
                           ")";
  const size_t scratch = checked_bytes(scratch_elements, element_bytes, what.c_str());
  const size_t trial = checked_bytes(checked_add(checked_mul(int64_t(scratch), 5, what.c_str()),
                                                 int64_t(16) << 20, what.c_str()),
                                     1, what.c_str());
  void* probe = std::malloc(trial);
  if (probe == nullptr) throw_out_of_memory(trial, what);
  std::free(probe);
}

template <typename T>
PlanSet<T, RealFftLayout> make_plans(const RealFftLayout& layout) {
  using F = Fftw<T>;
  const std::array<int, 2> dims = checked_dims(layout);
  const int* n = dims.data();
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
  check_planning_memory(last_real + 1 + 2 * last_complex, sizeof(T), layout.n0, layout.n1,
                        layout.batch);
  T* real = static_cast<T*>(F::malloc(sizeof(T) * (last_real + 1)));
  auto* spectrum =
      static_cast<typename F::Complex*>(F::malloc(sizeof(typename F::Complex) * last_complex));
  const unsigned effort = planner_effort();

  PlanSet<T, RealFftLayout> set{layout, {}, {}, {}, {}};
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

template <typename T>
PlanSet<T, ComplexFftLayout> make_plans(const ComplexFftLayout& layout) {
  using F = Fftw<T>;
  const std::array<int, 2> dims = checked_dims(layout);
  const int* n = dims.data();
  const int64_t distance = layout.distance ? layout.distance : layout.size();
  const int howmany = checked_int(layout.batch, "batch");
  const int stride = checked_int(layout.stride, "stride");
  const int dist = checked_int(distance, "distance");

  // Scratch arrays for planning (FFTW_MEASURE overwrites them); one more element so the
  // unaligned plans can be planned one complex element (8 or 16 bytes) off.
  const int64_t last = (layout.batch - 1) * distance + (layout.size() - 1) * layout.stride + 1;
  using C = typename F::Complex;
  check_planning_memory(2 * (last + 1), sizeof(C), layout.n0, layout.n1, layout.batch);
  C* in = static_cast<C*>(F::malloc(sizeof(C) * (last + 1)));
  C* out = layout.in_place ? in : static_cast<C*>(F::malloc(sizeof(C) * (last + 1)));
  const unsigned effort = planner_effort();

  PlanSet<T, ComplexFftLayout> set{layout, {}, {}, {}, {}};
  set.forward_aligned =
      F::dft(layout.rank, n, howmany, in, out, stride, dist, FFTW_FORWARD, effort);
  set.inverse_aligned =
      F::dft(layout.rank, n, howmany, in, out, stride, dist, FFTW_BACKWARD, effort);
  set.forward_unaligned = F::dft(layout.rank, n, howmany, in + 1, out + 1, stride, dist,
                                 FFTW_FORWARD, effort | FFTW_UNALIGNED);
  set.inverse_unaligned = F::dft(layout.rank, n, howmany, in + 1, out + 1, stride, dist,
                                 FFTW_BACKWARD, effort | FFTW_UNALIGNED);
  if (out != in) F::free(out);
  F::free(in);
  check(set.forward_aligned && set.inverse_aligned && set.forward_unaligned &&
            set.inverse_unaligned,
        "fft layout: FFTW could not plan complex rank ", layout.rank, " n0 = ", layout.n0,
        " n1 = ", layout.n1, " batch = ", layout.batch);
  return set;
}

// The caches own their plans and free them, and FFTW's planner state, at program exit.
// Real and complex plans of one precision share one cache object, so cleanup runs once,
// after both lists are destroyed.
template <typename T>
struct PlanCache {
  std::list<PlanSet<T, RealFftLayout>> real;  // lists: entries never move, handles stay valid
  std::list<PlanSet<T, ComplexFftLayout>> complex;
  ~PlanCache() {
    destroy(real);
    destroy(complex);
    Fftw<T>::cleanup();
  }
  template <typename Sets>
  static void destroy(Sets& sets) {
    for (auto& set : sets)
      for (auto plan : {set.forward_aligned, set.inverse_aligned, set.forward_unaligned,
                        set.inverse_unaligned})
        Fftw<T>::destroy(plan);
  }
};

template <typename T>
PlanCache<T>& plan_cache() {
  static PlanCache<T> cache;
  return cache;
}

template <typename T>
std::list<PlanSet<T, RealFftLayout>>& cache_list(const RealFftLayout&) {
  return plan_cache<T>().real;
}

template <typename T>
std::list<PlanSet<T, ComplexFftLayout>>& cache_list(const ComplexFftLayout&) {
  return plan_cache<T>().complex;
}

template <typename T, typename Layout>
const PlanSet<T, Layout>& find_or_make(const Layout& layout) {
  std::lock_guard<std::mutex> lock(g_planner_mutex);
  auto& entries = cache_list<T>(layout);
  for (const PlanSet<T, Layout>& set : entries)
    if (set.layout == layout) return set;
  entries.push_back(make_plans<T>(layout));
  return entries.back();
}

}  // namespace

void set_fft_effort(FftEffort effort) { g_effort.store(effort); }

template <typename T>
RealFftPlan<T> RealFftPlan<T>::get(const RealFftLayout& layout) {
  const PlanSet<T, RealFftLayout>& set = find_or_make<T>(layout);
  return RealFftPlan<T>(&set.layout, &set);
}

template <typename T>
void RealFftPlan<T>::forward(const T* real, std::complex<T>* spectrum) const {
  using F = Fftw<T>;
  const auto* set = static_cast<const PlanSet<T, RealFftLayout>*>(plans_);
  T* in = const_cast<T*>(real);  // r2c without FFTW_DESTROY_INPUT leaves the input intact
  auto* out = reinterpret_cast<typename F::Complex*>(spectrum);
  const bool aligned = F::alignment_of(in) == 0 && F::alignment_of(reinterpret_cast<T*>(out)) == 0;
  F::execute_r2c(aligned ? set->forward_aligned : set->forward_unaligned, in, out);
}

template <typename T>
void RealFftPlan<T>::inverse(std::complex<T>* spectrum, T* real) const {
  using F = Fftw<T>;
  const auto* set = static_cast<const PlanSet<T, RealFftLayout>*>(plans_);
  auto* in = reinterpret_cast<typename F::Complex*>(spectrum);
  const bool aligned = F::alignment_of(real) == 0 && F::alignment_of(reinterpret_cast<T*>(in)) == 0;
  F::execute_c2r(aligned ? set->inverse_aligned : set->inverse_unaligned, in, real);
}

template <typename T>
ComplexFftPlan<T> ComplexFftPlan<T>::get(const ComplexFftLayout& layout) {
  const PlanSet<T, ComplexFftLayout>& set = find_or_make<T>(layout);
  return ComplexFftPlan<T>(&set.layout, &set);
}

namespace {

template <typename T>
void execute_complex(const void* plans, bool forward, const std::complex<T>* in,
                     std::complex<T>* out) {
  using F = Fftw<T>;
  const auto* set = static_cast<const PlanSet<T, ComplexFftLayout>*>(plans);
  check((in == out) == set->layout.in_place, "ComplexFftPlan: in ",
        in == out ? "==" : "!=", " out, but the layout is ",
        set->layout.in_place ? "in place" : "out of place");
  // An out-of-place c2c plan preserves its input (FFTW's default for c2c).
  auto* x = reinterpret_cast<typename F::Complex*>(const_cast<std::complex<T>*>(in));
  auto* y = reinterpret_cast<typename F::Complex*>(out);
  const bool aligned = F::alignment_of(reinterpret_cast<T*>(x)) == 0 &&
                       F::alignment_of(reinterpret_cast<T*>(y)) == 0;
  F::execute_dft(forward ? (aligned ? set->forward_aligned : set->forward_unaligned)
                         : (aligned ? set->inverse_aligned : set->inverse_unaligned),
                 x, y);
}

}  // namespace

template <typename T>
void ComplexFftPlan<T>::forward(const std::complex<T>* in, std::complex<T>* out) const {
  execute_complex<T>(plans_, true, in, out);
}

template <typename T>
void ComplexFftPlan<T>::inverse(const std::complex<T>* in, std::complex<T>* out) const {
  execute_complex<T>(plans_, false, in, out);
}

template class RealFftPlan<float>;
template class RealFftPlan<double>;
template class ComplexFftPlan<float>;
template class ComplexFftPlan<double>;

}  // namespace subquad
