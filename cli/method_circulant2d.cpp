// CLI methods of 2D circulant attention: `subquad attend --method circulant2d` on grid
// inputs [B, Hg, Wg, H, D], and the `circulant2d` bench row, which lays the harness's N
// tokens out on the most square grid (Hg the largest divisor of N with Hg <= sqrt(N)),
// with its FFT lower bound rows `circulant2d-fft-bound` (real transforms of v) and
// `circulant2d-fft-bound-packed` (complex transforms of v's planes in pairs).
#include <algorithm>
#include <cmath>
#include <complex>
#include <memory>
#include <optional>

#include "arrays.h"
#include "common/buffer.h"
#include "common/fft.h"
#include "common/option_names.h"
#include "registry.h"
#include "subquad/circulant2d.h"
#include "subquad/cost.h"

namespace subquad::cli {
namespace {

Circulant2dOptions parse_circulant2d_options(const ParsedOptions& options) {
  check(!(options.has("scale") && options.has("scale-mode")),
        "options --scale and --scale-mode are mutually exclusive: give one of them");
  Circulant2dOptions parsed;
  if (options.has("scale")) parsed.scale = options.number("scale");  // checked by the library
  parsed.scale_mode = parse_option(options.string_or("scale-mode", "paper"), "option --scale-mode",
                                   kCirculant2dScaleModeNames);
  return parsed;
}

std::map<std::string, NpyArray> run_attend(const ParsedOptions& options,
                                           const Context& context) {
  const Circulant2dOptions parsed = parse_circulant2d_options(options);
  return in_precision(
      {options.array("q"), options.array("k"), options.array("v")},
      [&]<typename T>(const std::vector<NpyArray>& qkv) {
        const View5<const T> q = input_view<T, 5>(qkv[0], "q");
        const View5<const T> k = input_view<T, 5>(qkv[1], "k");
        const View5<const T> v = input_view<T, 5>(qkv[2], "v");
        std::map<std::string, NpyArray> outputs;
        const View5<T> out = output_view<T, 5>(outputs, "out", v.shape);
        const View4<T> weights =
            output_view<T, 4>(outputs, "weights", {q.dim(0), q.dim(3), q.dim(1), q.dim(2)});
        circulant2d_forward<T>(context, q, k, v, parsed, out, weights);
        return outputs;
      });
}

const Registrar attend_registrar(AttendMethod{
    "circulant2d",
    "2D circulant (BCCB) attention on a token grid (Han et al. 2026): q, k [B, Hg, Wg, H, D], "
    "v [B, Hg, Wg, H, Dv] -> out [B, Hg, Wg, H, Dv]",
    {{"q", "PATH", "queries [B, Hg, Wg, H, D] (.npy)", true},
     {"k", "PATH", "keys [B, Hg, Wg, H, D] (.npy)", true},
     {"v", "PATH", "values [B, Hg, Wg, H, Dv] (.npy)", true},
     {"scale-mode", option_choices(kCirculant2dScaleModeNames),
      "logit scale: paper 1/(N sqrt(D)) (default) or code 1/sqrt(N) (released checkpoints)"},
     {"scale", "S", "explicit logit scale (excludes --scale-mode)"},
     {"weights", "PATH", "also write the softmax weights s [B, H, Hg, Wg] (.npy)"}},
    run_attend});

// The library's flop model (subquad/cost.h): real 2D transforms count 2.5 N log2 N, as CAT's.
double circulant2d_flops(const Workload& w) {
  return circulant2d_forward_cost(w.batch, w.tokens, w.heads, w.head_dim, w.value_dim,
                                  sizeof(float))
      .flops;
}

class Circulant2dCase : public BenchCase {
 public:
  Circulant2dCase(const Workload& w, const BenchInputs& inputs, const Context& context)
      : data_(w, inputs), context_(context), grid_(circulant2d_grid_for_tokens(w.tokens)) {
    q_ = as_grid(data_.q, grid_, "q");
    k_ = as_grid(data_.k, grid_, "k");
    v_ = as_grid(data_.v, grid_, "v");
    out_view_ = as_grid(data_.out_view(), grid_, "out");
  }
  void run() override {
    circulant2d_forward<float>(context_, q_, k_, v_, Circulant2dOptions{}, out_view_,
                               View4<float>());
  }
  const std::vector<float>* output() const override { return &data_.out; }

