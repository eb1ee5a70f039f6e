// CLI methods of exact attention: `subquad attend --method exact` on .npy inputs
// q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv], and the bench rows `exact`
// (non-causal) and `exact-causal`, the baseline every other method is compared against.
#include <cmath>
#include <memory>
#include <utility>

#include "arrays.h"
#include "registry.h"
#include "subquad/bfloat16.h"
#include "subquad/cost.h"
#include "subquad/exact.h"

namespace subquad::cli {
namespace {

ExactOptions parse_exact_options(const ParsedOptions& options) {
  ExactOptions parsed;
  parsed.causal = options.flag("causal");
  if (options.has("scale")) {
    parsed.scale = options.number("scale");
    check(std::isfinite(*parsed.scale) && *parsed.scale > 0,
          "option --scale: expected a finite number > 0, got ", options.string("scale"));
  }
  if (options.has("window")) {
    parsed.window = options.integer("window");
    check(parsed.window >= 0, "option --window: expected an integer >= 0, got ",
          options.string("window"));
  }
  return parsed;
}

// --dtype bf16: q, k, v rounded to bfloat16 (nearest even), the bfloat16 kernel (float32
// accumulation), out written as float32 (bfloat16 values exactly), lse float32.
std::map<std::string, NpyArray> run_attend_bf16(const std::vector<NpyArray>& arrays,
                                                const ExactOptions& parsed,
                                                const Context& context) {
  std::vector<NpyArray> qkv;
  std::vector<std::vector<bfloat16>> rounded;
  for (const NpyArray& array : arrays) {
    qkv.push_back(array.converted(DType::float32));
    const float* data = qkv.back().data<float>();
    std::vector<bfloat16> values(qkv.back().bytes.size() / sizeof(float));
    for (size_t i = 0; i < values.size(); ++i) values[i] = bfloat16(data[i]);
    rounded.push_back(std::move(values));
  }
  return attend_with_lse<float>(qkv, [&](auto q, auto k, auto v, View4<float> out,
                                          View3<float> lse) {
    auto bf16_view = [](const std::vector<bfloat16>& values, const View4<const float>& like) {
      return View4<const bfloat16>(values.data(), like.shape);
    };
    std::vector<bfloat16> result(checked_product(out.shape, "out"));
    exact_attention_forward<bfloat16>(context, bf16_view(rounded[0], q), bf16_view(rounded[1], k),
                                      bf16_view(rounded[2], v), parsed,
                                      View4<bfloat16>(result.data(), out.shape), lse);
    for (size_t i = 0; i < result.size(); ++i) out.data[i] = static_cast<float>(result[i]);
  });
}

std::map<std::string, NpyArray> run_attend(const ParsedOptions& options, const Context& context) {
  const ExactOptions parsed = parse_exact_options(options);
  const std::string dtype = options.string_or("dtype", "auto");
  check(dtype == "auto" || dtype == "bf16", "option --dtype: expected auto or bf16, got '", dtype,
        "'");
  if (dtype == "bf16")
    return run_attend_bf16({options.array("q"), options.array("k"), options.array("v")}, parsed,
                           context);
  return in_precision({options.array("q"), options.array("k"), options.array("v")},
                      [&]<typename T>(const std::vector<NpyArray>& qkv) {
                        return attend_with_lse<T>(
                            qkv, [&](auto q, auto k, auto v, auto out, auto lse) {
                              exact_attention_forward<T>(context, q, k, v, parsed, out, lse);
                            });
                      });
}

const Registrar attend_registrar(AttendMethod{
    "exact",
    "exact softmax attention (tiled online softmax): q [B, N, H, D], k [B, M, Hkv, D], "
    "v [B, M, Hkv, Dv] -> out [B, N, H, Dv]",
    {{"q", "PATH", "queries [B, N, H, D] (.npy)", true},
     {"k", "PATH", "keys [B, M, Hkv, D] (.npy), H a multiple of Hkv", true},
     {"v", "PATH", "values [B, M, Hkv, Dv] (.npy)", true},
     {"causal", "", "causal mask, bottom-right aligned: query i sees key j iff j <= i + M - N"},
     {"scale", "S", "logit scale (default 1/sqrt(D))"},
     {"window", "W", "sliding window: query i sees the W keys up to i + M - N (implies causal)"},
     {"lse", "PATH", "also write the log-sum-exp of the scores lse [B, H, N] (.npy)"},
     {"dtype", "TYPE",
      "auto (default: float64 when all inputs are, else float32) or bf16: inputs rounded to "
      "bfloat16, float32 accumulation, out (bfloat16 values) and lse written as float32"}},
    run_attend});

// The library's flop model (subquad/cost.h): 2 (D + Dv) per visible pair.
double exact_flops(const Workload& w, bool causal) {
  return exact_attention_forward_cost(w.batch, w.tokens, w.tokens, w.heads, w.heads, w.head_dim,
                                      w.value_dim, causal, 0, sizeof(float))
      .flops;
}

class ExactCase : public BenchCase {
 public:
  ExactCase(const Workload& w, const BenchInputs& inputs, const Context& context, bool causal)
      : data_(w, inputs), context_(context), lse_(w.batch * w.heads * w.tokens) {
    options_.causal = causal;
    lse_view_ = View3<float>(lse_.data(), {w.batch, w.heads, w.tokens});
  }
  void run() override {
    exact_attention_forward<float>(context_, data_.q, data_.k, data_.v, options_,
                                   data_.out_view(), lse_view_);
  }
  const std::vector<float>* output() const override { return &data_.out; }

 private:
  CaseData data_;
  Context context_;
  ExactOptions options_;
  std::vector<float> lse_;
  View3<float> lse_view_;
};

BenchMethod exact_bench_method(bool causal) {
  return BenchMethod{
      causal ? "exact-causal" : "exact",
      causal ? "exact attention, causal mask (half the flops of exact)"
             : "exact attention (tiled online softmax), the baseline",
      [causal](const Workload& w) { return exact_flops(w, causal); },
      [causal](const Workload& w, const BenchInputs& inputs, const Context& context) {
        return std::unique_ptr<BenchCase>(std::make_unique<ExactCase>(w, inputs, context, causal));
      },
      /*approximates_exact=*/false,
      /*default_on=*/true};
}

const Registrar bench_registrar(exact_bench_method(false));
const Registrar bench_causal_registrar(exact_bench_method(true));

}  // namespace
}  // namespace subquad::cli
