// Bindings of WildCat coreset attention and KV-cache compression (include/subquad/wildcat.h):
// wildcat_attention and its baselines, the weighted KV cache, CompressKV, StreamingLLM and
// SnapKV caches. float32 only, as the C++ API.
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
#include "decode_cache.h"

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

// A new [size] array holding `values`.
ArrayResult vector(const std::vector<float>& values) {
  Output<float, 1> array({int64_t(values.size())});
  std::copy(values.begin(), values.end(), array.view().data);
  return array.release();
}

// A new [size / columns, columns] array holding `values`.
ArrayResult matrix(const std::vector<float>& values, int64_t columns) {
  Output<float, 2> array({columns > 0 ? int64_t(values.size()) / columns : 0, columns});
  std::copy(values.begin(), values.end(), array.view().data);
  return array.release();
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
                      int64_t threads) {
  const Context context = context_for(threads);
  WildcatOptions options;
  options.rank = rank;
  options.bins = bins;
  options.seed = seed;
  options.scale = scale;
  options.method = parse_option(method, "method", kCoresetMethodNames);
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

// The [B, N, H, Dv] output of attending `cache` with q.
ArrayResult cache_attend(const WeightedKVCache& cache, const Array& q, std::optional<double> scale,
                         int64_t threads) {
  const Context context = context_for(threads);
  const auto q_view = float_input<4>(q, "q");
  Output<float, 4> out({q_view.dim(0), q_view.dim(1), q_view.dim(2), cache.value_dim()});
  {
    nb::gil_scoped_release release;
    cache.attend(context, q_view, out.view(), scale);
  }
  return out.release();
}

// A [size] float32 row of a named argument, checked against the expected length.
const float* row(const Array& array, const char* name, int64_t size) {
  const auto view = float_input<1>(array, name);
  check(view.dim(0) == size, name, ": expected shape [", size, "], got [", view.dim(0), "]");
  return view.data;
}

}  // namespace

