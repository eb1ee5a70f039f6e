// Bindings of WildCat coreset attention and KV-cache compression (include/subquad/wildcat.h):
// wildcat_attention and its baselines, weighted KV attention, and the CompressKV,
// StreamingLLM and SnapKV selections. float32 only, as the C++ API.
#include "common/option_names.h"
#include "subquad/wildcat.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

// Views of float32 arrays (float64 is rejected with the argument's name).
template <int Rank>
View<const float, Rank> float_input(const Array& array, const char* name) {
  check(common_scalar({{array, name}}) == Scalar::f32, name,
        ": expected dtype float32 (WildCat is float32 only), got float64");
  return input<float, Rank>(array, name);
}

// An int64 view of a named argument.
template <int Rank>
View<const int64_t, Rank> int64_input(const Array& array, const char* name) {
  check(array.dtype() == nb::dtype<int64_t>(), name, ": expected dtype int64, got ",
        dtype_name(array.dtype()));
  return input<int64_t, Rank>(array, name);
}

// A selection as arrays padded to its longest head (L): indices [B, Hkv, L] int64 (-1 past a
// head's entries), values [B, Hkv, L, Dv] (0), weights [B, Hkv, L] (0), log_scales
// [B, Hkv, L] (-inf), counts [B, Hkv] int64.
using SelectionArrays = TupleResult<NumpyArray, NumpyArray, NumpyArray, NumpyArray, NumpyArray>;

SelectionArrays selection_arrays(const KVSelection& selection) {
  const int64_t B = selection.batch, Hkv = selection.kv_heads, Dv = selection.value_dim;
  const int64_t L = selection.max_entries();
  Output<int64_t, 3> indices({B, Hkv, L});
  Output<float, 4> values({B, Hkv, L, Dv});
  Output<float, 3> weights({B, Hkv, L}), log_scales({B, Hkv, L});
  Output<int64_t, 2> counts({B, Hkv});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      const KVSelection::Head& head = selection.head(b, h);
      const auto count = static_cast<int64_t>(head.indices.size());
      counts.view()(b, h) = count;
      for (int64_t i = 0; i < L; ++i) {
        const bool held = i < count;
        indices.view()(b, h, i) = held ? head.indices[size_t(i)] : -1;
        weights.view()(b, h, i) = held ? head.weights[size_t(i)] : 0.0f;
        log_scales.view()(b, h, i) =
            held ? head.log_scales[size_t(i)] : -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < Dv; ++c)
          values.view()(b, h, i, c) = held ? head.values[size_t(i * Dv + c)] : 0.0f;
      }
    }
  return SelectionArrays(nb::make_tuple(indices.release(), values.release(), weights.release(),
                                        log_scales.release(), counts.release()));
}

SnapKVOptions snapkv_options(int64_t capacity, int64_t pool_kernel, std::optional<double> scale) {
  SnapKVOptions options;
  options.capacity = capacity;
  options.pool_kernel = pool_kernel;
  options.scale = scale;
  return options;
}

constexpr const char* kSelectionDoc =
    "(indices [B, Hkv, L] int64, values [B, Hkv, L, Dv], weights [B, Hkv, L], log_scales "
    "[B, Hkv, L], counts [B, Hkv] int64): the entries kept per (batch, kv head), padded to the "
    "longest head L (index -1, value 0, weight 0, log scale -inf past a head's count); an "
    "entry counts as exp(log_scale) [value, weight] for the token at its index.";

ArrayResult attention(const Array& q, const Array& k, const Array& v, int64_t rank, int64_t bins,
                      uint64_t seed, std::optional<double> scale, const std::string& method,
                      const std::string& query_radius, int64_t threads) {
  const Context context = context_for(threads);
  WildcatOptions options;
  options.rank = rank;
  options.bins = bins;
  options.seed = seed;
  options.scale = scale;
  options.method = parse_option(method, "method", kCoresetMethodNames);
  options.query_radius = parse_option(query_radius, "query_radius", kQueryRadiusNames);
  const auto q_view = float_input<4>(q, "q");
  const auto k_view = float_input<4>(k, "k");
  const auto v_view = float_input<4>(v, "v");
  Output<float, 4> out({q_view.dim(0), q_view.dim(1), q_view.dim(2), v_view.dim(3)});
  {
    nb::gil_scoped_release release;
    wildcat_attention(context, q_view, k_view, v_view, options, out.view());
  }
  return out.release();
}

