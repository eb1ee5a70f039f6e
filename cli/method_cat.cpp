// CLI methods of CAT (1D): `subquad attend --method cat | cat-avgkey | cat-causal`, and the
// bench rows cat, cat-causal, cat-avgkey, fft-lower-bound (the forward and inverse real
// transforms of v's columns alone) and fft-lower-bound-packed (the same columns packed in
// pairs as complex signals, the transforms cat itself runs). Bench scores: z = q[:, :, :, 0] (standard
// normal).
#include <cmath>
#include <memory>

#include "arrays.h"
#include "cat/cat_fft_lower_bound.h"
#include "common/option_names.h"
#include "registry.h"
#include "subquad/cat.h"
#include "subquad/cost.h"

namespace subquad::cli {
namespace {

CatConvention parse_convention(const ParsedOptions& options) {
  return parse_option(options.string_or("convention", "roll"), "option --convention",
                      kCatConventionNames);
}

std::map<std::string, NpyArray> run_cat(const ParsedOptions& options, const Context& context) {
  const CatOptions parsed{parse_convention(options)};
  return in_precision({options.array("z"), options.array("v")},
                      [&]<typename T>(const std::vector<NpyArray>& a) {
                        const View3<const T> z = input_view<T, 3>(a[0], "z");
                        const View4<const T> v = input_view<T, 4>(a[1], "v");
                        std::map<std::string, NpyArray> outputs;
                        cat_forward<T>(context, z, v, parsed,
                                       output_view<T, 4>(outputs, "out", v.shape));
                        return outputs;
                      });
}

std::map<std::string, NpyArray> run_cat_causal(const ParsedOptions& options,
                                               const Context& context) {
  return in_precision({options.array("z"), options.array("v")},
                      [&]<typename T>(const std::vector<NpyArray>& a) {
                        const View3<const T> z = input_view<T, 3>(a[0], "z");
                        const View4<const T> v = input_view<T, 4>(a[1], "v");
                        std::map<std::string, NpyArray> outputs;
                        cat_causal_forward<T>(context, z, v, {},
                                              output_view<T, 4>(outputs, "out", v.shape));
                        return outputs;
                      });
}

std::map<std::string, NpyArray> run_cat_avgkey(const ParsedOptions& options,
                                               const Context& context) {
  CatAvgKeyOptions parsed;
  parsed.convention = parse_convention(options);
  if (options.has("scale")) parsed.scale = options.number("scale");  // checked by the library
  return in_precision({options.array("q"), options.array("k"), options.array("v")},
                      [&]<typename T>(const std::vector<NpyArray>& a) {
                        const View4<const T> q = input_view<T, 4>(a[0], "q");
                        const View4<const T> k = input_view<T, 4>(a[1], "k");
                        const View4<const T> v = input_view<T, 4>(a[2], "v");
                        std::map<std::string, NpyArray> outputs;
                        cat_avgkey_forward<T>(context, q, k, v, parsed,
                                              output_view<T, 4>(outputs, "out", v.shape));
                        return outputs;
                      });
}

const OptionSpec kConventionOption{
    "convention", option_choices(kCatConventionNames),
    "index convention: roll A[i, j] = s[(j - i) mod N] (default), conv A[i, j] = s[(i - j) mod N]"};

const Registrar cat_registrar(AttendMethod{
    "cat",
    "CAT, circular-convolutional attention (Yamada 2025): z [B, N, H], v [B, N, H, Dv] -> "
    "out = circulant(softmax(z)) v per head",
    {{"z", "PATH", "scores [B, N, H] (.npy)", true},
     {"v", "PATH", "values [B, N, H, Dv] (.npy)", true},
     kConventionOption},
    run_cat});

const Registrar cat_causal_registrar(AttendMethod{
    "cat-causal",
    "causal CAT, lag convention: out[i] = sum_{k<=i} exp(z[k]) v[i-k] / sum_{k<=i} exp(z[k])",
    {{"z", "PATH", "scores [B, N, H] (.npy)", true},
     {"v", "PATH", "values [B, N, H, Dv] (.npy)", true}},
    run_cat_causal});

const Registrar cat_avgkey_registrar(AttendMethod{
    "cat-avgkey",
    "averaged-key CAT: z = scale <q[i], mean_j k[j]>, then CAT; q, k [B, N, H, D], v [B, N, H, Dv]",
    {{"q", "PATH", "queries [B, N, H, D] (.npy)", true},
     {"k", "PATH", "keys [B, N, H, D] (.npy)", true},
     {"v", "PATH", "values [B, N, H, Dv] (.npy)", true},
     {"scale", "S", "score scale (default 1/sqrt(D))"},
     kConventionOption},
    run_cat_avgkey});

// Flop models: the library's (subquad/cost.h), float32.
double cat_flops(const Workload& w) {
  return cat_forward_cost(w.batch, w.tokens, w.heads, w.value_dim, sizeof(float)).flops;
}
double cat_causal_flops(const Workload& w) {
  return cat_causal_forward_cost(w.batch, w.tokens, w.heads, w.value_dim, sizeof(float)).flops;
}
double cat_avgkey_flops(const Workload& w) {
  return cat_avgkey_forward_cost(w.batch, w.tokens, w.heads, w.head_dim, w.value_dim,
                                 sizeof(float))
      .flops;
}
double fft_lower_bound_flops(const Workload& w) {
  return cat_fft_lower_bound_cost(w.batch, w.tokens, w.heads, w.value_dim, sizeof(float)).flops;
}

// z [B, N, H] = the first feature of each query: standard normal scores.
std::vector<float> bench_scores(const Workload& w, const BenchInputs& inputs) {
  std::vector<float> z(w.batch * w.tokens * w.heads);
  for (size_t i = 0; i < z.size(); ++i) z[i] = inputs.q[i * w.head_dim];
  return z;
}

class CatCase : public BenchCase {
 public:
  enum class Kind { circulant, causal, avgkey };
  CatCase(Kind kind, const Workload& w, const BenchInputs& inputs, const Context& context)
      : kind_(kind), data_(w, inputs), context_(context), z_(bench_scores(w, inputs)) {}
  void run() override {
    const View3<const float> z(z_.data(), {data_.v.dim(0), data_.v.dim(1), data_.v.dim(2)});
    switch (kind_) {
      case Kind::circulant:
        cat_forward<float>(context_, z, data_.v, {}, data_.out_view());
        break;
      case Kind::causal:
        cat_causal_forward<float>(context_, z, data_.v, {}, data_.out_view());
        break;
      case Kind::avgkey:
        cat_avgkey_forward<float>(context_, data_.q, data_.k, data_.v, {}, data_.out_view());
        break;
    }
  }
  const std::vector<float>* output() const override { return &data_.out; }

