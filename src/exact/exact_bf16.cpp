// The run-time choice of the bfloat16 exact-attention kernel. The one built is portable:
// it converts bfloat16 to float32 while packing tiles (exact_forward.cpp,
// exact_backward.cpp) and computes with the float32 tile kernels, on any CPU. Kernels with
// native bfloat16 products (AMX tiles, AVX-512 BF16's vdpbf16ps) are not written: the
// build and CI machines have neither, so they could not be run or tested (README.md).
// This is where they would be chosen, once per process, from the CPU's features.
#include "subquad/exact.h"

namespace subquad {
namespace {

enum class Bf16Kernel { portable };

struct Bf16Features {
  bool amx_bf16;     // AMX tiles with bfloat16 products (Linux also requires the process
                     // to request the tile state with arch_prctl before using them)
  bool avx512_bf16;  // vdpbf16ps on 512-bit vectors
};

Bf16Features detect_bf16_features() {
#if defined(__x86_64__) && defined(__GNUC__)
  return {__builtin_cpu_supports("amx-bf16") != 0, __builtin_cpu_supports("avx512bf16") != 0};
#else
  return {false, false};
#endif
}

// An AMX kernel would be taken first where amx_bf16 is set, an AVX-512 BF16 kernel where
// only avx512_bf16 is; with neither written, every CPU gets the portable kernel.
Bf16Kernel choose_bf16_kernel(const Bf16Features&) { return Bf16Kernel::portable; }

const Bf16Features& bf16_features() {
  static const Bf16Features features = detect_bf16_features();
  return features;
}

}  // namespace

const char* exact_bf16_kernel_name() {
  static const Bf16Kernel kernel = choose_bf16_kernel(bf16_features());
  switch (kernel) {
    case Bf16Kernel::portable:
      return "portable";
  }
  return "portable";
}

const char* exact_bf16_native_support() {
  if (bf16_features().amx_bf16) return "amx_bf16";
  if (bf16_features().avx512_bf16) return "avx512_bf16";
  return "none";
}

}  // namespace subquad
