// MLBTC maps: low rank, MLR, BTT, Monarch and Kronecker as configurations, each checked
// against its dense matrix built independently; bad configurations throw.
#include <gtest/gtest.h>

#include <vector>

#include "common/test_support.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using testing::random_vector;
using Matrix = std::vector<double>;  // row-major

Matrix multiply(const Matrix& a, const Matrix& b, int64_t m, int64_t k, int64_t n) {
  Matrix c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}

// Dense block-diagonal matrix of `blocks` [count][rows x cols].
Matrix block_diagonal(const std::vector<Matrix>& blocks, int64_t rows, int64_t cols) {
  const int64_t count = static_cast<int64_t>(blocks.size());
  Matrix m(count * rows * count * cols, 0.0);
  for (int64_t k = 0; k < count; ++k)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        m[(k * rows + i) * count * cols + k * cols + j] = blocks[k][i * cols + j];
  return m;
}

// Dense gather permutation: (P z)[t] = z[perm[t]].
Matrix permutation(const std::vector<int64_t>& perm) {
  const int64_t n = static_cast<int64_t>(perm.size());
  Matrix m(n * n, 0.0);
  for (int64_t t = 0; t < n; ++t) m[t * n + perm[t]] = 1.0;
  return m;
}

void expect_same(const Matrix& a, const Matrix& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LT(testing::max_abs_diff(a, b), 1e-12);
  EXPECT_GT(testing::max_abs(a), 0.0);
}

TEST(Mlbtc, LowRank) {
  const int64_t n = 6, m = 5, r = 2;
  MlbtcLevel level;
  level.right = random_vector<double>(n * r, 41);  // R [1, n, r]
  level.right_cols = r;
  level.left = random_vector<double>(m * r, 42);   // L [1, m, r]
  const MlbtcMap map(n, m, {level});
  Matrix expected(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t c = 0; c < r; ++c) expected[i * n + j] += level.left[i * r + c] * level.right[j * r + c];
  expect_same(map.dense(), expected);
}

TEST(Mlbtc, MultiLevelLowRank) {
  const int64_t n = 8;
  const std::vector<int64_t> ranks{2, 1, 1};
  std::vector<MlbtcLevel> levels;
  Matrix expected(n * n, 0.0);
  for (size_t l = 0; l < ranks.size(); ++l) {
    const int64_t p = int64_t{1} << l, size = n / p, r = ranks[l];
    MlbtcLevel level;
    level.alpha = 0.5 + l;
    level.right_blocks = p;
    level.right_cols = r;
    level.right = random_vector<double>(n * r, 50 + l);
    level.left_blocks = p;
    level.left = random_vector<double>(n * r, 60 + l);
    for (int64_t k = 0; k < p; ++k)  // alpha_l blockdiag_k(L_k R_k^T)
      for (int64_t i = 0; i < size; ++i)
        for (int64_t j = 0; j < size; ++j)
          for (int64_t c = 0; c < r; ++c)
            expected[(k * size + i) * n + k * size + j] +=
                level.alpha * level.left[(k * size + i) * r + c] * level.right[(k * size + j) * r + c];
    levels.push_back(level);
  }
  expect_same(MlbtcMap(n, n, levels).dense(), expected);
}

TEST(Mlbtc, BlockTensorTrainEqualsBttProjection) {
  const int64_t D = 12, H = 2, s = 2;
  const BttFactors f = btt_factors(D);
  const int64_t a = f.a, b = f.b, width = H * b * s;
  const std::vector<double> w1 = random_vector<double>(a * b * width, 71);
  const std::vector<double> w2 = random_vector<double>(H * b * a * a * s, 72);
  MlbtcLevel level;
  level.right_blocks = a;  // stage 1: R[i, j, col] = W1[i, j, col]
  level.right_cols = width;
  level.right = w1;
  for (int64_t hb = 0; hb < H * b; ++hb)  // regroup (i, (hb, sigma)) -> (hb, (i, sigma))
    for (int64_t i = 0; i < a; ++i)
      for (int64_t sigma = 0; sigma < s; ++sigma) level.right_perm.push_back(i * width + hb * s + sigma);
  level.left_blocks = H * b;  // stage 2: L[hb, alpha, (i, sigma)] = W2[hb, alpha, (i, sigma)]
  level.left = w2;
  level.left_perm.resize(H * D);
  for (int64_t h = 0; h < H; ++h)  // y_h[alpha b + beta] = z[(h b + beta) a + alpha]
    for (int64_t alpha = 0; alpha < a; ++alpha)
      for (int64_t beta = 0; beta < b; ++beta)
        level.left_perm[h * D + alpha * b + beta] = (h * b + beta) * a + alpha;
  const MlbtcMap map(D, H * D, {level});

  // The projection (no LayerNorm, no capping) applied to the unit vectors.
  Matrix expected(H * D * D);
  const BttOptions options{H, s, false, false};
  std::vector<double> unit(D * D, 0.0), y(D * H * D);
  for (int64_t j = 0; j < D; ++j) unit[j * D + j] = 1.0;
  btt_project_forward<double>({}, View3<const double>(unit.data(), {1, D, D}),
                              View3<const double>(w1.data(), {a, b, width}),
                              View3<const double>(w2.data(), {H * b, a, a * s}), options,
                              View4<double>(y.data(), {1, D, H, D}));
  for (int64_t j = 0; j < D; ++j)
    for (int64_t o = 0; o < H * D; ++o) expected[o * D + j] = y[j * H * D + o];
  expect_same(map.dense(), expected);
}

