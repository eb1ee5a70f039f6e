// Uses the installed library through its public headers only: exact attention forward and
// backward (with dlse), CAT and the flop model, checked against a few lines of naive math.
// Exits non-zero on any mismatch.
#include <cmath>
#include <cstdio>
#include <vector>

#include "subquad/cat.h"
#include "subquad/cost.h"
#include "subquad/exact.h"

int main() {
  using namespace subquad;
  constexpr int64_t N = 5, M = 7, D = 3, Dv = 2;
  std::vector<double> q(N * D), k(M * D), v(M * Dv), out(N * Dv), lse(N);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * double(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.3 * double(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * double(i) - 0.5;
  const Context context{Device::cpu, 1};
  exact_attention_forward<double>(context, View4<const double>(q.data(), {1, N, 1, D}),
                                  View4<const double>(k.data(), {1, M, 1, D}),
                                  View4<const double>(v.data(), {1, M, 1, Dv}), {},
                                  View4<double>(out.data(), {1, N, 1, Dv}),
                                  View3<double>(lse.data(), {1, 1, N}));
  double worst = 0;
  for (int64_t i = 0; i < N; ++i) {
    std::vector<double> p(M);
    double total = 0;
    for (int64_t j = 0; j < M; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += q[i * D + d] * k[j * D + d];
      p[j] = std::exp(s / std::sqrt(double(D)));
      total += p[j];
    }
    worst = std::fmax(worst, std::fabs(lse[i] - std::log(total)));
    for (int64_t c = 0; c < Dv; ++c) {
      double o = 0;
      for (int64_t j = 0; j < M; ++j) o += p[j] / total * v[j * Dv + c];
      worst = std::fmax(worst, std::fabs(out[i * Dv + c] - o));
    }
  }

  // CAT with uniform scores averages v over all tokens.
  std::vector<float> z(N, 0.0f), cv(N * Dv), cout(N * Dv);
  for (size_t i = 0; i < cv.size(); ++i) cv[i] = float(i);
  cat_forward<float>(context, View3<const float>(z.data(), {1, N, 1}),
                     View4<const float>(cv.data(), {1, N, 1, Dv}), {},
                     View4<float>(cout.data(), {1, N, 1, Dv}));
  double cat_worst = 0;  // float32: a few ulps of values up to 9
  for (int64_t c = 0; c < Dv; ++c) {
    double mean = 0;
    for (int64_t n = 0; n < N; ++n) mean += cv[n * Dv + c] / double(N);
    for (int64_t n = 0; n < N; ++n)
      cat_worst = std::fmax(cat_worst, std::fabs(cout[n * Dv + c] - mean));
  }

  const Cost cost = exact_attention_forward_cost(1, N, M, 1, 1, D, Dv, false, 0, sizeof(double));
  const bool ok = worst < 1e-12 && cat_worst < 1e-5 && cost.flops == 2.0 * N * M * (D + Dv);
  std::printf("subquad consumer: exact error %.3g, cat error %.3g, flop model %.0f: %s\n", worst,
              cat_worst, cost.flops, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
