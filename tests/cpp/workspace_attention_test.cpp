// Context::workspace for the tile-product operators: exact attention forward and backward
// (float, double, bfloat16; causal, windowed, grouped queries, padded and in-place value
// rows), merge attention and its backward, MLR attention forward and backward, WildCat
// attention and a weighted KV cache's attend. The second call with the same shapes allocates
// no Buffer (nor any operator new, where the operator allocates none of its own; see
// docs/conventions.md) and gives bit-identical results to calls without a workspace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <type_traits>
#include <vector>

#include "common/buffer.h"
#include "common/test_support.h"
#include "exact/exact_test_util.h"
#include "subquad/bfloat16.h"
#include "subquad/exact.h"
#include "subquad/structured.h"
#include "subquad/wildcat.h"
#include "subquad/workspace.h"

// Every operator new of this test binary so far (workspace_test.cpp replaces it).
int64_t heap_allocations_so_far();

namespace subquad {
namespace {

using testing::random_vector;

template <typename T>
std::vector<unsigned char> bytes_of(const std::vector<T>& x) {
  std::vector<unsigned char> bytes(x.size() * sizeof(T));
  if (!x.empty()) std::memcpy(bytes.data(), x.data(), bytes.size());
  return bytes;
}

template <typename T>
void append_bytes(std::vector<unsigned char>& all, const std::vector<T>& x) {
  const std::vector<unsigned char> bytes = bytes_of(x);
  all.insert(all.end(), bytes.begin(), bytes.end());
}

// Every output finite, and not all zeros (a kernel that wrote nothing would pass otherwise).
template <typename T>
void expect_finite_and_moved(const std::vector<T>& x, const char* name) {
  bool moved = false;
  for (const T& value : x) {
    const auto f = static_cast<double>(static_cast<float>(value));
    ASSERT_TRUE(std::isfinite(f)) << name << " holds a non-finite value";
    moved |= f != 0.0;
  }
  EXPECT_TRUE(moved) << name << " is all zeros";
}

template <typename T>
std::vector<T> random_of(int64_t count, uint64_t seed) {
  const std::vector<float> values = random_vector<float>(count, seed, -1.5, 1.5);
  std::vector<T> result;
  result.reserve(values.size());
  for (float x : values) result.push_back(static_cast<T>(x));
  return result;
}

// A case runs one operator call into outputs it owns (sized once, so that counting sees the
// call only): clear() overwrites them, run(context) computes them, bytes() and check() read
// them. Calls without a workspace give the reference; with one, the first call grows it,
// the second is counted.
template <typename Case>
void expect_second_call_allocates_nothing(Case& c, bool no_heap) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "threads " << threads);
    c.clear();
    c.run(Context{Device::cpu, threads});
    c.check();
    const std::vector<unsigned char> reference = c.bytes();
    Workspace workspace;
    const Context context{Device::cpu, threads, &workspace};
    c.clear();
    c.run(context);
    EXPECT_EQ(c.bytes(), reference);
    const int64_t capacity = workspace.capacity_bytes();
    EXPECT_GT(capacity, 0);
    EXPECT_EQ(capacity, workspace.peak_bytes());
    c.clear();
    const int64_t buffers = buffer_allocations().load(), heap = heap_allocations_so_far();
    c.run(context);
    EXPECT_EQ(buffer_allocations().load() - buffers, 0) << "Buffers allocated on the second call";
    if (no_heap) {
      EXPECT_EQ(heap_allocations_so_far() - heap, 0) << "operator new on the second call";
    }
    EXPECT_EQ(workspace.capacity_bytes(), capacity);
    EXPECT_EQ(c.bytes(), reference) << "the call with a workspace differs from one without";
  }
}

using Shape = testing::AttentionShape;

