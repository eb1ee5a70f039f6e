// The one exception type of the library: thrown at the public boundary when an argument
// is invalid. Messages name the argument, the expected value and the actual value.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace subquad {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

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
