// The extension module subquad._core: every operator of the library on NumPy arrays.
// subquad::Error (a bad argument) raises ValueError, an allocation failure MemoryError, a
// call stopped by a signal the exception its handler raised (KeyboardInterrupt for Ctrl-C,
// interrupt.h); any other C++ exception RuntimeError.
#include <new>
#include <stdexcept>

#include "arrays.h"
#include "bindings.h"
#include "interrupt.h"

NB_MODULE(_core, m) {
  namespace python = subquad::python;
  m.doc() = "subquad operators on CPU arrays (float32 or float64); see help(subquad).";
  nanobind::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const subquad::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::bad_alloc& e) {  // subquad::OutOfMemory names what it could not allocate
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const std::length_error& e) {  // a standard container asked for too much
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const subquad::Interrupted&) {
      python::restore_interrupt_error();
    }
  });
  python::bind_all(m);
}
