// The CAT family's operators as the backends see them: what the boundary checks produce and
// dispatch (common/dispatch.h) hands to a backend. Shapes are checked, the volume is not
// zero. The CPU backend's run overloads are in cat.cpp (with CatFftLowerBound's),
// cat_avgkey.cpp, cat_causal.cpp and cat_causal_decoder.cpp.
#pragma once

#include "cat/cat_fft_lower_bound.h"
#include "common/dispatch.h"
#include "subquad/cat.h"

namespace subquad::cat_detail {

// z [B, N, H] (finite), v [B, N, H, Dv] -> out [B, N, H, Dv].
template <typename T>
struct CatForwardParams {
  View3<const T> z;
  View4<const T> v;
  CatOptions options;
  View4<T> out;
};

// z, v, dout [B, N, H, Dv] -> dz [B, N, H], dv [B, N, H, Dv].
template <typename T>
struct CatBackwardParams {
  View3<const T> z;
  View4<const T> v, dout;
  CatOptions options;
  View3<T> dz;
  View4<T> dv;
};

// q, k [B, N, H, D], v [B, N, H, Dv] -> out [B, N, H, Dv]; scale resolved.
template <typename T>
struct CatAvgKeyForwardParams {
  View4<const T> q, k, v;
  double scale;
  CatOptions cat;
  View4<T> out;
};

// q, k, v, dout [B, N, H, Dv] -> dq, dk [B, N, H, D], dv [B, N, H, Dv].
template <typename T>
struct CatAvgKeyBackwardParams {
  View4<const T> q, k, v, dout;
  double scale;
  CatOptions cat;
  View4<T> dq, dk, dv;
};

// z [B, N, H] (finite), v [B, N, H, Dv] -> out [B, N, H, Dv].
template <typename T>
struct CatCausalForwardParams {
  View3<const T> z;
  View4<const T> v;
  CatCausalOptions options;
  View4<T> out;
};

// z, v, the forward's out, dout [B, N, H, Dv] -> dz [B, N, H], dv [B, N, H, Dv].
template <typename T>
struct CatCausalBackwardParams {
  View3<const T> z;
  View4<const T> v, out, dout;
  CatCausalOptions options;
  View3<T> dz;
  View4<T> dv;
};

// The transforms of CatFftLowerBound over rows [heads, signals, distance] of T (real columns)
// or of std::complex<T> in units of two T (packed pairs) -> inverse, laid out alike.
template <typename T>
struct CatFftLowerBoundParams {
  CatFftPacking packing;
  int64_t heads, length, signals, distance;
  const T* rows;
  T* inverse;
};

// cat_causal_decode: z [B, S, H], v [B, S, H, Dv] -> out [B, T, H, Dv], the causal CAT
// rows S - T .. S - 1 (checked by cat_causal_decode).
template <typename T>
struct CatDecodeParams {
  View3<const T> z;
  View4<const T> v;
  View4<T> out;
};

}  // namespace subquad::cat_detail

namespace subquad::cpu {

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatFftLowerBoundParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatDecodeParams<T>& params);

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatBackwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatAvgKeyForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatAvgKeyBackwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatCausalForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatCausalBackwardParams<T>& params);

}  // namespace subquad::cpu
