// GEMM dispatch: float32 to oneDNN's dnnl_sgemm (row-major, single call, it threads with
// OpenMP itself), float64 to a plain loop (tests and references only).
#include "common/gemm.h"

#include <dnnl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "subquad/error.h"

namespace subquad {
namespace {

// The operand stored row-major as [rows, cols], `ld` elements between rows, in the form
// sgemm accepts. BLAS requires ld >= cols even where no row is ever stepped over, while a
// view may carry any stride there: a lone row (torch hands a size-1 dimension over DLPack
// with stride 1) keeps its data and gets ld = cols; rows that overlap (a broadcast, stride
// 0) are copied into `packed`.
const float* sgemm_operand(const float* data, int64_t rows, int64_t cols, int64_t& ld,
                           std::vector<float>& packed) {
  if (ld >= cols && ld >= 1) return data;
  const int64_t row_length = std::max<int64_t>(cols, 1);
  if (rows == 1) {
    ld = row_length;
    return data;
  }
  packed.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) std::copy_n(data + i * ld, cols, packed.data() + i * cols);
  ld = row_length;
  return packed.data();
}

}  // namespace

void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // oneDNN rejects k = 0; the product is empty and C is only scaled
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  std::vector<float> packed_a, packed_b;
  a = trans_a == Transpose::no ? sgemm_operand(a, m, k, lda, packed_a)
                               : sgemm_operand(a, k, m, lda, packed_a);
  b = trans_b == Transpose::no ? sgemm_operand(b, k, n, ldb, packed_b)
                               : sgemm_operand(b, n, k, ldb, packed_b);
  if (m == 1) ldc = std::max(ldc, n);  // one output row: its stride is never used
  check(ldc >= n, "gemm: output rows overlap (ldc = ", ldc, " < n = ", n, ")");
  const dnnl_status_t status =
      dnnl_sgemm(trans_a == Transpose::yes ? 'T' : 'N', trans_b == Transpose::yes ? 'T' : 'N', m,
                 n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  check(status == dnnl_success, "gemm: oneDNN sgemm failed with status ",
        static_cast<int>(status), " for m = ", m, ", n = ", n, ", k = ", k);
}

void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  auto at = [&](int64_t i, int64_t p) { return trans_a == Transpose::yes ? a[p * lda + i] : a[i * lda + p]; };
  auto bt = [&](int64_t p, int64_t j) { return trans_b == Transpose::yes ? b[j * ldb + p] : b[p * ldb + j]; };
  for (int64_t i = 0; i < m; ++i) {
    double* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0 ? 0.0 : beta * row[j];
    for (int64_t p = 0; p < k; ++p) {
      const double scaled = alpha * at(i, p);
      for (int64_t j = 0; j < n; ++j) row[j] += scaled * bt(p, j);
    }
  }
}

void prepare_gemm() {
  // 16 x 16 x 16 goes through oneDNN's JIT driver (the tiniest shapes may not).
  constexpr int64_t kSide = 16;
  float a[kSide * kSide] = {}, b[kSide * kSide] = {}, c[kSide * kSide] = {};
  gemm(Transpose::no, Transpose::no, kSide, kSide, kSide, 1.0f, a, kSide, b, kSide, 0.0f, c, kSide);
}

const char* gemm_backend_description() {
  static const std::string description = [] {
    const dnnl_version_t* version = dnnl_version();
    return "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) +
           "." + std::to_string(version->patch) + " sgemm (cpu runtime: " +
           (version->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other") + ")";
  }();
  return description.c_str();
}

}  // namespace subquad
