// The one exception type of the library: thrown at the public boundary when an argument
// is invalid. Messages name the argument, the expected value and the actual value.
#pragma once

#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace subquad {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

// The one allocation-failure type: a std::bad_alloc (Python's MemoryError, the CLI's exit 1)
// whose message says what could not be allocated and how large it was.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Thrown by an operator whose Context's Interrupt asked it to stop (subquad/context.h): not
// an argument error, and not a failure; the outputs are incomplete. Python's
// KeyboardInterrupt, raised by the signal handler that asked.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

// Throws OutOfMemory: "cannot allocate <bytes> bytes for <what>".
[[noreturn]] inline void throw_out_of_memory(size_t bytes, const std::string& what) {
  std::ostringstream message;
  message << "cannot allocate " << bytes << " bytes for " << what;
  throw OutOfMemory(message.str());
}

// Builds a message from any streamable parts: throw_error("q: expected rank 4, got ", r).
template <typename... Parts>
[[noreturn]] void throw_error(Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw Error(message.str());
}

// Throws Error with the given message parts unless `condition` holds.
template <typename... Parts>
void check(bool condition, Parts&&... parts) {
  if (!condition) throw_error(std::forward<Parts>(parts)...);
}

}  // namespace subquad
