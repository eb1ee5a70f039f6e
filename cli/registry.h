// The registry of methods the CLI knows. Each op family adds one file cli/method_<family>.cpp
// that registers its `attend` methods and its `bench` rows with a static Registrar; nothing
// else in the CLI changes when a method is added.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/npy.h"
#include "options.h"
#include "subquad/context.h"
#include "subquad/view.h"

namespace subquad::cli {

// `subquad attend --method NAME ...`: the method declares its own options (beyond the
// common --method, --out, --threads) and turns parsed options into output arrays.
struct AttendMethod {
  std::string name;
  std::string summary;
  std::vector<OptionSpec> options;
  // Returns the arrays to write by name: "out" goes to --out; any other (e.g. "lse") goes
  // to the path given by the option of the same name, when that option is present.
  std::function<std::map<std::string, NpyArray>(const ParsedOptions&, const Context&)> run;
};

// One shape of the bench: tokens, heads and head dims; methods read what they need.
struct Workload {
  int64_t batch = 1;
  int64_t tokens = 0;  // N (= M)
  int64_t heads = 8;
  int64_t head_dim = 64;
  int64_t value_dim = 64;
  uint64_t seed = 0;
};

// Inputs the harness generates for every row of one workload, float32 contiguous:
// q, k [B, N, H, D], v [B, N, H, Dv], standard normal; methods may derive their own.
struct BenchInputs {
  std::vector<float> q, k, v;
};

// The one way a case holds its data: views of the harness's inputs, which outlive every case
// prepared from them (the harness keeps them for the whole workload), so nothing is copied;
// and the case's own output out [B, N, H, Dv].
struct CaseData {
  CaseData(const Workload& w, const BenchInputs& inputs);
  View4<const float> q, k;  // [B, N, H, D]
  View4<const float> v;     // [B, N, H, Dv]
  std::vector<float> out;   // [B, N, H, Dv]
  View4<float> out_view() { return View4<float>(out.data(), v.shape); }
};

// A prepared run of one method on one workload: setup is done in the factory, `run` is
// timed. `output` (optional) returns out [B, N, H, Dv] so that the harness can report
// the error against exact attention for approximate methods.
struct BenchCase {
  virtual ~BenchCase() = default;
  virtual void run() = 0;
  virtual const std::vector<float>* output() const { return nullptr; }
};

struct BenchMethod {
  std::string name;
  std::string summary;
  // Flops of one run by the method's own flop model.
  std::function<double(const Workload&)> flops;
  // Builds a case; returns nullptr when the workload does not apply (e.g. a grid method
  // when N is not a product of two near-equal sides). `inputs` outlive the case (CaseData).
  std::function<std::unique_ptr<BenchCase>(const Workload&, const BenchInputs&, const Context&)>
      prepare;
  bool approximates_exact = false;  // report the error against exact attention
  bool default_on = true;           // part of the default `subquad bench`
  // The method whose time in the same run the speed-up is measured against: causal
  // methods compare with causal exact attention.
  std::string baseline = "exact";
};

std::vector<AttendMethod>& attend_methods();
std::vector<BenchMethod>& bench_methods();

struct Registrar {
  explicit Registrar(AttendMethod method) { attend_methods().push_back(std::move(method)); }
  explicit Registrar(BenchMethod method) { bench_methods().push_back(std::move(method)); }
};

}  // namespace subquad::cli
