// The run-time choice of the bfloat16 exact-attention kernel. The one built is portable:
// it converts bfloat16 to float32 while packing tiles (exact_forward.cpp,
// exact_backward.cpp) and computes with the float32 tile kernels, on any x86-64 or other
// CPU. Kernels with native bfloat16 products (AVX-512 BF16's vdpbf16ps, AMX tiles) are not
// written: the build and CI machines have neither, so they could not be run or tested
// here (README.md). This is where they would be chosen, once per process, by CPU feature.
#include "subquad/exact.h"

namespace subquad {
namespace {

enum class Bf16Kernel { portable };

Bf16Kernel choose_bf16_kernel() {
  // An AMX kernel would be taken where the CPU reports amx_bf16 (and the OS enables the
  // tile state), an AVX-512 BF16 one where it reports avx512_bf16; neither exists yet.
  return Bf16Kernel::portable;
}

}  // namespace

const char* exact_bf16_kernel_name() {
  static const Bf16Kernel kernel = choose_bf16_kernel();
  switch (kernel) {
    case Bf16Kernel::portable:
      return "portable";
  }
  return "portable";
}

}  // namespace subquad
