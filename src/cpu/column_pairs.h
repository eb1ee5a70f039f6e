// Moves between token-major data (each token's channels contiguous, tokens anywhere) and
// contiguous per-channel rows that FFTs run over, with software prefetch; and the same for
// channel pairs packed as complex rows. A real filter acts on the two channels of a pair
// separately through one complex transform (conv(s, x + i y) = conv(s, x) + i conv(s, y)), and
// FFTW's complex transforms run faster per channel than its real ones. Used by the CAT and the
// 2D circulant kernels. Reference: the scalar loops below (element by element), which also
// handle edge tiles.
#pragma once

#include <algorithm>
#include <complex>
#include <cstdint>
#include <type_traits>

#include "cpu/transpose.h"

namespace subquad {

// Tokens ahead of the current tile that the gathers and scatters prefetch. The hardware
// prefetchers do not follow a head's segments H Dv floats apart (CAT's [B, N, H, Dv]); without it,
// the gather and scatter ran at about 9 GB/s from L3 (forward, Dv = 64, N = 16384: 3.38 ms
// without, 3.13 ms with 64 tokens, 16 columns per pass; 16 / 32 / 64 / 128 tokens within 5% of each
// other).
inline constexpr int64_t kPrefetchTokens = 32;

// Prefetches the `bytes` (<= 64) at `address`, a range that may straddle two cache lines.
inline void prefetch_segment(const void* address, int64_t bytes, bool for_write) {
  const char* first = static_cast<const char*>(address);
  if (for_write) {
    __builtin_prefetch(first, 1);
    __builtin_prefetch(first + bytes - 1, 1);
  } else {
    __builtin_prefetch(first, 0);
    __builtin_prefetch(first + bytes - 1, 0);
  }
}

// Moves a full tile (8 tokens x 8 float pairs) through AVX-512 (or AVX) registers; false,
// moving nothing, for other tiles, which the caller moves element by element.
template <typename T, typename Source, typename Target>
bool move_full_pair_tile([[maybe_unused]] const Source* const* src,
                         [[maybe_unused]] Target* const* dst, [[maybe_unused]] int64_t tokens,
                         [[maybe_unused]] int64_t channels) {
#ifdef __AVX__
  if constexpr (std::is_same_v<T, float>) {
    if (tokens == kTransposeTile && channels == 2 * kTransposeTile) {
      transpose8x8_64bit(reinterpret_cast<const void* const*>(src),
                         reinterpret_cast<void* const*>(dst));
      return true;
    }
  }
#endif
  return false;
}

// One tile: dst[k][r] = x + i y with x = src[r][2k], y = src[r][2k + 1] (0 past `channels`),
// for r < tokens <= 8 token rows and 2k < channels <= 16.
template <typename T>
void gather_pair_tile(const T* const* src, int64_t tokens, int64_t channels,
                      std::complex<T>* const* dst) {
  if (move_full_pair_tile<T>(src, dst, tokens, channels)) return;
  for (int64_t k = 0; 2 * k < channels; ++k)
    for (int64_t r = 0; r < tokens; ++r)
      dst[k][r] = {src[r][2 * k], 2 * k + 1 < channels ? src[r][2 * k + 1] : T(0)};
}

// The inverse of gather_pair_tile: dst[r][2k] = real(src[k][r]), dst[r][2k + 1] = imag(...)
// while 2k + 1 < channels.
template <typename T>
void scatter_pair_tile(const std::complex<T>* const* src, int64_t tokens, int64_t channels,
                       T* const* dst) {
  if (move_full_pair_tile<T>(src, dst, tokens, channels)) return;
  for (int64_t r = 0; r < tokens; ++r)
    for (int64_t k = 0; 2 * k < channels; ++k) {
      dst[r][2 * k] = src[k][r].real();
      if (2 * k + 1 < channels) dst[r][2 * k + 1] = src[k][r].imag();
    }
}

// Prefetches channels [k0, k0 + channels) of the `tokens` rows kPrefetchTokens after `first`,
// stopping at token `end`.
template <typename T, typename RowOf>
void prefetch_tile(RowOf row_of, int64_t first, int64_t tokens, int64_t end, int64_t k0,
                   int64_t channels, bool for_write) {
  for (int64_t r = first + kPrefetchTokens; r < std::min(end, first + kPrefetchTokens + tokens);
       ++r)
    prefetch_segment(row_of(r) + k0, channels * static_cast<int64_t>(sizeof(T)), for_write);
}

// rows[p * distance + n] = x + i y with x = row_of(n)[2p] and y = row_of(n)[2p + 1] (0 past
// `count`, an odd count), for p < (count + 1) / 2 and n < tokens. row_of(n) points to token n's
// first channel. Tiles of 8 tokens x 8 pairs, one cache line of each token (float).
template <typename T, typename RowOf>
void gather_column_pairs(RowOf row_of, int64_t tokens, int64_t count, int64_t distance,
                         std::complex<T>* rows) {
  for (int64_t n0 = 0; n0 < tokens; n0 += kTransposeTile) {
    const int64_t tile_tokens = std::min(kTransposeTile, tokens - n0);
    for (int64_t k0 = 0; k0 < count; k0 += 2 * kTransposeTile) {
      const int64_t channels = std::min(2 * kTransposeTile, count - k0);
      const T* src[kTransposeTile];
      std::complex<T>* dst[kTransposeTile];
      for (int64_t r = 0; r < tile_tokens; ++r) src[r] = row_of(n0 + r) + k0;
      for (int64_t k = 0; k < (channels + 1) / 2; ++k) dst[k] = rows + (k0 / 2 + k) * distance + n0;
      prefetch_tile<T>(row_of, n0, tile_tokens, tokens, k0, channels, false);
      gather_pair_tile(src, tile_tokens, channels, dst);
    }
  }
}

// The inverse move: row_of(n)[2p] = real(rows[p * distance + n]) and, for 2p + 1 < count,
// row_of(n)[2p + 1] = imag(...). Tokens in the outer loop so each token's cache line is
// completed while in L1.
template <typename T, typename RowOf>
void scatter_column_pairs(const std::complex<T>* rows, int64_t distance, int64_t tokens,
                          int64_t count, RowOf row_of) {
  for (int64_t n0 = 0; n0 < tokens; n0 += kTransposeTile) {
    const int64_t tile_tokens = std::min(kTransposeTile, tokens - n0);
    for (int64_t k0 = 0; k0 < count; k0 += 2 * kTransposeTile) {
      const int64_t channels = std::min(2 * kTransposeTile, count - k0);
      const std::complex<T>* src[kTransposeTile];
      T* dst[kTransposeTile];
      for (int64_t k = 0; k < (channels + 1) / 2; ++k) src[k] = rows + (k0 / 2 + k) * distance + n0;
      for (int64_t r = 0; r < tile_tokens; ++r) dst[r] = row_of(n0 + r) + k0;
      prefetch_tile<T>(row_of, n0, tile_tokens, tokens, k0, channels, true);
      scatter_pair_tile(src, tile_tokens, channels, dst);
    }
  }
}

}  // namespace subquad