// Monarch (Dao et al. 2022): M = P blockdiag(L) P^T blockdiag(R), P the reshape-transpose.
TEST(Mlbtc, Monarch) {
  const int64_t b = 3, n = b * b;
  std::vector<int64_t> transpose(n);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < b; ++j) transpose[i * b + j] = j * b + i;
  std::vector<Matrix> left_blocks, right_blocks;
  for (int64_t k = 0; k < b; ++k) {
    left_blocks.push_back(random_vector<double>(b * b, 80 + k));
    right_blocks.push_back(random_vector<double>(b * b, 90 + k));
  }
  MlbtcLevel level;
  level.right_blocks = b;
  level.right_cols = b;
  level.right.resize(n * b);
  for (int64_t k = 0; k < b; ++k)  // R[k, i, t] = Rblock_k[t, i]: blockdiag(R^T) = blockdiag(Rblock)
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 0; t < b; ++t) level.right[(k * b + i) * b + t] = right_blocks[k][t * b + i];
  level.right_perm = transpose;  // P^T = P for the reshape-transpose
  level.left_blocks = b;
  for (const Matrix& block : left_blocks) level.left.insert(level.left.end(), block.begin(), block.end());
  level.left_perm = transpose;
  const Matrix P = permutation(transpose);
  Matrix expected = multiply(P, block_diagonal(left_blocks, b, b), n, n, n);
  expected = multiply(expected, P, n, n, n);
  expected = multiply(expected, block_diagonal(right_blocks, b, b), n, n, n);
  expect_same(MlbtcMap(n, n, {level}).dense(), expected);
}

// Kronecker A (p x p) (x) B (q x q): blockdiag(B) over p blocks, regroup, blockdiag(A) over q.
TEST(Mlbtc, Kronecker) {
  const int64_t p = 2, q = 3, n = p * q;
  const Matrix A = random_vector<double>(p * p, 101), B = random_vector<double>(q * q, 102);
  MlbtcLevel level;
  level.right_blocks = p;
  level.right_cols = q;
  level.right.resize(n * q);
  for (int64_t j1 = 0; j1 < p; ++j1)
    for (int64_t j2 = 0; j2 < q; ++j2)
      for (int64_t i2 = 0; i2 < q; ++i2) level.right[(j1 * q + j2) * q + i2] = B[i2 * q + j2];
  level.right_perm.resize(n);
  level.left_perm.resize(n);
  for (int64_t j1 = 0; j1 < p; ++j1)
    for (int64_t i2 = 0; i2 < q; ++i2) {
      level.right_perm[i2 * p + j1] = j1 * q + i2;
      level.left_perm[j1 * q + i2] = i2 * p + j1;
    }
  level.left_blocks = q;
  for (int64_t i2 = 0; i2 < q; ++i2) level.left.insert(level.left.end(), A.begin(), A.end());
  Matrix expected(n * n);
  for (int64_t i1 = 0; i1 < p; ++i1)
    for (int64_t i2 = 0; i2 < q; ++i2)
      for (int64_t j1 = 0; j1 < p; ++j1)
        for (int64_t j2 = 0; j2 < q; ++j2)
          expected[(i1 * q + i2) * n + j1 * q + j2] = A[i1 * p + j1] * B[i2 * q + j2];
  expect_same(MlbtcMap(n, n, {level}).dense(), expected);
}

TEST(Mlbtc, RejectsBadConfiguration) {
  MlbtcLevel level;
  level.right_blocks = 2;
  level.right_cols = 2;
  level.right = std::vector<double>(8, 1.0);
  level.left_blocks = 2;
  level.left = std::vector<double>(8, 1.0);
  EXPECT_NO_THROW(MlbtcMap(4, 4, {level}));
  EXPECT_THROW(MlbtcMap(5, 4, {level}), Error);  // 5 not divisible into 2 blocks
  MlbtcLevel bad = level;
  bad.right_perm = {0, 1, 1, 3};
  EXPECT_THROW(MlbtcMap(4, 4, {bad}), Error);
  bad = level;
  bad.left.pop_back();
  EXPECT_THROW(MlbtcMap(4, 4, {bad}), Error);
}

}  // namespace
}  // namespace subquad
