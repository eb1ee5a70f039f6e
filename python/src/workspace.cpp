// subquad.Workspace: Context::workspace (include/subquad/workspace.h) for Python callers.
// A C++ caller points its Context at a Workspace; Python functions take no Context, so a
// workspace is entered as a context manager instead: every operator called on this thread
// inside `with ws:` takes its scratch from ws (context_for reads the thread's current one),
// and repeated calls with the same shapes reuse it instead of allocating.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "subquad/error.h"
#include "subquad/workspace.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

// The workspace of the innermost `with` on this thread (null: none).
thread_local Workspace* current = nullptr;

// One Workspace and the `with` blocks it is entered in. A workspace serves one call at a
// time: entering it on a second thread while another holds it is refused (the GIL is
// released while kernels run, so two threads could otherwise share its memory).
class WorkspaceBinding {
 public:
  WorkspaceBinding& enter() {
    check(depth_ == 0 || owner_ == std::this_thread::get_id(),
          "Workspace: already entered on another thread (give each thread its own)");
    owner_ = std::this_thread::get_id();
    ++depth_;
    previous_.push_back(current);
    current = &workspace_;
    return *this;
  }
  void exit() {
    check(depth_ > 0 && owner_ == std::this_thread::get_id(),
          "Workspace: __exit__ without a matching __enter__ on this thread");
    current = previous_.back();
    previous_.pop_back();
    --depth_;
  }
  int64_t capacity_bytes() const { return workspace_.capacity_bytes(); }
  int64_t peak_bytes() const { return workspace_.peak_bytes(); }
  void release() {
    check(depth_ == 0, "Workspace: release() inside its `with` block");
    workspace_.release();
  }

 private:
  Workspace workspace_;
  std::vector<Workspace*> previous_;  // what `current` was at each open __enter__
  std::thread::id owner_;
  int depth_ = 0;
};

void bind_workspace(nb::module_& m) {
  nb::class_<WorkspaceBinding>(m, "Workspace",
                               R"(Scratch memory reused across operator calls (C++ Context::workspace).

    ws = subquad.Workspace()
    with ws:
        out = subquad.cat_forward(z, v)   # the first call grows ws to what it needs
        out = subquad.cat_forward(z, v)   # same shapes: scratch taken from ws, no allocation

Every subquad function called on this thread inside the `with` block takes its scratch from
the workspace; outputs are new arrays as always, and results are bit-identical to calls
without one. Blocks nest (the innermost workspace is used). One thread at a time: entering a
workspace held by another thread raises ValueError. Operators that take their scratch from
a workspace are listed in docs/conventions.md.)")
      .def(nb::init<>())
      .def("__enter__", &WorkspaceBinding::enter, nb::rv_policy::reference)
      .def(
          "__exit__",
          [](WorkspaceBinding& self, nb::handle, nb::handle, nb::handle) -> bool {
            self.exit();
            return false;
          },
          "exc_type"_a.none(), "exc_value"_a.none(), "traceback"_a.none())
      .def_prop_ro("capacity_bytes", &WorkspaceBinding::capacity_bytes,
                   "Bytes held between calls.")
      .def_prop_ro("peak_bytes", &WorkspaceBinding::peak_bytes,
                   "The most bytes one call has needed.")
      .def("release", &WorkspaceBinding::release,
           "Frees the memory held (not inside the workspace's `with` block).");
}

}  // namespace

Workspace* current_workspace() { return current; }

const BindingRegistrar workspace_bindings("workspace", &bind_workspace);

}  // namespace subquad::python
