// The subquad command-line tool: `attend` runs one method on .npy files, `bench` compares
// every method against exact attention. Errors print one line and exit with status 1 (bad
// arguments or input files, allocation failures) or 2 (unexpected failures).
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "attend.h"
#include "bench.h"
#include "common/gemm.h"
#include "subquad/error.h"

namespace {

const char* const kUsage =
    "usage: subquad <command> [options]\n\n"
    "Fast softmax attention beyond O(N^2): CAT, 2D Circulant Attention, WildCat, MLR and\n"
    "structured attention, measured against exact attention.\n\n"
    "Commands:\n"
    "  attend   run one attention method on .npy inputs and write the output\n"
    "  bench    time every method side by side with exact attention (default workload\n"
    "           when run without options)\n"
    "  help     this text; `subquad <command> --help` describes a command\n";

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& arg : args)
    if (arg == "--help" || arg == "-h") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty() || all[0] == "help" || all[0] == "--help" || all[0] == "-h") {
    std::cout << kUsage;
    return all.empty() ? 1 : 0;
  }
  const std::string command = all[0];
  const std::vector<std::string> args(all.begin() + 1, all.end());
  try {
    subquad::prepare_gemm();  // before inputs are read: see gemm.h
    if (command == "attend") {
      if (wants_help(args)) return std::cout << subquad::cli::attend_help(), 0;
      return subquad::cli::run_attend(args);
    }
    if (command == "bench") {
      if (wants_help(args)) return std::cout << subquad::cli::bench_help(), 0;
      return subquad::cli::run_bench(args);
    }
    std::cerr << "subquad: unknown command '" << command << "'\n\n" << kUsage;
    return 1;
  } catch (const subquad::Error& error) {
    std::cerr << "subquad " << command << ": error: " << error.what() << "\n";
    return 1;
  } catch (const std::bad_alloc& error) {
    // subquad::OutOfMemory says what could not be allocated; a plain bad_alloc (a standard
    // container) at least says that memory ran out.
    std::cerr << "subquad " << command << ": error: out of memory: " << error.what() << "\n";
    return 1;
  } catch (const std::length_error& error) {
    std::cerr << "subquad " << command << ": error: out of memory (size too large): "
              << error.what() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "subquad " << command << ": unexpected failure: " << error.what() << "\n";
    return 2;
  }
}
