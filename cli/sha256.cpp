// SHA-256 of a file (sha256.h): the FIPS 180-4 compression function over 64-byte blocks,
// read 1 MiB at a time. Checked against hashlib by tests/cli_workload_test.py.
#include "sha256.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>

#include "subquad/error.h"

namespace subquad::cli {
namespace {

constexpr std::array<uint32_t, 64> kRound = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

constexpr uint32_t rotate_right(uint32_t x, int bits) { return (x >> bits) | (x << (32 - bits)); }

class Sha256 {
 public:
  void update(const unsigned char* data, size_t size) {
    total_bytes_ += size;
    while (size > 0) {
      const size_t take = std::min(size, block_.size() - filled_);
      std::copy_n(data, take, block_.begin() + static_cast<std::ptrdiff_t>(filled_));
      filled_ += take;
      data += take;
      size -= take;
      if (filled_ == block_.size()) {
        compress();
        filled_ = 0;
      }
    }
  }

  std::string hex() {
    const uint64_t bits = total_bytes_ * 8;
    const unsigned char one = 0x80, zero = 0;
    update(&one, 1);
    while (filled_ != 56) update(&zero, 1);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(length, 8);
    std::string out;
    char digits[9];
    for (uint32_t word : state_) {
      std::snprintf(digits, sizeof(digits), "%08x", word);
      out += digits;
    }
    return out;
  }

 private:
  void compress() {
    std::array<uint32_t, 64> w{};
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(block_[4 * i]) << 24 | uint32_t(block_[4 * i + 1]) << 16 |
             uint32_t(block_[4 * i + 2]) << 8 | uint32_t(block_[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotate_right(w[i - 15], 7) ^ rotate_right(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotate_right(w[i - 2], 17) ^ rotate_right(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto [a, b, c, d, e, f, g, h] = state_;
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25)) +
                          ((e & f) ^ (~e & g)) + kRound[i] + w[i];
      const uint32_t t2 = (rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22)) +
                          ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const std::array<uint32_t, 8> round_out = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) state_[i] += round_out[i];
  }

  std::array<uint32_t, 8> state_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> block_{};
  size_t filled_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace

std::string sha256_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  check(bool(file), path, ": cannot be read");
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<char> chunk(kChunk);
  Sha256 hash;
  while (file) {
    file.read(chunk.data(), static_cast<std::streamsize>(kChunk));
    hash.update(reinterpret_cast<const unsigned char*>(chunk.data()), size_t(file.gcount()));
  }
  check(file.eof(), path, ": read failed");
  return hash.hex();
}

}  // namespace subquad::cli
