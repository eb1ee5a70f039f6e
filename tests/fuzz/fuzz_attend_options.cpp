// libFuzzer target: option parsing of `subquad attend` on arbitrary argument lists (the
// input split at newlines), with every typed read the methods make (integers, finite
// numbers, lists). Every input must parse or fail with subquad::Error naming the option; a
// crash, a sanitizer report (signed overflow in a conversion) or any other exception is a
// bug. Built and run by scripts/fuzz.sh on the corpus in tests/fuzz/attend_options_corpus.
#include <cstdint>
#include <string>
#include <vector>

#include "options.h"
#include "subquad/error.h"

namespace {

using subquad::cli::OptionSpec;

// The options of attend and of its methods (cli/attend.cpp, cli/method_*.cpp), by kind.
const std::vector<std::string> kIntegers = {"threads", "window", "rank", "bins", "seed"};
const std::vector<std::string> kNumbers = {"scale"};
const std::vector<std::string> kLists = {"ranks"};
const std::vector<std::string> kStrings = {
    "method", "out", "q", "k", "v", "z", "lse", "weights", "convention", "path", "scale-mode"};
const std::vector<std::string> kFlags = {"causal", "block-divide"};

std::vector<OptionSpec> specs() {
  std::vector<OptionSpec> all;
  for (const auto* names : {&kIntegers, &kNumbers, &kLists, &kStrings})
    for (const std::string& name : *names) all.push_back({name, "X", "", false});
  for (const std::string& name : kFlags) all.push_back({name, "", "", false});
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<OptionSpec> kSpecs = specs();
  std::vector<std::string> args;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(current);
  try {
    const subquad::cli::ParsedOptions options = subquad::cli::parse_options(args, kSpecs, "attend");
    for (const std::string& name : kIntegers) try {
        options.integer_or(name, 0);
      } catch (const subquad::Error&) {
      }
    for (const std::string& name : kNumbers) try {
        options.number_or(name, 1.0);
      } catch (const subquad::Error&) {
      }
    for (const std::string& name : kLists)
      if (options.has(name)) try {
          options.integer_list(name);
        } catch (const subquad::Error&) {
        }
    for (const std::string& name : kStrings) options.string_or(name, "");
    for (const std::string& name : kFlags) options.flag(name);
  } catch (const subquad::Error&) {
  }
  return 0;
}