// Odd and prime sizes: D = 59 and Dv = 37 pad to whole vectors, Dv = 48 is read in place
// (a multiple of the lane count of every ISA); GQA 2:1; a ragged last query and key block;
// N >= 1000, whose shapes print longer than std::string's inline buffer (the boundary checks
// format their messages only on failure, so even those allocate nothing).
const Shape kShapes[] = {
    {2, 97, 131, 4, 2, 59, 37},        {2, 97, 131, 4, 2, 59, 37, true},
    {1, 211, 211, 2, 1, 59, 48, true}, {2, 97, 131, 2, 2, 23, 48, false, 17},
    {1, 1031, 1031, 2, 1, 16, 16, true},
};

template <typename T>
struct ExactForwardCase {
  Shape s;
  std::vector<T> q, k, v, out;
  std::vector<Accumulate<T>> lse;
  explicit ExactForwardCase(const Shape& shape)
      : s(shape),
        q(random_of<T>(s.B * s.N * s.H * s.D, 1)),
        k(random_of<T>(s.B * s.M * s.Hkv * s.D, 2)),
        v(random_of<T>(s.B * s.M * s.Hkv * s.Dv, 3)),
        out(s.B * s.N * s.H * s.Dv),
        lse(s.B * s.H * s.N) {}
  void clear() {
    std::fill(out.begin(), out.end(), T(0.0f));
    std::fill(lse.begin(), lse.end(), Accumulate<T>(0));
  }
  void run(const Context& context) {
    exact_attention_forward<T>(context, View4<const T>(q.data(), {s.B, s.N, s.H, s.D}),
                               View4<const T>(k.data(), {s.B, s.M, s.Hkv, s.D}),
                               View4<const T>(v.data(), {s.B, s.M, s.Hkv, s.Dv}), s.options(),
                               View4<T>(out.data(), {s.B, s.N, s.H, s.Dv}),
                               View3<Accumulate<T>>(lse.data(), {s.B, s.H, s.N}));
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> all = bytes_of(out);
    append_bytes(all, lse);
    return all;
  }
  void check() const {
    expect_finite_and_moved(out, "out");
    expect_finite_and_moved(lse, "lse");
  }
};

template <typename T>
struct ExactBackwardCase {
  ExactForwardCase<T> forward;
  std::vector<T> dout, dq, dk, dv;
  std::vector<Accumulate<T>> dlse;
  ExactBackwardCase(const Shape& s, bool with_dlse)
      : forward(s),
        dout(random_of<T>(s.B * s.N * s.H * s.Dv, 4)),
        dq(s.B * s.N * s.H * s.D),
        dk(s.B * s.M * s.Hkv * s.D),
        dv(s.B * s.M * s.Hkv * s.Dv) {
    forward.run(Context{Device::cpu, 1});
    if (with_dlse)
      for (float x : random_vector<float>(s.B * s.H * s.N, 5)) dlse.push_back(x);
  }
  void clear() {
    for (auto* x : {&dq, &dk, &dv}) std::fill(x->begin(), x->end(), T(0.0f));
  }
  void run(const Context& context) {
    const Shape& s = forward.s;
    exact_attention_backward<T>(
        context, View4<const T>(forward.q.data(), {s.B, s.N, s.H, s.D}),
        View4<const T>(forward.k.data(), {s.B, s.M, s.Hkv, s.D}),
        View4<const T>(forward.v.data(), {s.B, s.M, s.Hkv, s.Dv}),
        View4<const T>(forward.out.data(), {s.B, s.N, s.H, s.Dv}),
        View3<const Accumulate<T>>(forward.lse.data(), {s.B, s.H, s.N}),
        View4<const T>(dout.data(), {s.B, s.N, s.H, s.Dv}),
        dlse.empty() ? View3<const Accumulate<T>>()
                     : View3<const Accumulate<T>>(dlse.data(), {s.B, s.H, s.N}),
        s.options(), View4<T>(dq.data(), {s.B, s.N, s.H, s.D}),
        View4<T>(dk.data(), {s.B, s.M, s.Hkv, s.D}), View4<T>(dv.data(), {s.B, s.M, s.Hkv, s.Dv}));
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> all = bytes_of(dq);
    append_bytes(all, dk);
    append_bytes(all, dv);
    return all;
  }
  void check() const {
    expect_finite_and_moved(dq, "dq");
    expect_finite_and_moved(dk, "dk");
    expect_finite_and_moved(dv, "dv");
  }
};

