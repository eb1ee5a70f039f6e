// Column-batched power-of-two FFTs (fft_columns.h): Stockham passes over "elements", each one
// row of a column group (kColumnLanes real parts, then kColumnLanes imaginary parts), so a
// butterfly is the same vertical SIMD arithmetic for kColumnLanes signals at once.
//
// Stockham pass (radix 4, sub-length m, stride s = n / m, forward W_m = e^{-2 pi i / m}):
//   a, b, c, d = x[q + s (p + j m / 4)], j = 0..3;  for p < m / 4, q < s:
//   y[q + s 4p]       = (a + c) + (b + d)
//   y[q + s (4p + 1)] = W_m^p  ((a - c) - i (b - d))
//   y[q + s (4p + 2)] = W_m^2p ((a + c) - (b + d))
//   y[q + s (4p + 3)] = W_m^3p ((a - c) + i (b - d))
// and radix 2 likewise; after the last pass y holds the spectrum in natural order.
//
// Four-step for n = n1 n2, input index t = n2 t1 + t2, output k = k1 + n1 k2:
//   1. for each t2: length-n1 transform over t1, times W_n^{t2 k1}, to Y[k1 n2 + t2];
//   2. for each k1: length-n2 transform of the contiguous Y[k1 n2 ..] to X[k1 + n1 k2].
// The inverse is swap(forward(swap(x))) with swap exchanging real and imaginary parts, which
// in this layout is a choice of offsets at the first load and the last store; its four-step
// (the forward one with n1 and n2 exchanged) reads the spectrum with stride n1, so the filter
// product fuses steps 2 and the inverse's first step on one contiguous block in cache.
#include "common/fft_columns.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <mutex>
#include <numbers>
#include <utility>

#include "subquad/error.h"

namespace subquad {
namespace {

using Vf = float __attribute__((vector_size(kColumnLanes * sizeof(float))));

// Neighbouring columns t2 the four-step's strided steps transform side by side (n2 >= 32 is a
// multiple): runs of 8 elements (512 bytes of a group) per access instead of single ones.
constexpr int64_t kSplitBatch = 8;

inline Vf load(const float* p) {
  Vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vf v) { std::memcpy(p, &v, sizeof v); }
inline Vf splat(float x) {
#if defined(__AVX512F__)
  return Vf(_mm512_set1_ps(x));
#elif defined(__AVX__)
  return Vf(_mm256_set1_ps(x));
#else
  Vf v;
  for (int j = 0; j < kColumnLanes; ++j) v[j] = x;
  return v;
#endif
}

// a b + c and a b - c with one rounding where the machine has FMA (the build has no global
// contraction).
inline Vf fmadd(Vf a, Vf b, Vf c) {
#if defined(__AVX512F__)
  return Vf(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c)));
#elif defined(__FMA__)
  return Vf(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c)));
#else
  return a * b + c;
#endif
}
inline Vf fmsub(Vf a, Vf b, Vf c) {
#if defined(__AVX512F__)
  return Vf(_mm512_fmsub_ps(__m512(a), __m512(b), __m512(c)));
#elif defined(__FMA__)
  return Vf(_mm256_fmsub_ps(__m256(a), __m256(b), __m256(c)));
#else
  return a * b - c;
#endif
}

struct Cv {  // kColumnLanes complex numbers, split
  Vf re, im;
};
inline Cv operator+(Cv a, Cv b) { return {a.re + b.re, a.im + b.im}; }
inline Cv operator-(Cv a, Cv b) { return {a.re - b.re, a.im - b.im}; }
// x w for one complex scalar w = (wr, wi) in every lane.
inline Cv times(Cv x, Vf wr, Vf wi) { return {fmsub(x.re, wr, x.im * wi), fmadd(x.re, wi, x.im * wr)}; }

// Every accessor addresses element i of transform b of a batch of sub-transforms run side by
// side (b < batch, the passes' innermost loop): the four-step's strided steps take a few
// neighbouring columns at once, so memory is read and written in runs of `batch` elements.

// The scratch buffers of a sub-transform: element (i, b) at (i batch + b) kColumnGroup.
struct Dense {
  float* p;
  int64_t batch;
  float* at(int64_t i, int64_t b) const { return p + (i * batch + b) * kColumnGroup; }
  Cv load(int64_t i, int64_t b) const {
    const float* e = at(i, b);
    return {subquad::load(e), subquad::load(e + kColumnLanes)};
  }
  void store(int64_t i, int64_t b, Cv x) const {
    float* e = at(i, b);
    subquad::store(e, x.re);
    subquad::store(e + kColumnLanes, x.im);
  }
};

