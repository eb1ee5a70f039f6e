// The one seam between the public API and the backends. A public operator checks its
// arguments at the boundary into a parameter struct (the family's *_ops.h) and calls
// dispatch(context, params); the single switch on Context::device below picks the backend.
// A backend implements an operator by defining run(<its tag>, const Context&, params) in its
// own files; ADL finds it through the tag. A CUDA backend adds a Device value, a tag, one
// case here and its files: no operator body changes.
#pragma once

#include <utility>

#include "subquad/context.h"
#include "subquad/error.h"

namespace subquad {

namespace cpu {
struct Backend {};  // tag: the CPU kernels (src/<family>/*.cpp, primitives in src/cpu/)
}  // namespace cpu

template <typename Params>
decltype(auto) dispatch(const Context& context, Params&& params) {
  switch (context.device) {
    case Device::cpu:
      return run(cpu::Backend{}, context, std::forward<Params>(params));
  }
  throw_error("context.device: no backend is built for device ", static_cast<int>(context.device));
}

}  // namespace subquad
