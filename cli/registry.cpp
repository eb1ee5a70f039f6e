// Storage for the method registry (function-local statics: registration order across
// translation units is unspecified, first use constructs them).
#include "registry.h"

namespace subquad::cli {

std::vector<AttendMethod>& attend_methods() {
  static std::vector<AttendMethod> methods;
  return methods;
}

std::vector<BenchMethod>& bench_methods() {
  static std::vector<BenchMethod> methods;
  return methods;
}

}  // namespace subquad::cli