// Element i of a column group in row-major memory at p + i stride (the caller's arrays, or the
// four-step's Y); re_offset / im_offset are 0 / kColumnLanes, or swapped (the inverse).
struct Rows {
  float* p;
  int64_t stride;
  int re_offset, im_offset;
  int64_t batch_stride = 0;  // between transform b and b + 1

  // Element i of this view is element first + i step; transform b starts b batch_step later.
  Rows at(int64_t first, int64_t step, int64_t batch_step = 0) const {
    return {p + first * stride, stride * step, re_offset, im_offset, stride * batch_step};
  }
  Cv load(int64_t i, int64_t b) const {
    const float* row = p + i * stride + b * batch_stride;
    return {subquad::load(row + re_offset), subquad::load(row + im_offset)};
  }
  void store(int64_t i, int64_t b, Cv x) const {
    float* row = p + i * stride + b * batch_stride;
    subquad::store(row + re_offset, x.re);
    subquad::store(row + im_offset, x.im);
  }
};

// A sink that multiplies element (i, b) by twiddle[i step + b batch_step] (interleaved re, im)
// on its way out.
template <typename Sink>
struct Twiddled {
  Sink sink;
  const float* twiddle;
  int64_t step, batch_step;
  void store(int64_t i, int64_t b, Cv x) const {
    const float* w = twiddle + 2 * (i * step + b * batch_step);
    sink.store(i, b, times(x, splat(w[0]), splat(w[1])));
  }
};

// A sink that multiplies element i by filter[i * step] and swaps real and imaginary parts:
// the product's way into the inverse transform.
template <typename Sink>
struct Filtered {
  Sink sink;
  const std::complex<float>* filter;
  int64_t step;
  void store(int64_t i, int64_t b, Cv x) const {
    const std::complex<float> w = filter[i * step];
    const Cv y = times(x, splat(w.real()), splat(w.imag()));
    sink.store(i, b, {y.im, y.re});
  }
};

// One radix-4 pass; `unit` when m == 4 (its only twiddles are 1).
// Source and sink are taken by value: local copies the stores cannot alias.
template <bool unit, int64_t batch, typename Source, typename Sink>
void radix4_pass(const Source x, const Sink y, int64_t m, int64_t s, const float* twiddles) {
  const int64_t m4 = m / 4;
  for (int64_t p = 0; p < m4; ++p) {
    const float* w = twiddles + 6 * p;
    const Vf w1r = splat(w[0]), w1i = splat(w[1]), w2r = splat(w[2]), w2i = splat(w[3]),
             w3r = splat(w[4]), w3i = splat(w[5]);
    for (int64_t q = 0; q < s; ++q)
      for (int64_t t = 0; t < batch; ++t) {
      const Cv a = x.load(q + s * p, t), b = x.load(q + s * (p + m4), t);
      const Cv c = x.load(q + s * (p + 2 * m4), t), d = x.load(q + s * (p + 3 * m4), t);
      const Cv apc = a + c, amc = a - c, bpd = b + d, bmd = b - d;
      const Cv y0 = apc + bpd, y2 = apc - bpd;
      const Cv y1 = {amc.re + bmd.im, amc.im - bmd.re};  // (a - c) - i (b - d)
      const Cv y3 = {amc.re - bmd.im, amc.im + bmd.re};  // (a - c) + i (b - d)
      const int64_t out = q + s * 4 * p;
      if constexpr (unit) {
        y.store(out, t, y0);
        y.store(out + s, t, y1);
        y.store(out + 2 * s, t, y2);
        y.store(out + 3 * s, t, y3);
      } else {
        y.store(out, t, y0);
        y.store(out + s, t, times(y1, w1r, w1i));
        y.store(out + 2 * s, t, times(y2, w2r, w2i));
        y.store(out + 3 * s, t, times(y3, w3r, w3i));
      }
    }
  }
}

