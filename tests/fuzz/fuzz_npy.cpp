// libFuzzer target: the .npy loader on arbitrary bytes. Every input must either load (and
// then survive a save/load round trip unchanged) or fail with subquad::Error or OutOfMemory;
// a crash, a hang, a sanitizer report or any other exception is a bug. Built and run by
// scripts/fuzz.sh on the corpus in tests/fuzz/npy_corpus.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/npy.h"
#include "subquad/error.h"

namespace {

std::string scratch_path(const char* name) {
  return "/tmp/subquad_fuzz_npy_" + std::to_string(::getpid()) + name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string input = scratch_path(".npy");
  static const std::string copy = scratch_path("_copy.npy");
  std::FILE* file = std::fopen(input.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  try {
    const subquad::NpyArray array = subquad::load_npy(input);
    // What loads must save and load back to the same shape and bytes.
    subquad::save_npy(copy, array);
    const subquad::NpyArray again = subquad::load_npy(copy);
    if (again.shape != array.shape || again.bytes != array.bytes || again.dtype != array.dtype)
      std::abort();
  } catch (const subquad::Error&) {
  } catch (const subquad::OutOfMemory&) {
  }
  return 0;
}
