// gemm: oneDNN float32 and the float64 loop against a direct triple loop, every transpose
// combination, odd sizes, leading dimensions wider than the rows, alpha and beta.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/gemm.h"
#include "common/test_support.h"
#include "subquad/error.h"

namespace subquad {
namespace {

template <typename T>
void check_gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, T alpha, T beta) {
  const int64_t pad = 3;  // leading dimensions larger than the logical rows
  const int64_t a_rows = ta == Transpose::no ? m : k, a_cols = ta == Transpose::no ? k : m;
  const int64_t b_rows = tb == Transpose::no ? k : n, b_cols = tb == Transpose::no ? n : k;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  const auto a = testing::random_vector<T>(a_rows * lda, 1);
  const auto b = testing::random_vector<T>(b_rows * ldb, 2);
  auto c = testing::random_vector<T>(m * ldc, 3);
  std::vector<double> expected(c.begin(), c.end());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta == Transpose::no ? a[i * lda + p] : a[p * lda + i];
        const double y = tb == Transpose::no ? b[p * ldb + j] : b[j * ldb + p];
        sum += x * y;
      }
      expected[i * ldc + j] = alpha * sum + beta * expected[i * ldc + j];
    }
  gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  // Each entry is a k-term dot product of values in [-1, 1]: error <= k * eps * k-ish bound.
  const double eps = std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const double bound = j < n ? 2.0 * (k + 2) * eps * (std::abs(alpha) * k + 1) : 0.0;
      ASSERT_NEAR(c[i * ldc + j], expected[i * ldc + j], bound) << i << "," << j;
    }
}

TEST(Gemm, AllTransposesOddSizes) {
  for (Transpose ta : {Transpose::no, Transpose::yes})
    for (Transpose tb : {Transpose::no, Transpose::yes})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5},
                             {64, 33, 97}, {130, 17, 64}}) {
        check_gemm<float>(ta, tb, m, n, k, 1.0f, 0.0f);
        check_gemm<float>(ta, tb, m, n, k, -0.5f, 2.0f);
        check_gemm<double>(ta, tb, m, n, k, 1.5, 0.5);
      }
}

// Leading dimensions that BLAS refuses but views have: a lone row with any stride (torch
// gives a size-1 dimension stride 1 over DLPack) and rows that overlap (a broadcast, stride
// 0). The product is the one of the same values stored with ordinary leading dimensions.
TEST(Gemm, LoneRowsAndBroadcastRowsTakeAnyLeadingDimension) {
  const int64_t m = 5, n = 4, k = 8;
  const auto a = testing::random_vector<float>(m * k, 1);
  const auto b = testing::random_vector<float>(k * n, 2);
  auto product = [&](const float* a_data, int64_t lda, const float* b_data, int64_t ldb,
                     Transpose tb, int64_t rows) {
    std::vector<float> c(static_cast<size_t>(rows * n), -1.0f);
    gemm(Transpose::no, tb, rows, n, k, 1.0f, a_data, lda, b_data, ldb, 0.0f, c.data(), n);
    return c;
  };
  // One query row whose stride is 1 (< k): what a [1, 1, H, D] torch tensor gives.
  const std::vector<float> one_row = product(a.data(), k, b.data(), n, Transpose::no, 1);
  EXPECT_EQ(product(a.data(), 1, b.data(), n, Transpose::no, 1), one_row);
  // m rows that are all the first row (lda = 0), against the row repeated in memory.
  std::vector<float> repeated(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) std::copy_n(a.data(), k, repeated.data() + i * k);
  EXPECT_EQ(product(a.data(), 0, b.data(), n, Transpose::no, m),
            product(repeated.data(), k, b.data(), n, Transpose::no, m));
  // A transposed B of one row (n = 1 stored as [1, k]) with ldb = 0, and a one-row output
  // whose ldc is below n.
  std::vector<float> c(1, -1.0f), expected(1, -1.0f);
  gemm(Transpose::no, Transpose::yes, 1, 1, k, 1.0f, a.data(), 0, b.data(), 0, 0.0f, c.data(), 0);
  gemm(Transpose::no, Transpose::yes, 1, 1, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
       expected.data(), 1);
  EXPECT_EQ(c, expected);
  for (float x : one_row) EXPECT_TRUE(std::isfinite(x) && x != -1.0f);
  // Output rows that overlap would race: refused.
  std::vector<float> out(static_cast<size_t>(m * n));
  EXPECT_THROW(gemm(Transpose::no, Transpose::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                    out.data(), 1),
               Error);
}

TEST(Gemm, EmptyProductsScaleC) {
  std::vector<float> c = {1, 2, 3, 4};
  gemm(Transpose::no, Transpose::no, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  EXPECT_NE(std::string(gemm_backend_description()).find("oneDNN"), std::string::npos);
}

}  // namespace
}  // namespace subquad