// float: every shape; double and bfloat16 (the same kernels in another storage type): the
// padded causal shape and the in-place windowed one.
template <typename T>
void exact_forward_and_backward() {
  for (size_t index = 0; index < std::size(kShapes); ++index) {
    if (!std::is_same_v<T, float> && index != 1 && index != 3) continue;
    const Shape& s = kShapes[index];
    SCOPED_TRACE(::testing::Message() << "N " << s.N << ", M " << s.M << ", D " << s.D << ", Dv "
                                      << s.Dv << (s.causal ? ", causal" : "") << ", window "
                                      << s.window);
    ExactForwardCase<T> forward(s);
    expect_second_call_allocates_nothing(forward, /*no_heap=*/true);
    for (bool with_dlse : {false, true}) {
      ExactBackwardCase<T> backward(s, with_dlse);
      expect_second_call_allocates_nothing(backward, /*no_heap=*/true);
    }
  }
}

TEST(WorkspaceAttention, ExactFloat) { exact_forward_and_backward<float>(); }
TEST(WorkspaceAttention, ExactDouble) { exact_forward_and_backward<double>(); }
TEST(WorkspaceAttention, ExactBfloat16) { exact_forward_and_backward<bfloat16>(); }

// merge_attention and its backward take no scratch: they allocate nothing, workspace or not.
struct MergeCase {
  static constexpr int64_t B = 2, N = 37, H = 3, Dv = 29;
  std::vector<float> out_a = random_of<float>(B * N * H * Dv, 11);
  std::vector<float> out_b = random_of<float>(B * N * H * Dv, 12);
  std::vector<float> lse_a = random_of<float>(B * H * N, 13);
  std::vector<float> lse_b = random_of<float>(B * H * N, 14);
  std::vector<float> dout = random_of<float>(B * N * H * Dv, 15);
  std::vector<float> dlse = random_of<float>(B * H * N, 16);
  std::vector<float> out = std::vector<float>(B * N * H * Dv);
  std::vector<float> lse = std::vector<float>(B * H * N);
  std::vector<float> dout_a = out, dout_b = out, dlse_a = lse, dlse_b = lse;
  void clear() {
    for (auto* x : {&out, &lse, &dout_a, &dout_b, &dlse_a, &dlse_b})
      std::fill(x->begin(), x->end(), 0.0f);
  }
  void run(const Context& context) {
    const View4<const float> a(out_a.data(), {B, N, H, Dv}), b(out_b.data(), {B, N, H, Dv});
    const View3<const float> la(lse_a.data(), {B, H, N}), lb(lse_b.data(), {B, H, N});
    merge_attention<float>(context, a, la, b, lb, View4<float>(out.data(), {B, N, H, Dv}),
                           View3<float>(lse.data(), {B, H, N}));
    merge_attention_backward<float>(
        context, a, la, b, lb, View4<const float>(out.data(), {B, N, H, Dv}),
        View3<const float>(lse.data(), {B, H, N}), View4<const float>(dout.data(), {B, N, H, Dv}),
        View3<const float>(dlse.data(), {B, H, N}), View4<float>(dout_a.data(), {B, N, H, Dv}),
        View3<float>(dlse_a.data(), {B, H, N}), View4<float>(dout_b.data(), {B, N, H, Dv}),
        View3<float>(dlse_b.data(), {B, H, N}));
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> all;
    for (const auto* x : {&out, &lse, &dout_a, &dout_b, &dlse_a, &dlse_b}) append_bytes(all, *x);
    return all;
  }
  void check() const {
    expect_finite_and_moved(out, "out");
    expect_finite_and_moved(dout_a, "dout_a");
    expect_finite_and_moved(dlse_b, "dlse_b");
  }
};

