// `subquad bench`: side-by-side comparison of every registered method over sequence lengths
// and head shapes, with exact attention measured in the same run.
#pragma once

#include <string>
#include <vector>

namespace subquad::cli {

int run_bench(const std::vector<std::string>& args);
std::string bench_help();

}  // namespace subquad::cli
