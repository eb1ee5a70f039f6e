// Ctrl-C during a long operator called from Python. Kernels run without the GIL, so
// Python's handler for SIGINT cannot run until they return (85 s for exact attention at
// T = 131,072): each call's Context carries this thread's SignalInterrupt, which parallel_for
// polls between tasks; it runs Python's pending signal handlers (PyErr_CheckSignals, with
// the GIL) at most every kPollInterval, and when one raises, the call stops and the bindings
// raise that exception (KeyboardInterrupt for Ctrl-C).
#pragma once

#include "subquad/context.h"

namespace subquad::python {

// This thread's Interrupt, reset for a new call (needs the GIL).
Interrupt* interrupt_for_call();

// Sets Python's error to the exception a signal handler raised during the call that threw
// Interrupted on this thread (KeyboardInterrupt if none was kept). Needs the GIL.
void restore_interrupt_error();

}  // namespace subquad::python
