// Lambert W0 by Halley iterations and the WildCat kernel temperature. O(1); checked
// against bisection on w e^w = x (wildcat_ref.h) in wildcat_test.cpp.
#include <cmath>
#include <limits>

#include "subquad/checked_size.h"
#include "subquad/error.h"
#include "subquad/wildcat.h"

namespace subquad {
namespace {

// 2 rho0 with rho0 = sqrt(1 + exp(2 W0(2 / e^2) + 2)), the constant of the temperature rule.
constexpr double kTwoRho0 = 6.383202050647408;
// Halley's iteration converges cubically from the starts below: 3-4 steps reach double
// precision on [0, 1e300]; the cap only guards against a pathological input.
constexpr int kMaxHalleySteps = 32;

}  // namespace

double lambert_w0(double x) {
  check(x >= 0.0, "lambert_w0: expected x >= 0, got ", x);
  if (x == 0.0 || std::isinf(x)) return x;
  // Start: log1p(x) is within a factor 1.5 of W0 on [0, e]; above, the asymptotic
  // expansion log x - log log x + log log x / log x.
  double w;
  if (x <= M_E) {
    w = std::log1p(x);
  } else {
    const double l1 = std::log(x), l2 = std::log(l1);
    w = l1 - l2 + l2 / l1;
  }
  for (int step = 0; step < kMaxHalleySteps; ++step) {
    const double ew = std::exp(w);
    const double f = w * ew - x;
    const double wp1 = w + 1.0;
    const double delta = f / (ew * wp1 - (w + 2.0) * f / (2.0 * wp1));
    w -= delta;
    if (std::abs(delta) <= 4.0 * std::numeric_limits<double>::epsilon() * (1.0 + std::abs(w)))
      break;
  }
  return w;
}

double wildcat_temperature(double beta, double query_radius, double key_radius, int64_t n) {
  check(std::isfinite(beta) && beta > 0.0, "beta: expected a finite value > 0, got ", beta);
  check(std::isfinite(query_radius) && query_radius >= 0.0,
        "query_radius: expected a finite value >= 0, got ", query_radius);
  check(std::isfinite(key_radius) && key_radius >= 0.0,
        "key_radius: expected a finite value >= 0, got ", key_radius);
  check(n >= 1, "n: expected at least one key, got ", n);
  if (!(key_radius > 0.0)) return 1.0;
  if (!(query_radius > 0.0)) query_radius = key_radius;
  const double b = std::log(static_cast<double>(n)) / (beta * query_radius * key_radius) + 2.0;
  // b = inf only for radii near the smallest double: the kernel is then constant and an
  // infinite temperature (scaled keys 0) is the exact limit.
  if (std::isinf(b)) return b;
  return std::sqrt(key_radius / query_radius * b / (2.0 * lambert_w0(b / kTwoRho0)));
}

}  // namespace subquad
