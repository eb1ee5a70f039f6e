// Storage for the method registry (function-local statics: registration order across
// translation units is unspecified, first use constructs them), and CaseData.
#include "registry.h"

namespace subquad::cli {

std::vector<AttendMethod>& attend_methods() {
  static std::vector<AttendMethod> methods;
  return methods;
}

CaseData::CaseData(const Workload& w, const BenchInputs& inputs)
    : q(inputs.q.data(), {w.batch, w.tokens, w.heads, w.head_dim}),
      k(inputs.k.data(), {w.batch, w.tokens, w.heads, w.head_dim}),
      v(inputs.v.data(), {w.batch, w.tokens, w.heads, w.value_dim}),
      out(inputs.v.size()) {}

std::vector<BenchMethod>& bench_methods() {
  static std::vector<BenchMethod> methods;
  return methods;
}

}  // namespace subquad::cli