// The KVSelection of padded selection arrays (selection_arrays' layout).
KVSelection selection_of(const Array& indices, const Array& values, const Array& weights,
                         const Array& log_scales, const Array& counts) {
  const auto index = int64_input<3>(indices, "indices");
  const auto count = int64_input<2>(counts, "counts");
  const auto value = float_input<4>(values, "values");
  const auto weight = float_input<3>(weights, "weights");
  const auto log_scale = float_input<3>(log_scales, "log_scales");
  const int64_t B = index.dim(0), Hkv = index.dim(1), L = index.dim(2), Dv = value.dim(3);
  check_shape(count, {B, Hkv}, "counts (expected [B, Hkv] like indices [B, Hkv, L])");
  check_shape(value, {B, Hkv, L, Dv}, "values (expected [B, Hkv, L, Dv] like indices)");
  check_shape(weight, {B, Hkv, L}, "weights (expected [B, Hkv, L] like indices)");
  check_shape(log_scale, {B, Hkv, L}, "log_scales (expected [B, Hkv, L] like indices)");
  KVSelection selection;
  selection.batch = B;
  selection.kv_heads = Hkv;
  selection.value_dim = Dv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t n = count(b, h);
      check(n >= 0 && n <= L, "counts: expected values in [0, ", L, "], got ", n);
      KVSelection::Head head;
      for (int64_t i = 0; i < n; ++i) {
        head.indices.push_back(index(b, h, i));
        head.values.insert(head.values.end(), value.row(b, h, i), value.row(b, h, i) + Dv);
        head.weights.push_back(weight(b, h, i));
        head.log_scales.push_back(log_scale(b, h, i));
      }
      selection.heads.push_back(std::move(head));
    }
  return selection;
}

// weighted_kv_entries' arrays: keys, values (weight last), log_scales, lengths, value_min,
// value_max.
using EntryArrays =
    TupleResult<NumpyArray, NumpyArray, NumpyArray, NumpyArray, NumpyArray, NumpyArray>;

EntryArrays entry_arrays(const WeightedKVEntries& e) {
  const int64_t B = e.batch, Hkv = e.kv_heads, L = e.entries, D = e.head_dim, Dv = e.value_dim;
  Output<float, 4> keys({B, Hkv, L, D}), values({B, Hkv, L, Dv + 1});
  Output<float, 3> log_scales({B, Hkv, L}), value_min({B, Hkv, Dv}), value_max({B, Hkv, Dv});
  Output<int64_t, 2> lengths({B, Hkv});
  std::copy(e.keys.begin(), e.keys.end(), keys.view().data);
  std::copy(e.values.begin(), e.values.end(), values.view().data);
  std::copy(e.log_scales.begin(), e.log_scales.end(), log_scales.view().data);
  std::copy(e.lengths.begin(), e.lengths.end(), lengths.view().data);
  std::copy(e.value_min.begin(), e.value_min.end(), value_min.view().data);
  std::copy(e.value_max.begin(), e.value_max.end(), value_max.view().data);
  return EntryArrays(nb::make_tuple(keys.release(), values.release(), log_scales.release(),
                                    lengths.release(), value_min.release(), value_max.release()));
}

ArrayResult weighted_attention(const Array& q, const Array& keys, const Array& values,
                               const Array& log_scales, const std::optional<Array>& lengths,
                               const std::optional<Array>& value_min,
                               const std::optional<Array>& value_max,
                               std::optional<double> scale, int64_t threads) {
  const Context context = context_for(threads);
  const auto q_view = float_input<4>(q, "q");
  WeightedKV kv;
  kv.keys = float_input<4>(keys, "keys");
  kv.values = float_input<4>(values, "values");
  kv.log_scales = float_input<3>(log_scales, "log_scales");
  if (lengths) kv.lengths = int64_input<2>(*lengths, "lengths");
  if (value_min) kv.value_min = float_input<3>(*value_min, "value_min");
  if (value_max) kv.value_max = float_input<3>(*value_max, "value_max");
  Output<float, 4> out({q_view.dim(0), q_view.dim(1), q_view.dim(2),
                        std::max<int64_t>(kv.values.dim(3) - 1, 0)});
  {
    nb::gil_scoped_release release;
    weighted_kv_attention(context, q_view, kv, out.view(), scale);
  }
  return out.release();
}

}  // namespace

