// Row-major GEMM: C[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C.
// float32 runs on oneDNN's sgemm (chosen by measurement, see docs/blas.md); float64 is a
// plain blocked loop used by references and tests, where speed does not matter.
#pragma once

#include <cstdint>

namespace subquad {

enum class Transpose { no, yes };

void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// Generates oneDNN's sgemm kernels now rather than at the first gemm call. oneDNN maps
// memory for its JIT code once, at first use, and crashes instead of reporting when that
// mapping fails (under an address-space limit, say). Calling this at start-up, before large
// inputs are read, turns a later shortage into a clean std::bad_alloc from our own buffers.
void prepare_gemm();

// "oneDNN 2.6.3 (cpu isa: ...)": printed by the CLI at start-up.
const char* gemm_backend_description();

}  // namespace subquad
