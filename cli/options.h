// Option parsing for every subcommand, in one place: options are declared (name, value
// or flag, help), parsed from argv, and unknown or malformed options are errors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/npy.h"

namespace subquad::cli {

struct OptionSpec {
  std::string name;         // without the leading "--"
  std::string value_name;   // empty for a flag
  std::string help;
  bool required = false;
};

class ParsedOptions {
 public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  bool flag(const std::string& name) const { return has(name); }
  std::string string(const std::string& name) const;  // throws when missing
  std::string string_or(const std::string& name, const std::string& fallback) const;
  double number(const std::string& name) const;
  double number_or(const std::string& name, double fallback) const;
  int64_t integer(const std::string& name) const;
  int64_t integer_or(const std::string& name, int64_t fallback) const;
  std::vector<int64_t> integer_list(const std::string& name) const;  // "1,2,3"
  std::vector<std::string> string_list(const std::string& name) const;
  // Loads the .npy file named by option `name` (required).
  NpyArray array(const std::string& name) const;

  std::map<std::string, std::string> values_;
};

// Parses argv[first..] against `specs`; throws subquad::Error naming the bad option.
ParsedOptions parse_options(const std::vector<std::string>& args,
                            const std::vector<OptionSpec>& specs, const std::string& command);
std::string options_help(const std::vector<OptionSpec>& specs);

}  // namespace subquad::cli
