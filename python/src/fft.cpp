// Bindings of the FFT planner setting (src/common/fft.h): how hard FFTW plans the
// transforms of CAT and Circulant Attention on first use of a shape.
#include <nanobind/stl/string.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "common/fft.h"
#include "subquad/error.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

void bind_fft(nb::module_& m) {
  m.def(
      "set_fft_effort",
      [](const std::string& effort) {
        check(effort == "estimate" || effort == "measure",
              "effort: expected 'estimate' or 'measure', got '", effort, "'");
        set_fft_effort(effort == "measure" ? FftEffort::measure : FftEffort::estimate);
      },
      "effort"_a,
      R"(FFTW's planner effort for transforms planned after the call (plans are cached per shape).
"estimate" (the default) plans at once; "measure" times candidate algorithms on first use of
a shape (up to seconds for large grids) and gives faster transforms: at a 96 x 96 grid 1.5-3x
(src/circulant2d/README.md). `subquad bench` uses "measure".)");
}

}  // namespace

const BindingRegistrar fft_bindings("fft", &bind_fft);

}  // namespace subquad::python