template <bool unit, int64_t batch, typename Source, typename Sink>
void radix2_pass(const Source x, const Sink y, int64_t m, int64_t s, const float* twiddles) {
  const int64_t m2 = m / 2;
  for (int64_t p = 0; p < m2; ++p) {
    const Vf wr = splat(twiddles[2 * p]), wi = splat(twiddles[2 * p + 1]);
    for (int64_t q = 0; q < s; ++q)
      for (int64_t t = 0; t < batch; ++t) {
        const Cv a = x.load(q + s * p, t), b = x.load(q + s * (p + m2), t);
        const int64_t out = q + s * 2 * p;
        y.store(out, t, a + b);
        if constexpr (unit)
          y.store(out + s, t, a - b);
        else
          y.store(out + s, t, times(a - b, wr, wi));
      }
  }
}

template <int64_t batch, typename Source, typename Sink>
void run_stage(const ColumnFft::SubPlan& plan, size_t index, const Source& x, const Sink& y) {
  const ColumnFft::Stage& stage = plan.stages[index];
  const int64_t s = plan.n / stage.m;
  const float* w = plan.twiddles.data() + stage.twiddle_offset;
  if (stage.radix == 4) {
    if (stage.m == 4)
      radix4_pass<true, batch>(x, y, stage.m, s, w);
    else
      radix4_pass<false, batch>(x, y, stage.m, s, w);
  } else {
    if (stage.m == 2)
      radix2_pass<true, batch>(x, y, stage.m, s, w);
    else
      radix2_pass<false, batch>(x, y, stage.m, s, w);
  }
}

// The forward transforms of `batch` groups of plan.n elements each from `source` to `sink`,
// ping-ponging between a and b (plan.n batch elements each) in between.
template <int64_t batch = 1, typename Source, typename Sink>
void sub_fft(const ColumnFft::SubPlan& plan, const Source& source, const Sink& sink, float* a,
             float* b) {
  const size_t passes = plan.stages.size();
  if (passes == 0) {
    for (int64_t t = 0; t < batch; ++t) sink.store(0, t, source.load(0, t));
    return;
  }
  if (passes == 1) {
    run_stage<batch>(plan, 0, source, sink);
    return;
  }
  run_stage<batch>(plan, 0, source, Dense{a, batch});
  for (size_t i = 1; i + 1 < passes; ++i) {
    run_stage<batch>(plan, i, Dense{a, batch}, Dense{b, batch});
    std::swap(a, b);
  }
  run_stage<batch>(plan, passes - 1, Dense{a, batch}, sink);
}

// e^{-2 pi i k / m} in double, k reduced first so large products stay exact.
std::complex<double> root(int64_t k, int64_t m) {
  const double angle = -2 * std::numbers::pi * static_cast<double>(k % m) / static_cast<double>(m);
  return {std::cos(angle), std::sin(angle)};
}

ColumnFft::SubPlan make_sub_plan(int64_t n) {
  ColumnFft::SubPlan plan;
  plan.n = n;
  int log2n = 0;
  while ((int64_t(1) << log2n) < n) ++log2n;
  int64_t m = n;
  auto add = [&](int radix) {
    plan.stages.push_back({radix, m, static_cast<int64_t>(plan.twiddles.size())});
    for (int64_t p = 0; p < m / radix; ++p)
      for (int j = 1; j < radix; ++j) {
        const std::complex<double> w = root(j * p, m);
        plan.twiddles.push_back(static_cast<float>(w.real()));
        plan.twiddles.push_back(static_cast<float>(w.imag()));
      }
    m /= radix;
  };
  if (log2n % 2 == 1) add(2);  // the odd factor first: every later pass is radix 4
  while (m > 1) add(4);
  return plan;
}

}  // namespace

ColumnFft::ColumnFft(int64_t n) : n_(n), n1_(n), n2_(1) {
  if (n > kColumnFftDirectMax) {
    int log2n = 0;
    while ((int64_t(1) << log2n) < n) ++log2n;
    n1_ = int64_t(1) << (log2n / 2);  // n2 >= n1: the contiguous second step is the longer
    n2_ = n / n1_;
    second_ = make_sub_plan(n2_);
    split_twiddles_.resize(2 * n);
    for (int64_t a = 0; a < n2_; ++a)
      for (int64_t b = 0; b < n1_; ++b) {
        const std::complex<double> w = root(a * b, n);
        split_twiddles_[2 * (a * n1_ + b)] = static_cast<float>(w.real());
        split_twiddles_[2 * (a * n1_ + b) + 1] = static_cast<float>(w.imag());
      }
  }
  first_ = make_sub_plan(n1_);
}

