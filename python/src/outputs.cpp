// subquad._core.outputs_from(allocate): where the operators' outputs come from (arrays.h).
// Python callers get new NumPy arrays; subquad.ops enters `with _core.outputs_from(f)` with
// f(shape, dtype) = torch.empty(...), so the C++ kernels write straight into torch-allocated
// tensors. The allocator is per thread, like subquad.Workspace, and blocks nest.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "subquad/error.h"

namespace subquad::python {

namespace {

// The allocators of this thread's open `with` blocks, innermost last (borrowed: each
// OutputsFrom holds its allocator while entered).
thread_local std::vector<PyObject*> allocators;

class OutputsFrom {
 public:
  explicit OutputsFrom(nb::callable allocate) : allocate_(std::move(allocate)) {}
  OutputsFrom& enter() {
    allocators.push_back(allocate_.ptr());
    return *this;
  }
  void exit() {
    check(!allocators.empty() && allocators.back() == allocate_.ptr(),
          "outputs_from: __exit__ without a matching __enter__ on this thread");
    allocators.pop_back();
  }

 private:
  nb::callable allocate_;
};

}  // namespace

nb::handle current_output_allocator() {
  return allocators.empty() ? nb::handle() : nb::handle(allocators.back());
}

void* allocated_output(nb::handle allocated, std::span<const int64_t> shape,
                       nb::dlpack::dtype dtype, const std::string& what) {
  nb::ndarray<nb::device::cpu> array;
  check(nb::try_cast(allocated, array), "outputs_from: the allocator returned ",
        nb::type_name(allocated.type()).c_str(), " for ", what,
        "; expected a writable CPU array");
  check(array.dtype() == dtype, "outputs_from: the allocator returned dtype ",
        dtype_name(array.dtype()), " for ", what, "; expected ", dtype_name(dtype));
  check(array.ndim() == shape.size(), "outputs_from: the allocator returned ", array.ndim(),
        " dimensions for ", what);
  int64_t stride = 1;  // C-contiguous: strides of dimensions of size 1 do not matter
  for (size_t i = shape.size(); i-- > 0;) {
    check(int64_t(array.shape(i)) == shape[i], "outputs_from: the allocator returned shape ",
          "dimension ", i, " = ", array.shape(i), " for ", what);
    check(shape[i] == 1 || array.stride(i) == stride, "outputs_from: the allocator returned a ",
          "non-contiguous array for ", what);
    stride *= shape[i];
  }
  return array.data();
}

namespace {

void bind(nb::module_& m) {
  nb::class_<OutputsFrom>(m, "outputs_from", R"(Takes every operator output from an allocator.

Inside `with subquad._core.outputs_from(allocate):`, on this thread, each output of an
operator is allocate(shape, dtype) (shape a tuple of ints, dtype "float32", "float64" or
"bfloat16"), which must return a writable C-contiguous CPU array of that shape and dtype
(e.g. a torch.empty tensor); the operator writes it whole and returns it. Outside, outputs
are new NumPy arrays. subquad.ops uses this to return torch-allocated tensors.)")
      .def(nb::init<nb::callable>(), nb::arg("allocate"))
      .def("__enter__", &OutputsFrom::enter, nb::rv_policy::reference)
      .def(
          "__exit__",
          [](OutputsFrom& self, nb::handle, nb::handle, nb::handle) { self.exit(); },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none());
}

const BindingRegistrar registrar("outputs", bind);

}  // namespace

}  // namespace subquad::python