 private:
  Kind kind_;
  CaseData data_;
  Context context_;
  std::vector<float> z_;  // [B, N, H] scores derived from q
};

class LowerBoundCase : public BenchCase {
 public:
  LowerBoundCase(CatFftPacking packing, const Workload& w, const BenchInputs& inputs,
                 const Context& context)
      : context_(context),
        baseline_(View4<const float>(inputs.v.data(), {w.batch, w.tokens, w.heads, w.value_dim}),
                  packing) {}
  void run() override { baseline_.run(context_); }

 private:
  Context context_;
  CatFftLowerBound<float> baseline_;
};

BenchMethod cat_bench(const char* name, const char* summary, CatCase::Kind kind,
                      double (*flops)(const Workload&)) {
  return BenchMethod{
      name, summary, flops,
      [kind](const Workload& w, const BenchInputs& inputs, const Context& context) {
        return std::unique_ptr<BenchCase>(std::make_unique<CatCase>(kind, w, inputs, context));
      },
      /*approximates_exact=*/false, /*default_on=*/true,
      /*baseline=*/kind == CatCase::Kind::causal ? "exact-causal" : "exact"};
}

const Registrar cat_bench_registrar(cat_bench(
    "cat", "CAT forward (roll), z = q[..., 0]; flops: 2.5 N log2 N per real transform (cost.h)",
    CatCase::Kind::circulant, cat_flops));
const Registrar cat_causal_bench_registrar(cat_bench(
    "cat-causal", "causal CAT forward, z = q[..., 0]; flops: float64 transforms of length 2N",
    CatCase::Kind::causal, cat_causal_flops));
const Registrar cat_avgkey_bench_registrar(cat_bench(
    "cat-avgkey", "averaged-key CAT forward (z = q . mean k / sqrt(D))", CatCase::Kind::avgkey,
    cat_avgkey_flops));
BenchMethod lower_bound_bench(const char* name, const char* summary, CatFftPacking packing) {
  return BenchMethod{
      name, summary, fft_lower_bound_flops,
      [packing](const Workload& w, const BenchInputs& inputs, const Context& context) {
        return std::unique_ptr<BenchCase>(
            std::make_unique<LowerBoundCase>(packing, w, inputs, context));
      },
      /*approximates_exact=*/false, /*default_on=*/true};
}

const Registrar lower_bound_registrar(lower_bound_bench(
    "fft-lower-bound",
    "forward + inverse real transforms of v's columns alone (contiguous rows, one per plan), "
    "2 Dv per head",
    CatFftPacking::real_columns));
const Registrar packed_lower_bound_registrar(lower_bound_bench(
    "fft-lower-bound-packed",
    "forward + inverse complex transforms of v's column pairs packed as x + i y (contiguous "
    "rows, one per plan; what cat runs), Dv per head",
    CatFftPacking::packed_pairs));

}  // namespace
}  // namespace subquad::cli