class ColumnFftCache {
 public:
  static const ColumnFft& get(int64_t n) {
    static std::mutex mutex;
    static std::list<ColumnFft> plans;  // a list: entries never move
    std::lock_guard<std::mutex> lock(mutex);
    for (const ColumnFft& plan : plans)
      if (plan.size() == n) return plan;
    plans.push_back(ColumnFft(n));
    return plans.back();
  }
};

const ColumnFft& ColumnFft::get(int64_t n) {
  check(n >= 1 && n <= (int64_t(1) << 24) && (n & (n - 1)) == 0,
        "ColumnFft: n must be a power of two in [1, 2^24], got ", n);
  return ColumnFftCache::get(n);
}

int64_t ColumnFft::scratch_floats() const {
  // Four-step: Y [n], the sub-transforms' a, b [max(n1, n2) batch] and the filter's block c
  // [n2]; direct: a, b and c [n]. Both: a staging copy [n] of a partial group.
  const int64_t elements =
      n2_ == 1 ? 4 * n_ : 2 * n_ + 2 * std::max(n1_, n2_) * kSplitBatch + n2_;
  return elements * kColumnGroup;
}

namespace {

// One column group of the caller's memory, or of the staging copy where the group is partial.
class Group {
 public:
  // columns [first, first + count) of [n, stride] memory at p; staging [n, kColumnGroup].
  Group(const float* p, int64_t stride, int64_t first, int64_t count, int64_t n, float* staging)
      : p_(const_cast<float*>(p) + first), stride_(stride), count_(std::min(count - first,
        int64_t(kColumnGroup))), n_(n), staging_(staging) {}
  bool partial() const { return count_ < kColumnGroup; }
  // Rows to read or write the group; swapped: real and imaginary parts exchanged.
  Rows rows(bool swapped) const {
    const int re = swapped ? kColumnLanes : 0, im = swapped ? 0 : kColumnLanes;
    return partial() ? Rows{staging_, kColumnGroup, re, im} : Rows{p_, stride_, re, im};
  }
  void stage_in() const {  // missing columns as zeros
    for (int64_t t = 0; t < n_; ++t)
      for (int64_t c = 0; c < kColumnGroup; ++c)
        staging_[t * kColumnGroup + c] = c < count_ ? p_[t * stride_ + c] : 0.0f;
  }
  void stage_out() const {
    for (int64_t t = 0; t < n_; ++t)
      for (int64_t c = 0; c < count_; ++c) p_[t * stride_ + c] = staging_[t * kColumnGroup + c];
  }

 private:
  float* p_;
  int64_t stride_, count_, n_;
  float* staging_;
};

Rows dense_rows(float* p) { return {p, kColumnGroup, 0, kColumnLanes}; }

}  // namespace

// The steps below run one column group at a time; those with a strided side take kSplitBatch
// neighbouring transforms at once (t2, or k1 where the spectrum is read or written). Y is the four-step's [n] elements, a and b the
// sub-transforms' ping-pong buffers.
void ColumnFft::forward(const float* real, int64_t real_stride, int64_t columns, float* spectrum,
                        int64_t spectrum_stride, float* scratch) const {
  const int64_t buffer = std::max(n1_, n2_) * kSplitBatch * kColumnGroup;
  float* staging = scratch;
  float* work = scratch + n_ * kColumnGroup;
  for (int64_t first = 0; first < columns; first += kColumnGroup) {
    const Group source(real, real_stride, first, columns, n_, staging);
    if (source.partial()) source.stage_in();
    const Rows in = source.rows(false);
    // A packed spectrum always has the group's kColumnGroup columns.
    const Rows out{spectrum + first, spectrum_stride, 0, kColumnLanes};
    if (n2_ == 1) {
      sub_fft(first_, in, out, work, work + n_ * kColumnGroup);
      continue;
    }
    const Rows y = dense_rows(work);
    float* a = work + n_ * kColumnGroup;
    float* b = a + buffer;
    const float* twiddles = split_twiddles_.data();
    for (int64_t t2 = 0; t2 < n2_; t2 += kSplitBatch)
      sub_fft<kSplitBatch>(first_, in.at(t2, n2_, 1),
                           Twiddled<Rows>{y.at(t2, n2_, 1), twiddles + 2 * t2 * n1_, 1, n1_}, a, b);
    for (int64_t k1 = 0; k1 < n1_; k1 += kSplitBatch)
      sub_fft<kSplitBatch>(second_, y.at(k1 * n2_, 1, n2_), out.at(k1, n1_, 1), a, b);
  }
}