TEST(WorkspaceAttention, MergeAllocatesNothing) {
  MergeCase c;
  c.run(Context{Device::cpu, 2});  // the first call with 2 threads creates OpenMP's team
  c.clear();
  const int64_t buffers = buffer_allocations().load(), heap = heap_allocations_so_far();
  c.run(Context{Device::cpu, 2});
  EXPECT_EQ(buffer_allocations().load() - buffers, 0);
  EXPECT_EQ(heap_allocations_so_far() - heap, 0);
  c.check();
  const std::vector<unsigned char> reference = c.bytes();
  Workspace workspace;
  c.clear();
  c.run(Context{Device::cpu, 2, &workspace});
  EXPECT_EQ(c.bytes(), reference);
}

// MLR: T = 2 x 97 tokens (two levels need an even T), D = 59 = 40 + 19, Dv = 37, GQA 2:1.
struct MlrCase {
  static constexpr int64_t B = 2, N = 194, H = 4, Hkv = 2, D = 59, Dv = 37;
  MlrOptions options;
  std::vector<float> q = random_of<float>(B * N * H * D, 21);
  std::vector<float> k = random_of<float>(B * N * Hkv * D, 22);
  std::vector<float> v = random_of<float>(B * N * Hkv * Dv, 23);
  std::vector<float> dout = random_of<float>(B * N * H * Dv, 24);
  std::vector<float> out = std::vector<float>(B * N * H * Dv), lse = std::vector<float>(B * H * N);
  std::vector<float> dq = std::vector<float>(B * N * H * D), dk = std::vector<float>(B * N * Hkv * D);
  std::vector<float> dv = std::vector<float>(B * N * Hkv * Dv);
  bool backward;
  MlrCase(bool causal, bool block_divide, bool with_backward) : backward(with_backward) {
    options.ranks = {40, 19};
    options.causal = causal;
    options.block_divide = block_divide;
    if (backward) forward(Context{Device::cpu, 1});
  }
  void forward(const Context& context) {
    mlr_attention_forward<float>(context, View4<const float>(q.data(), {B, N, H, D}),
                                 View4<const float>(k.data(), {B, N, Hkv, D}),
                                 View4<const float>(v.data(), {B, N, Hkv, Dv}), options,
                                 View4<float>(out.data(), {B, N, H, Dv}),
                                 View3<float>(lse.data(), {B, H, N}));
  }
  // The outputs of the call: the gradients, or out and lse.
  std::vector<const std::vector<float>*> outputs() const {
    if (backward) return {&dq, &dk, &dv};
    return {&out, &lse};
  }
  void clear() {
    if (backward) {
      for (std::vector<float>* x : {&dq, &dk, &dv}) std::fill(x->begin(), x->end(), 0.0f);
    } else {
      for (std::vector<float>* x : {&out, &lse}) std::fill(x->begin(), x->end(), 0.0f);
    }
  }
  void run(const Context& context) {
    if (!backward) return forward(context);
    mlr_attention_backward<float>(
        context, View4<const float>(q.data(), {B, N, H, D}),
        View4<const float>(k.data(), {B, N, Hkv, D}), View4<const float>(v.data(), {B, N, Hkv, Dv}),
        View4<const float>(out.data(), {B, N, H, Dv}), View3<const float>(lse.data(), {B, H, N}),
        View4<const float>(dout.data(), {B, N, H, Dv}), options,
        View4<float>(dq.data(), {B, N, H, D}), View4<float>(dk.data(), {B, N, Hkv, D}),
        View4<float>(dv.data(), {B, N, Hkv, Dv}));
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> all;
    for (const std::vector<float>* x : outputs()) append_bytes(all, *x);
    return all;
  }
  void check() const {
    if (backward) {
      expect_finite_and_moved(dq, "dq");
      expect_finite_and_moved(dk, "dk");
      expect_finite_and_moved(dv, "dv");
    } else {
      expect_finite_and_moved(out, "out");
      expect_finite_and_moved(lse, "lse");
    }
  }
};

