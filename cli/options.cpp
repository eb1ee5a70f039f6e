// Declared-option parsing shared by every subcommand.
#include "options.h"

#include <cmath>
#include <sstream>

#include "subquad/error.h"

namespace subquad::cli {

std::string ParsedOptions::string(const std::string& name) const {
  const auto found = values_.find(name);
  check(found != values_.end(), "missing required option --", name);
  return found->second;
}

std::string ParsedOptions::string_or(const std::string& name, const std::string& fallback) const {
  return has(name) ? string(name) : fallback;
}

double ParsedOptions::number(const std::string& name) const {
  const std::string text = string(name);
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  check(used == text.size() && !text.empty() && std::isfinite(value), "option --", name,
        ": expected a finite number, got '", text, "'");
  return value;
}

double ParsedOptions::number_or(const std::string& name, double fallback) const {
  return has(name) ? number(name) : fallback;
}

int64_t ParsedOptions::integer(const std::string& name) const {
  const std::string text = string(name);
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  check(used == text.size() && !text.empty(), "option --", name, ": expected an integer, got '",
        text, "'");
  return value;
}

int64_t ParsedOptions::integer_or(const std::string& name, int64_t fallback) const {
  return has(name) ? integer(name) : fallback;
}

std::vector<std::string> ParsedOptions::string_list(const std::string& name) const {
  // Split by hand: getline would drop a trailing empty item ("3,3,").
  const std::string text = string(name);
  check(!text.empty(), "option --", name, ": expected a comma-separated list");
  std::vector<std::string> items;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    check(!item.empty(), "option --", name, ": empty item in list '", text, "'");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

std::vector<int64_t> ParsedOptions::integer_list(const std::string& name) const {
  std::vector<int64_t> values;
  for (const std::string& item : string_list(name)) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == item.size(), "option --", name, ": expected integers separated by commas, got '",
          string(name), "'");
    values.push_back(value);
  }
  return values;
}

NpyArray ParsedOptions::array(const std::string& name) const {
  try {
    return load_npy(string(name));
  } catch (const Error& error) {
    throw_error("option --", name, ": ", error.what());
  } catch (const std::bad_alloc& error) {
    throw OutOfMemory("option --" + name + ": " + error.what());
  }
}

ParsedOptions parse_options(const std::vector<std::string>& args,
                            const std::vector<OptionSpec>& specs, const std::string& command) {
  ParsedOptions parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    check(arg.rfind("--", 0) == 0 && arg.size() > 2, command, ": unexpected argument '", arg,
          "' (options start with --; see `subquad ", command, " --help`)");
    std::string name = arg.substr(2);
    std::string value;
    bool inline_value = false;
    if (const size_t equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
      inline_value = true;
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& candidate : specs)
      if (candidate.name == name) spec = &candidate;
    check(spec != nullptr, command, ": unknown option --", name, " (see `subquad ", command,
          " --help`)");
    check(parsed.values_.count(name) == 0, command, ": option --", name, " given twice");
    if (spec->value_name.empty()) {
      check(!inline_value, command, ": option --", name, " is a flag and takes no value");
    } else if (!inline_value) {
      check(i + 1 < args.size(), command, ": option --", name, " needs a value <",
            spec->value_name, ">");
      value = args[++i];
    }
    parsed.values_[name] = value;
  }
  for (const OptionSpec& spec : specs)
    check(!spec.required || parsed.has(spec.name), command, ": missing required option --",
          spec.name);
  return parsed;
}

std::string options_help(const std::vector<OptionSpec>& specs) {
  std::ostringstream text;
  for (const OptionSpec& spec : specs) {
    std::string left = "  --" + spec.name + (spec.value_name.empty() ? "" : " " + spec.value_name);
    if (left.size() < 26) left.resize(26, ' ');
    else left += "  ";
    text << left << spec.help << (spec.required ? " (required)" : "") << "\n";
  }
  return text.str();
}

}  // namespace subquad::cli
