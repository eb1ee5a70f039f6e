// CLI methods of structured-matrix attention: `subquad attend --method mlr` (MLR attention,
// q, k [B, T, H|Hkv, D], v [B, T, Hkv, Dv]) and the bench rows `mlr` (causal, ranks
// 32|8|6|4|4|4|4|2 scaled to the head dim) and `sliding-window` (exact, window 512, causal).
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <utility>

#include "arrays.h"
#include "registry.h"
#include "subquad/cost.h"
#include "subquad/exact.h"
#include "subquad/structured.h"

namespace subquad::cli {
namespace {

constexpr int64_t kLanguageModelHeadDim = 64;
constexpr int64_t kSplitsEveryLevel = int64_t{1} << 20;  // tokens 2^(L-1) divides for any L
constexpr int64_t kSlidingWindow = 512;

std::map<std::string, NpyArray> run_attend(const ParsedOptions& options, const Context& context) {
  const MlrOptions parsed{options.integer_list("ranks"), options.flag("causal"),
                          options.flag("block-divide")};
  return in_precision({options.array("q"), options.array("k"), options.array("v")},
                      [&]<typename T>(const std::vector<NpyArray>& qkv) {
                        return attend_with_lse<T>(
                            qkv, [&](auto q, auto k, auto v, auto out, auto lse) {
                              mlr_attention_forward<T>(context, q, k, v, parsed, out, lse);
                            });
                      });
}

const Registrar attend_registrar(AttendMethod{
    "mlr",
    "MLR attention (Kuang et al. 2025): multi-level low-rank scores, level l adds rank r_l "
    "within 2^(l-1) equal sequence blocks; q, k [B, T, H|Hkv, D], v [B, T, Hkv, Dv] -> "
    "out [B, T, H, Dv]",
    {{"q", "PATH", "queries [B, T, H, D] (.npy)", true},
     {"k", "PATH", "keys [B, T, Hkv, D] (.npy), H a multiple of Hkv", true},
     {"v", "PATH", "values [B, T, Hkv, Dv] (.npy)", true},
     {"ranks", "LIST", "level ranks r_1,...,r_L summing to D; T divisible by 2^(L-1)", true},
     {"causal", "", "causal mask: query i sees keys j <= i"},
     {"block-divide", "", "divide each score by the number of levels sharing the pair"},
     {"lse", "PATH", "also write the log-sum-exp of the scores lse [B, H, T] (.npy)"}},
    run_attend});

// The library's flop models (subquad/cost.h).
double mlr_flops(const Workload& w) {
  return mlr_attention_forward_cost(w.batch, w.tokens, w.heads, w.heads, w.head_dim,
                                    w.value_dim, mlr_language_model_ranks(w.head_dim, w.tokens),
                                    /*causal=*/true, sizeof(float))
      .flops;
}

double sliding_window_flops(const Workload& w) {
  return exact_attention_forward_cost(w.batch, w.tokens, w.tokens, w.heads, w.heads, w.head_dim,
                                      w.value_dim, /*causal=*/true, kSlidingWindow, sizeof(float))
      .flops;
}

// Holds the harness's inputs and the output; runs MLR (ranks set) or exact with a window.
class StructuredCase : public BenchCase {
 public:
  StructuredCase(const Workload& w, const BenchInputs& inputs, const Context& context,
                 std::vector<int64_t> ranks)
      : data_(w, inputs),
        context_(context),
        lse_(w.batch * w.heads * w.tokens),
        mlr_{std::move(ranks), true, true} {
    exact_.window = kSlidingWindow;
    exact_.causal = true;
    lse_view_ = View3<float>(lse_.data(), {w.batch, w.heads, w.tokens});
  }
  void run() override {
    if (mlr_.ranks.empty())
      exact_attention_forward<float>(context_, data_.q, data_.k, data_.v, exact_,
                                     data_.out_view(), lse_view_);
    else
      mlr_attention_forward<float>(context_, data_.q, data_.k, data_.v, mlr_, data_.out_view(),
                                   lse_view_);
  }
  const std::vector<float>* output() const override { return &data_.out; }

 private:
  CaseData data_;
  Context context_;
  std::vector<float> lse_;
  MlrOptions mlr_;
  ExactOptions exact_;
  View3<float> lse_view_;
};

std::string mlr_summary() {
  const double per_pair =
      mlr_score_macs(1, mlr_language_model_ranks(kLanguageModelHeadDim, kSplitsEveryLevel));
  std::ostringstream text;
  text.precision(3);
  text << "MLR attention, causal, block_divide, ranks 32|8|6|4|4|4|4|2 at D = 64 (scaled to "
          "other D); flop-model speed-up over exact-causal at D = Dv = 64: "
       << (2.0 * kLanguageModelHeadDim) / (per_pair + kLanguageModelHeadDim);
  return text.str();
}

// Fields are set by name so that the rows keep their meaning as BenchMethod grows.
BenchMethod structured_bench_method(std::string name, std::string summary,
                                    std::function<double(const Workload&)> flops, bool mlr) {
  BenchMethod method;
  method.name = std::move(name);
  method.summary = std::move(summary);
  method.flops = std::move(flops);
  method.prepare = [mlr](const Workload& w, const BenchInputs& inputs, const Context& context) {
    std::vector<int64_t> ranks;
    if (mlr) ranks = mlr_language_model_ranks(w.head_dim, w.tokens);
    return std::unique_ptr<BenchCase>(
        std::make_unique<StructuredCase>(w, inputs, context, std::move(ranks)));
  };
  method.approximates_exact = false;  // different score functions, not approximations
  method.baseline = "exact-causal";   // both rows are causal
  method.default_on = true;
  return method;
}

const Registrar mlr_bench_registrar(structured_bench_method("mlr", mlr_summary(), mlr_flops,
                                                            /*mlr=*/true));

const Registrar sliding_window_bench_registrar(structured_bench_method(
    "sliding-window",
    "exact attention with a causal sliding window of 512 keys (the MLR paper's baseline); "
    "flop-model speed-up over exact-causal: N^2 / (2 sum_i min(i + 1, 512))",
    sliding_window_flops, /*mlr=*/false));

}  // namespace
}  // namespace subquad::cli