void ColumnFft::inverse(const float* spectrum, int64_t spectrum_stride, int64_t columns,
                        float* real, int64_t real_stride, float* scratch) const {
  const int64_t buffer = std::max(n1_, n2_) * kSplitBatch * kColumnGroup;
  float* staging = scratch;
  float* work = scratch + n_ * kColumnGroup;
  for (int64_t first = 0; first < columns; first += kColumnGroup) {
    const Rows in{const_cast<float*>(spectrum) + first, spectrum_stride, kColumnLanes, 0};
    const Group sink(real, real_stride, first, columns, n_, staging);
    const Rows out = sink.rows(true);
    if (n2_ == 1) {
      sub_fft(first_, in, out, work, work + n_ * kColumnGroup);
    } else {
      const Rows y = dense_rows(work);
      float* a = work + n_ * kColumnGroup;
      float* b = a + buffer;
      const float* twiddles = split_twiddles_.data();
      // Y[k1 n2 + k1'] = W_n^{k1 k1'} (length-n2 transform over k2 of X[k1 + n1 k2])[k1'].
      for (int64_t k1 = 0; k1 < n1_; k1 += kSplitBatch)
        sub_fft<kSplitBatch>(second_, in.at(k1, n1_, 1),
                             Twiddled<Rows>{y.at(k1 * n2_, 1, n2_), twiddles + 2 * k1, n1_, 1},
                             a, b);
      for (int64_t t2 = 0; t2 < n2_; t2 += kSplitBatch)
        sub_fft<kSplitBatch>(first_, y.at(t2, n2_, 1), out.at(t2, n2_, 1), a, b);
    }
    if (sink.partial()) sink.stage_out();
  }
}

void ColumnFft::filter(const float* in, int64_t in_stride, int64_t columns,
                       const std::complex<float>* filter, float* out, int64_t out_stride,
                       float* scratch) const {
  const int64_t buffer = std::max(n1_, n2_) * kSplitBatch * kColumnGroup;
  float* staging = scratch;  // shared by a partial group's input and output: read, then written
  float* work = scratch + n_ * kColumnGroup;
  for (int64_t first = 0; first < columns; first += kColumnGroup) {
    const Group input(in, in_stride, first, columns, n_, staging);
    const Group output(out, out_stride, first, columns, n_, staging);
    if (input.partial()) input.stage_in();
    const Rows source = input.rows(false), sink = output.rows(true);
    if (n2_ == 1) {
      float* a = work;
      float* b = a + n_ * kColumnGroup;
      float* c = b + n_ * kColumnGroup;
      sub_fft(first_, source, Filtered<Dense>{Dense{c, 1}, filter, 1}, a, b);
      sub_fft(first_, Dense{c, 1}, sink, a, b);
    } else {
      const Rows y = dense_rows(work);
      float* a = work + n_ * kColumnGroup;
      float* b = a + buffer;
      float* c = b + buffer;
      const float* twiddles = split_twiddles_.data();
      for (int64_t t2 = 0; t2 < n2_; t2 += kSplitBatch)
        sub_fft<kSplitBatch>(first_, source.at(t2, n2_, 1),
                             Twiddled<Rows>{y.at(t2, n2_, 1), twiddles + 2 * t2 * n1_, 1, n1_}, a,
                             b);
      // Per block k1: the forward's second step, the filter, the inverse's first step, in cache.
      for (int64_t k1 = 0; k1 < n1_; ++k1) {
        sub_fft(second_, y.at(k1 * n2_, 1), Filtered<Dense>{Dense{c, 1}, filter + k1, n1_}, a, b);
        sub_fft(second_, Dense{c, 1},
                Twiddled<Rows>{y.at(k1 * n2_, 1), twiddles + 2 * k1, n1_, 0}, a, b);
      }
      for (int64_t t2 = 0; t2 < n2_; t2 += kSplitBatch)
        sub_fft<kSplitBatch>(first_, y.at(t2, n2_, 1), sink.at(t2, n2_, 1), a, b);
    }
    if (output.partial()) output.stage_out();
  }
}

}  // namespace subquad
