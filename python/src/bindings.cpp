// The registry of the families' binding functions (bindings.h).
#include "bindings.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace subquad::python {
namespace {

std::vector<std::pair<std::string, BindFunction>>& registry() {
  static std::vector<std::pair<std::string, BindFunction>> functions;
  return functions;
}

}  // namespace

BindingRegistrar::BindingRegistrar(const char* family, BindFunction bind) {
  registry().emplace_back(family, bind);
}

void bind_all(nanobind::module_& m) {
  std::vector<std::pair<std::string, BindFunction>> functions = registry();
  std::sort(functions.begin(), functions.end());
  for (const auto& [family, bind] : functions) bind(m);
}

}  // namespace subquad::python