void bind_wildcat(nb::module_& m) {
  m.def("wildcat_attention", &attention, "q"_a, "k"_a, "v"_a, nb::kw_only(), "rank"_a = 128,
        "bins"_a = 1, "seed"_a = 0, "scale"_a = nb::none(), "method"_a = "wildcat",
        "query_radius"_a = "keys", "threads"_a = 0,
        R"(WildCat: softmax attention over a weighted coreset of keys (float32, no grad).

q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] approximating
softmax(scale q k^T) v (scale None: 1/sqrt(D)). rank: coreset points per (batch, kv head)
over all bins; bins: contiguous key bins compressed independently (1 <= bins <= rank);
seed: same seed, inputs and threads give identical output. method "wildcat" (randomly
pivoted Cholesky + Nystrom weights), "uniform_nystrom" or "uniform_subsample" (also
spelled with "-" as on the command line). query_radius: the R_Q of the kernel
temperature, "keys" (R_Q = R_K, the bin's key radius, as CompressKV: the coreset depends on
the keys alone) or "queries" (max ||q|| over the kv group's queries).
rank >= M with one bin reproduces exact attention.)");

  m.def("lambert_w0", &lambert_w0, "x"_a, "Principal branch W0 of the Lambert W function, x >= 0.");
  m.def("wildcat_temperature", &wildcat_temperature, "beta"_a, "query_radius"_a, "key_radius"_a,
        "n"_a,
        "The kernel temperature tau for n keys of radius key_radius and queries of radius "
        "query_radius under softmax scale beta.");

  m.def("weighted_kv_attention", &weighted_attention, "q"_a, "keys"_a, "values"_a,
        "log_scales"_a, "lengths"_a = nb::none(), "value_min"_a = nb::none(),
        "value_max"_a = nb::none(), nb::kw_only(), "scale"_a = nb::none(), "threads"_a = 0,
        R"(Attention over weighted key-value entries the caller holds (float32, no grad).

q [B, N, H, D]; keys [B, Hkv, L, D]; values [B, Hkv, L, Dv + 1] (the entry's value row, then
its weight w); log_scales [B, Hkv, L] (finite, or -inf: never contributes); lengths
[B, Hkv] int64 (None: every head holds L); value_min, value_max [B, Hkv, Dv] (None: no clamp)
-> out [B, N, H, Dv] = clamp(sum_j p_j v_j / sum_j p_j w_j, value range) with
p_j = exp(scale q.k_j + log_scale_j - max) (scale None: 1/sqrt(D)); every query sees every
entry of its kv head. weighted_kv_entries(k, v, *selection) gives these arrays in order.)");

  m.def(
      "weighted_kv_entries",
      [](const Array& k, const Array& v, const Array& indices, const Array& values,
         const Array& weights, const Array& log_scales, const Array& counts) {
        const auto k_view = float_input<4>(k, "k");
        const auto v_view = float_input<4>(v, "v");
        const KVSelection selection = selection_of(indices, values, weights, log_scales, counts);
        WeightedKVEntries entries;
        {
          nb::gil_scoped_release release;
          entries = weighted_kv_entries(k_view, v_view, selection);
        }
        return entry_arrays(entries);
      },
      "k"_a, "v"_a, "indices"_a, "values"_a, "weights"_a, "log_scales"_a, "counts"_a,
      R"(The entries of a selection (what CompressKV.select, streaming_llm_select or
snapkv_select return, passed as *selection) of k [B, M, Hkv, D], v [B, M, Hkv, Dv]:
(keys [B, Hkv, L, D], values [B, Hkv, L, Dv + 1], log_scales [B, Hkv, L], lengths [B, Hkv]
int64, value_min, value_max [B, Hkv, Dv]), padded to the longest head (keys and values 0, log
scale -inf); the value range is that of all of v. The arguments of weighted_kv_attention.)");

  // Docstrings of the selections (static: nanobind keeps the pointers).
  static const std::string compress_select_doc =
      std::string("k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> the entries kept: ") +
      kSelectionDoc + " Coreset entries carry W V and W (weights may be negative).";
  static const std::string streaming_select_doc =
      std::string("The first `sink` and last `window` tokens of k [B, M, Hkv, D], v [B, M, Hkv, "
                  "Dv] (all of them when M <= sink + window), weight 1: ") + kSelectionDoc;
  static const std::string snapkv_select_doc =
      std::string("SnapKV: the prefix tokens the observation queries q_obs [B, W, H, D] vote for "
                  "most, then the W window tokens, weight 1: ") + kSelectionDoc;

  nb::class_<CompressKV>(m, "CompressKV",
                         R"(CompressKV: keeps `sink` first and `window` last tokens exactly and
compresses the middle bin by bin to WildCat coresets built without queries.

CompressKV(*, sink=32, window=32, compression_ratio=0.75, bin_rank=16, seed=0, scale=None);
compression_ratio is the fraction of the middle removed (0.75 keeps 25%).)")
      .def(
          "__init__",
          [](CompressKV* self, int64_t sink, int64_t window, double compression_ratio,
             int64_t bin_rank, uint64_t seed, std::optional<double> scale) {
            CompressKVOptions options;
            options.sink = sink;
            options.window = window;
            options.compression_ratio = compression_ratio;
            options.bin_rank = bin_rank;
            options.seed = seed;
            options.scale = scale;
            new (self) CompressKV(options);
          },
          nb::kw_only(), "sink"_a = 32, "window"_a = 32, "compression_ratio"_a = 0.75,
          "bin_rank"_a = 16, "seed"_a = 0, "scale"_a = nb::none())
      .def(
          "select",
          [](const CompressKV& compressor, const Array& k, const Array& v, int64_t threads) {
            const Context context = context_for(threads);
            const auto k_view = float_input<4>(k, "k");
            const auto v_view = float_input<4>(v, "v");
            KVSelection selection;
            {
              nb::gil_scoped_release release;
              selection = compressor.select(context, k_view, v_view);
            }
            return selection_arrays(selection);
          },
          "k"_a, "v"_a, nb::kw_only(), "threads"_a = 0,
          compress_select_doc.c_str())
      .def("bins", &CompressKV::bins, "M"_a, "Coreset bins the middle of M tokens is split into.");

  m.def(
      "streaming_llm_select",
      [](const Array& k, const Array& v, int64_t sink, int64_t window) {
        const auto k_view = float_input<4>(k, "k");
        const auto v_view = float_input<4>(v, "v");
        KVSelection selection;
        {
          nb::gil_scoped_release release;
          selection = streaming_llm_select(k_view, v_view, sink, window);
        }
        return selection_arrays(selection);
      },
      "k"_a, "v"_a, nb::kw_only(), "sink"_a = 32, "window"_a = 32,
      streaming_select_doc.c_str());

  m.def(
      "snapkv_select",
      [](const Array& q_obs, const Array& k, const Array& v, int64_t capacity, int64_t pool_kernel,
         std::optional<double> scale, int64_t threads) {
        const Context context = context_for(threads);
        const SnapKVOptions options = snapkv_options(capacity, pool_kernel, scale);
        const auto q_view = float_input<4>(q_obs, "q_obs");
        const auto k_view = float_input<4>(k, "k");
        const auto v_view = float_input<4>(v, "v");
        KVSelection selection;
        {
          nb::gil_scoped_release release;
          selection = snapkv_select(context, q_view, k_view, v_view, options);
        }
        return selection_arrays(selection);
      },
      "q_obs"_a, "k"_a, "v"_a, nb::kw_only(), "capacity"_a = 256, "pool_kernel"_a = 7,
      "scale"_a = nb::none(), "threads"_a = 0,
      snapkv_select_doc.c_str());
}

const BindingRegistrar wildcat_bindings("wildcat", &bind_wildcat);

}  // namespace subquad::python