 private:
  CaseData data_;
  Context context_;
  Grid grid_;
  View5<const float> q_, k_, v_;
  View5<float> out_view_;
};

const Registrar bench_registrar(BenchMethod{
    "circulant2d",
    "2D circulant attention, tokens on the most square Hg x Wg grid (not an approximation "
    "of exact attention: no error column)",
    circulant2d_flops,
    [](const Workload& w, const BenchInputs& inputs, const Context& context) {
      return std::unique_ptr<BenchCase>(std::make_unique<Circulant2dCase>(w, inputs, context));
    },
    /*approximates_exact=*/false, /*default_on=*/true});

// The FFT lower bounds of the circulant2d row: the forward and inverse 2D transforms of v
// alone (B H Dv planes on the same grid, contiguous, one batched plan), nothing else; either
// real transforms of each plane, or complex transforms of plane pairs packed as x + i y (what
// the kernel runs).
class Circulant2dFftBoundCase : public BenchCase {
 public:
  Circulant2dFftBoundCase(const Workload& w, const Grid& grid, bool packed)
      : packed_(packed), planes_(w.batch * w.heads * w.value_dim) {
    if (packed_) {
      ComplexFftLayout layout;
      layout.rank = 2;
      layout.n0 = grid.rows;
      layout.n1 = grid.cols;
      layout.batch = w.batch * w.heads * ((w.value_dim + 1) / 2);
      complex_plan_ = ComplexFftPlan<float>::get(layout);
      signal_ = Buffer<std::complex<float>>(layout.batch * w.tokens);
      spectrum_ = Buffer<std::complex<float>>(layout.batch * w.tokens);
    } else {
      RealFftLayout layout;
      layout.rank = 2;
      layout.n0 = grid.rows;
      layout.n1 = grid.cols;
      layout.batch = planes_;
      real_plan_ = RealFftPlan<float>::get(layout);
      real_ = Buffer<float>(planes_ * w.tokens);
      spectrum_ = Buffer<std::complex<float>>(planes_ * layout.spectrum_size());
    }
  }
  void run() override {
    if (packed_) {
      complex_plan_->forward(signal_.data(), spectrum_.data());
      complex_plan_->inverse(spectrum_.data(), signal_.data());
    } else {
      real_plan_->forward(real_.data(), spectrum_.data());
      real_plan_->inverse(spectrum_.data(), real_.data());
    }
  }

 private:
  bool packed_;
  int64_t planes_;
  std::optional<RealFftPlan<float>> real_plan_;
  std::optional<ComplexFftPlan<float>> complex_plan_;
  Buffer<float> real_;
  Buffer<std::complex<float>> signal_, spectrum_;
};

double fft_bound_flops(const Workload& w) {
  return circulant2d_fft_bound_cost(w.batch, w.tokens, w.heads, w.value_dim, sizeof(float))
      .flops;
}

BenchMethod fft_bound(const char* name, const char* summary, bool packed) {
  return BenchMethod{
      name, summary, fft_bound_flops,
      [packed](const Workload& w, const BenchInputs&, const Context&) {
        return std::unique_ptr<BenchCase>(std::make_unique<Circulant2dFftBoundCase>(
            w, circulant2d_grid_for_tokens(w.tokens), packed));
      },
      /*approximates_exact=*/false, /*default_on=*/true};
}

const Registrar fft_bound_registrar(fft_bound(
    "circulant2d-fft-bound",
    "lower bound of circulant2d: forward + inverse real 2D FFTs of v alone, same grid", false));
const Registrar packed_fft_bound_registrar(fft_bound(
    "circulant2d-fft-bound-packed",
    "forward + inverse complex 2D FFTs of v's planes packed in pairs (what circulant2d runs), "
    "same grid",
    true));

}  // namespace
}  // namespace subquad::cli