void bind_wildcat(nb::module_& m) {
  m.def("wildcat_attention", &attention, "q"_a, "k"_a, "v"_a, nb::kw_only(), "rank"_a = 128,
        "bins"_a = 1, "seed"_a = 0, "scale"_a = nb::none(), "method"_a = "wildcat", "threads"_a = 0,
        R"(WildCat: softmax attention over a weighted coreset of keys (float32, no grad).

q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] approximating
softmax(scale q k^T) v (scale None: 1/sqrt(D)). rank: coreset points per (batch, kv head)
over all bins; bins: contiguous key bins compressed independently (1 <= bins <= rank);
seed: same seed, inputs and threads give identical output. method "wildcat" (randomly
pivoted Cholesky + Nystrom weights), "uniform_nystrom" or "uniform_subsample" (also
spelled with "-" as on the command line).
rank >= M with one bin reproduces exact attention.)");

  m.def("lambert_w0", &lambert_w0, "x"_a, "Principal branch W0 of the Lambert W function, x >= 0.");
  m.def("wildcat_temperature", &wildcat_temperature, "beta"_a, "query_radius"_a, "key_radius"_a,
        "n"_a,
        "The kernel temperature tau for n keys of radius key_radius and queries of radius "
        "query_radius under softmax scale beta.");

  nb::class_<WeightedKVCache> cache(m, "WeightedKVCache",
                                    R"(A KV cache whose entries carry weights (float32).

WeightedKVCache(batch, kv_heads, head_dim, value_dim). Attention over it is
out = clamp(sum_j p_j v_j / sum_j p_j w_j, value range), p_j = exp(scale q.k_j - max).
The decoding verbs (update, append, truncate, clone, seen, memory_bytes) are those of
every cache; truncate works while the cache holds exactly the tokens appended.)");
  cache.def(nb::init<int64_t, int64_t, int64_t, int64_t>(), "batch"_a, "kv_heads"_a, "head_dim"_a,
            "value_dim"_a)
      .def_prop_ro("kv_heads", &WeightedKVCache::kv_heads)
      .def_prop_ro("head_dim", &WeightedKVCache::head_dim)
      .def_prop_ro("value_dim", &WeightedKVCache::value_dim)
      .def("length", &WeightedKVCache::length, "b"_a, "hkv"_a, "Entries of (batch b, kv head hkv).")
      .def(
          "keys",
          [](const WeightedKVCache& cache, int64_t b, int64_t hkv) {
            return matrix(cache.keys(b, hkv), cache.head_dim());
          },
          "b"_a, "hkv"_a, "Keys of (b, hkv): a new array [length, D].")
      .def(
          "values",
          [](const WeightedKVCache& cache, int64_t b, int64_t hkv) {
            return matrix(cache.values(b, hkv), cache.value_dim() + 1);
          },
          "b"_a, "hkv"_a, "Values of (b, hkv) with the weight last: a new array [length, Dv + 1].")
      .def(
          "log_scales",
          [](const WeightedKVCache& cache, int64_t b, int64_t hkv) {
            return vector(cache.log_scales(b, hkv));
          },
          "b"_a, "hkv"_a,
          "Log scales of (b, hkv) [length]: entry i counts as exp(log_scales[i]) * values[i] "
          "(0 for exact entries).")
      .def(
          "value_min",
          [](const WeightedKVCache& cache, int64_t b, int64_t hkv) {
            return vector(cache.value_min(b, hkv));
          },
          "b"_a, "hkv"_a, "Running per-feature minimum of the values [Dv] (empty before any).")
      .def(
          "value_max",
          [](const WeightedKVCache& cache, int64_t b, int64_t hkv) {
            return vector(cache.value_max(b, hkv));
          },
          "b"_a, "hkv"_a, "Running per-feature maximum of the values [Dv] (empty before any).")
      .def(
          "append",
          [](WeightedKVCache& cache, const Array& k, const Array& v) {
            const auto k_view = float_input<4>(k, "k");
            const auto v_view = float_input<4>(v, "v");
            nb::gil_scoped_release release;
            cache.append(k_view, v_view);
          },
          "k"_a, "v"_a,
          "Appends tokens k [B, T, Hkv, D], v [B, T, Hkv, Dv] with weight 1 and widens the "
          "value range.")
      .def(
          "push",
          [](WeightedKVCache& cache, int64_t b, int64_t hkv, const Array& key, const Array& value,
             float weight, float log_scale) {
            cache.push(b, hkv, row(key, "key", cache.head_dim()),
                       row(value, "value", cache.value_dim()), weight, log_scale);
          },
          "b"_a, "hkv"_a, "key"_a, "value"_a, "weight"_a, "log_scale"_a = 0.0f,
          "Adds one entry: key [D], value [Dv] (already weighted), weight, and log scale (the "
          "entry counts as exp(log_scale) * [value, weight]). Does not touch the value range.")
      .def(
          "widen_range",
          [](WeightedKVCache& cache, int64_t b, int64_t hkv, const Array& value) {
            cache.widen_range(b, hkv, row(value, "value", cache.value_dim()));
          },
          "b"_a, "hkv"_a, "value"_a, "Widens the value range of (b, hkv) by value [Dv].")
      .def("attend", &cache_attend, "q"_a, nb::kw_only(), "scale"_a = nb::none(), "threads"_a = 0,
           "q [B, N, H, D] -> out [B, N, H, Dv]; every query sees every entry.");
  bind_decode_verbs(cache,
                    "Appends k [B, T, Hkv, D], v [B, T, Hkv, Dv], then attends with q "
                    "[B, T, H, D] -> out [B, T, H, Dv] (every query sees every entry: decode "
                    "one token at a time for causal attention).");

  // Docstrings of the selections (static: nanobind keeps the pointers).
  static const std::string compress_select_doc =
      std::string("k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> what compress keeps: ") +
      kSelectionDoc + " Coreset entries carry W V and W (weights may be negative).";
  static const std::string streaming_select_doc =
      std::string("What streaming_llm_cache keeps: ") + kSelectionDoc;
  static const std::string snapkv_select_doc =
      std::string("What snapkv_cache keeps: ") + kSelectionDoc;

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
          "compress",
          [](const CompressKV& compressor, const Array& k, const Array& v, int64_t threads) {
            const Context context = context_for(threads);
            const auto k_view = float_input<4>(k, "k");
            const auto v_view = float_input<4>(v, "v");
            nb::gil_scoped_release release;
            return compressor.compress(context, k_view, v_view);
          },
          "k"_a, "v"_a, nb::kw_only(), "threads"_a = 0,
          "k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> the compressed WeightedKVCache.")
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
      "streaming_llm_cache",
      [](const Array& k, const Array& v, int64_t sink, int64_t window) {
        const auto k_view = float_input<4>(k, "k");
        const auto v_view = float_input<4>(v, "v");
        nb::gil_scoped_release release;
        return streaming_llm_cache(k_view, v_view, sink, window);
      },
      "k"_a, "v"_a, nb::kw_only(), "sink"_a = 32, "window"_a = 32,
      R"(StreamingLLM cache: the first `sink` and last `window` tokens of k [B, M, Hkv, D],
v [B, M, Hkv, Dv] (all of them when M <= sink + window), weight 1.)");

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

  m.def(
      "snapkv_cache",
      [](const Array& q_obs, const Array& k, const Array& v, int64_t capacity, int64_t pool_kernel,
         std::optional<double> scale, int64_t threads) {
        const Context context = context_for(threads);
        const SnapKVOptions options = snapkv_options(capacity, pool_kernel, scale);
        const auto q_view = float_input<4>(q_obs, "q_obs");
        const auto k_view = float_input<4>(k, "k");
        const auto v_view = float_input<4>(v, "v");
        nb::gil_scoped_release release;
        return snapkv_cache(context, q_view, k_view, v_view, options);
      },
      "q_obs"_a, "k"_a, "v"_a, nb::kw_only(), "capacity"_a = 256, "pool_kernel"_a = 7,
      "scale"_a = nb::none(), "threads"_a = 0,
      R"(SnapKV cache: the observation-window queries q_obs [B, W, H, D] (those of the last W
prompt tokens, W <= capacity) vote with their causal softmax over the prefix keys of
k [B, M, Hkv, D]; votes are summed over the window and the query heads of a kv head and
average-pooled (odd width pool_kernel); the top capacity - W prefix tokens are kept in
order, then the W window tokens, all with weight 1.)");
}

const BindingRegistrar wildcat_bindings("wildcat", &bind_wildcat);

}  // namespace subquad::python
