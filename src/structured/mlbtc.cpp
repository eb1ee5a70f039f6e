// MLBTC linear maps: y = sum_l alpha_l P_L blockdiag(L_l) P_R blockdiag(R_l^T) x, applied
// level by level. O(sum_l (n c + pR c m / pL)) per vector; dense() applies it to the unit
// vectors (O(n) applications), for tests and inspection.
#include <algorithm>
#include <numeric>
#include <vector>

#include "common/workspace_frame.h"
#include "structured/structured_ops.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

void check_permutation(const std::vector<int64_t>& perm, int64_t size, const char* name,
                       size_t level) {
  if (perm.empty()) return;
  check(static_cast<int64_t>(perm.size()) == size, name, " of level ", level, ": expected ",
        size, " entries, got ", perm.size());
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < size; ++i)
    check(sorted[i] == i, name, " of level ", level, ": expected a permutation of 0..", size - 1);
}

}  // namespace

MlbtcMap::MlbtcMap(int64_t in_dim, int64_t out_dim, std::vector<MlbtcLevel> levels)
    : in_dim_(in_dim), out_dim_(out_dim), levels_(std::move(levels)) {
  check(in_dim >= 1 && out_dim >= 1, "MlbtcMap: expected positive dims, got ", in_dim, " x ",
        out_dim);
  for (size_t l = 0; l < levels_.size(); ++l) {
    const MlbtcLevel& level = levels_[l];
    const int64_t pR = level.right_blocks, c = level.right_cols, pL = level.left_blocks;
    check(pR >= 1 && in_dim % pR == 0, "right_blocks of level ", l, ": expected a divisor of ",
          in_dim, ", got ", pR);
    check(c >= 1, "right_cols of level ", l, ": expected >= 1, got ", c);
    check(pL >= 1 && out_dim % pL == 0 && (pR * c) % pL == 0, "left_blocks of level ", l,
          ": expected a divisor of ", out_dim, " and of ", pR * c, ", got ", pL);
    check(static_cast<int64_t>(level.right.size()) == in_dim * c, "right of level ", l,
          ": expected ", in_dim * c, " values [", pR, ", ", in_dim / pR, ", ", c, "], got ",
          level.right.size());
    check(static_cast<int64_t>(level.left.size()) == out_dim * pR * c / pL, "left of level ", l,
          ": expected ", out_dim * pR * c / pL, " values, got ", level.left.size());
    check_permutation(level.right_perm, pR * c, "right_perm", l);
    check_permutation(level.left_perm, out_dim, "left_perm", l);
  }
}

void MlbtcMap::apply(const Context& context, const double* x, double* y) const {
  check(x != nullptr, "x: null data for [", in_dim_, "]");
  check(y != nullptr, "y: null data for [", out_dim_, "]");
  dispatch(context, mlbtc::MlbtcApplyParams{&levels_, in_dim_, out_dim_, x, y});
}

void MlbtcMap::apply(const double* x, double* y) const { apply(Context{}, x, y); }

namespace cpu {

void run(Backend, const Context& context, const mlbtc::MlbtcApplyParams& params) {
  const int64_t in_dim = params.in_dim, out_dim = params.out_dim;
  const double* x = params.x;
  double* y = params.y;
  std::fill(y, y + out_dim, 0.0);
  int64_t widest = 0;  // the largest inner dim pR c of a level
  for (const MlbtcLevel& level : *params.levels)
    widest = std::max(widest, level.right_blocks * level.right_cols);
  WorkspaceFrame frame(context);  // the scratch: none allocated with a workspace
  double* u = frame.take<double>(widest);   // [pR c] R^T x per block
  double* w = frame.take<double>(widest);   // [pR c] u permuted
  double* z = frame.take<double>(out_dim);  // [m] L w per block
  for (const MlbtcLevel& level : *params.levels) {
    const int64_t pR = level.right_blocks, c = level.right_cols, pL = level.left_blocks;
    const int64_t n_block = in_dim / pR, inner = pR * c, m_block = out_dim / pL;
    const int64_t inner_block = inner / pL;
    std::fill(u, u + inner, 0.0);
    for (int64_t k = 0; k < pR; ++k)
      for (int64_t i = 0; i < n_block; ++i)
        for (int64_t t = 0; t < c; ++t)
          u[k * c + t] += level.right[(k * n_block + i) * c + t] * x[k * n_block + i];
    for (int64_t t = 0; t < inner; ++t)
      w[t] = level.right_perm.empty() ? u[t] : u[level.right_perm[t]];
    for (int64_t k = 0; k < pL; ++k)
      for (int64_t o = 0; o < m_block; ++o) {
        double acc = 0;
        for (int64_t t = 0; t < inner_block; ++t)
          acc += level.left[(k * m_block + o) * inner_block + t] * w[k * inner_block + t];
        z[k * m_block + o] = acc;
      }
    for (int64_t t = 0; t < out_dim; ++t)
      y[t] += level.alpha * (level.left_perm.empty() ? z[t] : z[level.left_perm[t]]);
  }
}

}  // namespace cpu

std::vector<double> MlbtcMap::dense() const {
  std::vector<double> matrix(static_cast<size_t>(out_dim_ * in_dim_)), unit(in_dim_, 0.0),
      column(out_dim_);
  for (int64_t j = 0; j < in_dim_; ++j) {
    unit[j] = 1.0;
    apply(unit.data(), column.data());
    unit[j] = 0.0;
    for (int64_t i = 0; i < out_dim_; ++i) matrix[i * in_dim_ + j] = column[i];
  }
  return matrix;
}

}  // namespace subquad
