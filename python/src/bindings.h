// One function per op family adds that family's bindings to the module subquad._core.
#pragma once

#include <nanobind/nanobind.h>

namespace subquad::python {

void bind_exact(nanobind::module_& m);
void bind_circulant2d(nanobind::module_& m);
void bind_structured(nanobind::module_& m);
void bind_cat(nanobind::module_& m);
void bind_wildcat(nanobind::module_& m);

}  // namespace subquad::python
