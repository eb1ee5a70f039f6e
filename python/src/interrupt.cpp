// The Python side of Context::interrupt (interrupt.h).
#include "interrupt.h"

#include <Python.h>
#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace subquad::python {
namespace {

using Clock = std::chrono::steady_clock;

// How often a running call looks at Python's signals: a GIL round trip (about a
// microsecond) every 10 ms costs nothing measurable, and a user waits at most this long
// plus one task.
constexpr auto kPollInterval = std::chrono::milliseconds(10);

class SignalInterrupt final : public Interrupt {
 public:
  void start() {
    Py_CLEAR(type_);  // a call that never unwound through restore() (none expected)
    Py_CLEAR(value_);
    Py_CLEAR(traceback_);
    owner_ = std::this_thread::get_id();
    next_poll_ = Clock::now() + kPollInterval;
    requested_.store(false, std::memory_order_relaxed);
  }

  // Every thread of the team calls this; only the caller's thread, which may take the GIL,
  // looks at the signals.
  bool poll() override {
    if (requested_.load(std::memory_order_relaxed)) return true;
    if (std::this_thread::get_id() != owner_) return false;
    const Clock::time_point now = Clock::now();
    if (now < next_poll_) return false;
    next_poll_ = now + kPollInterval;
    nanobind::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    // Kept aside while the call unwinds (no Python error is pending meanwhile).
    PyErr_Fetch(&type_, &value_, &traceback_);
    requested_.store(true, std::memory_order_relaxed);
    return true;
  }

  void restore() {
    if (type_ == nullptr) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
      return;
    }
    PyErr_Restore(type_, value_, traceback_);  // steals the references
    type_ = value_ = traceback_ = nullptr;
  }

 private:
  std::atomic<bool> requested_{false};
  std::thread::id owner_;
  Clock::time_point next_poll_;
  PyObject* type_ = nullptr;
  PyObject* value_ = nullptr;
  PyObject* traceback_ = nullptr;
};

thread_local SignalInterrupt this_thread_interrupt;

}  // namespace

Interrupt* interrupt_for_call() {
  this_thread_interrupt.start();
  return &this_thread_interrupt;
}

void restore_interrupt_error() { this_thread_interrupt.restore(); }

}  // namespace subquad::python
