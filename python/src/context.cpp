// Bindings of the thread policy (include/subquad/context.h): check_threads, so that a front
// end checks a thread count once, at its boundary, against the range every operator accepts.
#include "subquad/context.h"

#include <nanobind/stl/string.h>

#include <string>

#include "arrays.h"
#include "bindings.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

void bind_context(nb::module_& m) {
  m.def(
      "check_threads",
      [](int64_t threads, const std::string& name) {
        return static_cast<int64_t>(check_threads(threads, name.c_str()));
      },
      "threads"_a, "name"_a = "threads",
      R"(The thread policy of every `threads` option: 0 (all cores) or 1 .. 1024.

Returns `threads`, or raises ValueError naming `name` with the accepted range. An operator
runs on min(threads, cores) threads. Front ends (subquad-llm --threads) check their thread
counts with this once, before any work.)");
}

}  // namespace

const BindingRegistrar context_bindings("context", &bind_context);

}  // namespace subquad::python
