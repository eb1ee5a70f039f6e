// SHA-256 (FIPS 180-4) of a file, as lowercase hex: what `subquad bench` checks a captured
// workload's files against (their manifest, written by Python's hashlib).
#pragma once

#include <string>

namespace subquad::cli {

// The digest of the file at `path`; throws Error when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace subquad::cli
