// `subquad attend`: run one registered method on .npy inputs and write .npy outputs.
#include "attend.h"

#include <algorithm>
#include <iostream>
#include <new>

#include "registry.h"
#include "subquad/error.h"

namespace subquad::cli {
namespace {

const std::vector<OptionSpec> kCommonOptions = {
    {"method", "NAME", "attention method (see the list below)", true},
    {"out", "PATH", "output .npy file", true},
    {"threads", "T", "threads, 0 (all cores, the default) to 1024; at most the cores are used"},
};

const AttendMethod& find_method(const std::string& name) {
  for (const AttendMethod& method : attend_methods())
    if (method.name == name) return method;
  std::string known;
  for (const AttendMethod& method : attend_methods()) known += " " + method.name;
  throw_error("attend: unknown --method '", name, "' (known:", known, ")");
}

}  // namespace

std::string attend_help() {
  std::string text =
      "usage: subquad attend --method NAME --out PATH [method options]\n\n"
      "Runs one attention method on .npy inputs (float32 or float64, C order) and writes the\n"
      "output as .npy (float64 when every input is float64, else float32).\n\n"
      "Common options:\n" +
      options_help(kCommonOptions);
  std::vector<const AttendMethod*> sorted;
  for (const AttendMethod& method : attend_methods()) sorted.push_back(&method);
  std::sort(sorted.begin(), sorted.end(),
            [](const AttendMethod* a, const AttendMethod* b) { return a->name < b->name; });
  for (const AttendMethod* method : sorted)
    text += "\n--method " + method->name + ": " + method->summary + "\n" +
            options_help(method->options);
  return text;
}

int run_attend(const std::vector<std::string>& args) {
  std::string method_name;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--method" && i + 1 < args.size()) method_name = args[i + 1];
    if (args[i].rfind("--method=", 0) == 0) method_name = args[i].substr(9);
  }
  check(!method_name.empty(), "attend: missing required option --method (see `subquad attend "
                              "--help`)");
  const AttendMethod& method = find_method(method_name);
  std::vector<OptionSpec> specs = kCommonOptions;
  specs.insert(specs.end(), method.options.begin(), method.options.end());
  const ParsedOptions options = parse_options(args, specs, "attend --method " + method.name);

  Context context;
  context.threads = check_threads(options.integer_or("threads", 0), "option --threads");
  std::map<std::string, NpyArray> outputs;
  try {
    outputs = method.run(options, context);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const std::bad_alloc&) {  // a standard container: name the method at least
    throw OutOfMemory("--method " + method.name +
                      ": cannot allocate memory for its inputs, outputs or workspaces");
  }
  for (const auto& [name, array] : outputs) {
    if (name != "out" && !options.has(name)) continue;
    try {
      save_npy(options.string(name), array);
    } catch (const Error& error) {
      throw_error("option --", name, ": ", error.what());
    }
  }
  return 0;
}

}  // namespace subquad::cli
