// Every python/src/<family>.cpp adds its op family's bindings to the module subquad._core
// by registering one function with a static BindingRegistrar; module.cpp runs them all.
// Adding a family is adding its file: python/CMakeLists.txt globs the sources.
#pragma once

#include <nanobind/nanobind.h>

namespace subquad::python {

using BindFunction = void (*)(nanobind::module_&);

struct BindingRegistrar {
  BindingRegistrar(const char* family, BindFunction bind);
};

// Runs every registered function, in family-name order (a stable module layout).
void bind_all(nanobind::module_& m);

}  // namespace subquad::python