TEST(WorkspaceAttention, Mlr) {
  for (bool causal : {false, true})
    for (bool block_divide : {false, true})
      for (bool backward : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (causal ? "causal" : "bidirectional")
                                          << (block_divide ? ", block_divide" : "")
                                          << (backward ? ", backward" : ", forward"));
        MlrCase c(causal, block_divide, backward);
        expect_second_call_allocates_nothing(c, /*no_heap=*/true);
      }
}

// WildCat over M = 131 keys compressed to 16 points in 2 bins, D = 23, Dv = 17, GQA 3:1.
// Its attention phase takes its scratch from the workspace; the coresets themselves (whose
// sizes depend on the pivots found) are still built in vectors of their own, so only
// Buffers are counted (docs/conventions.md).
struct WildcatCase {
  static constexpr int64_t B = 2, N = 53, M = 131, H = 3, Hkv = 1, D = 23, Dv = 17;
  WildcatOptions options;
  std::vector<float> q = random_of<float>(B * N * H * D, 31);
  std::vector<float> k = random_of<float>(B * M * Hkv * D, 32);
  std::vector<float> v = random_of<float>(B * M * Hkv * Dv, 33);
  std::vector<float> out = std::vector<float>(B * N * H * Dv);
  WildcatCase() {
    options.rank = 16;
    options.bins = 2;
    options.seed = 7;
  }
  void clear() { std::fill(out.begin(), out.end(), 0.0f); }
  void run(const Context& context) {
    wildcat_attention(context, View4<const float>(q.data(), {B, N, H, D}),
                      View4<const float>(k.data(), {B, M, Hkv, D}),
                      View4<const float>(v.data(), {B, M, Hkv, Dv}), options,
                      View4<float>(out.data(), {B, N, H, Dv}));
  }
  std::vector<unsigned char> bytes() const { return bytes_of(out); }
  void check() const { expect_finite_and_moved(out, "out"); }
};

TEST(WorkspaceAttention, Wildcat) {
  WildcatCase c;
  expect_second_call_allocates_nothing(c, /*no_heap=*/false);
}

// Attention over a compressed cache (CompressKV over M = 301 tokens, GQA 2:1): nothing of
// its own is allocated on the second call.
struct CacheAttendCase {
  static constexpr int64_t B = 2, N = 7, M = 301, H = 4, Hkv = 2, D = 29, Dv = 19;
  std::vector<float> q = random_of<float>(B * N * H * D, 41);
  std::vector<float> out = std::vector<float>(B * N * H * Dv);
  WeightedKVEntries entries;
  CacheAttendCase() : entries(compressed()) {}
  static WeightedKVEntries compressed() {
    const std::vector<float> k = random_of<float>(B * M * Hkv * D, 42);
    const std::vector<float> v = random_of<float>(B * M * Hkv * Dv, 43);
    CompressKVOptions options;
    options.sink = 5;
    options.window = 11;
    options.bin_rank = 8;
    const View4<const float> keys(k.data(), {B, M, Hkv, D}), values(v.data(), {B, M, Hkv, Dv});
    return weighted_kv_entries(keys, values,
                               CompressKV(options).select(Context{Device::cpu, 1}, keys, values));
  }
  void clear() { std::fill(out.begin(), out.end(), 0.0f); }
  void run(const Context& context) {
    weighted_kv_attention(context, View4<const float>(q.data(), {B, N, H, D}), entries.view(),
                          View4<float>(out.data(), {B, N, H, Dv}));
  }
  std::vector<unsigned char> bytes() const { return bytes_of(out); }
  void check() const { expect_finite_and_moved(out, "out"); }
};

TEST(WorkspaceAttention, WeightedCacheAttend) {
  CacheAttendCase c;
  ASSERT_LT(c.entries.entries, CacheAttendCase::M);  // compressed
  expect_second_call_allocates_nothing(c, /*no_heap=*/true);
}

}  // namespace
}  // namespace subquad
