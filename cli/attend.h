// `subquad attend` subcommand.
#pragma once

#include <string>
#include <vector>

namespace subquad::cli {

int run_attend(const std::vector<std::string>& args);
std::string attend_help();

}  // namespace subquad::cli
