// Context::workspace for causal CAT, averaged-key CAT and 2D circulant attention (both the
// multi-channel and the one-channel heads path): the repeated call with the same shapes
// allocates no Buffer and is bit-identical to a call without a workspace, also after other
// operators (other shapes) left their data in the workspace. Odd and prime sizes, 1 and 2
// threads. Averaged-key CAT and 2D circulant attention allocate nothing else either (no
// operator new); what causal CAT still allocates per call is listed in docs/conventions.md.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "common/buffer.h"
#include "common/workspace_frame.h"
#include "subquad/cat.h"
#include "subquad/circulant2d.h"
#include "subquad/workspace.h"

// Every operator new of this test binary so far (workspace_test.cpp replaces it).
int64_t heap_allocations_so_far();

namespace subquad {
namespace {

std::vector<float> wave(int64_t count, float frequency, float amplitude = 1.0f) {
  std::vector<float> x(static_cast<size_t>(count));
  for (size_t i = 0; i < x.size(); ++i) x[i] = amplitude * std::sin(frequency * i + 0.3f);
  return x;
}

// Every output buffer of one operator call, compared as a whole.
using Outputs = std::vector<std::vector<float>>;
// Runs an operator (forward and backward) into `outputs` (already sized) with `context`.
using Call = std::function<void(const Context&, Outputs&)>;

void expect_finite_and_moving(const Outputs& outputs) {
  for (const std::vector<float>& x : outputs) {
    bool moved = false;
    for (float value : x) {
      ASSERT_TRUE(std::isfinite(value));
      moved |= value != 0.0f;
    }
    EXPECT_TRUE(moved) << "an output is all zeros";
  }
}

// The call without a workspace, then twice with one (after `dirty`, another operator on the
// same workspace): the second allocates no Buffer (with `no_heap`, no operator new at all),
// and both match the first bit for bit.
void expect_reuse(const Call& call, Outputs sized, const Call& dirty, Outputs dirty_sized,
                  bool no_heap) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(testing::Message() << "threads " << threads);
    Outputs reference = sized;
    call(Context{Device::cpu, threads}, reference);
    expect_finite_and_moving(reference);
    Workspace workspace;
    const Context context{Device::cpu, threads, &workspace};
    dirty(context, dirty_sized);
    Outputs first = sized;
    call(context, first);
    EXPECT_EQ(first, reference);
    const int64_t capacity = workspace.capacity_bytes();
    ASSERT_GT(capacity, 0);
    Outputs again = sized;
    const int64_t before = buffer_allocations().load(), heap = heap_allocations_so_far();
    call(context, again);
    const int64_t news = heap_allocations_so_far() - heap;
    EXPECT_EQ(buffer_allocations().load() - before, 0) << "Buffers allocated by the repeated call";
    if (no_heap) {
      EXPECT_EQ(news, 0) << "operator new in the repeated call";
    }
    EXPECT_EQ(workspace.capacity_bytes(), capacity);
    EXPECT_EQ(again, reference);
  }
}

// Causal CAT: z [B, N, H], v and dout [B, N, H, Dv]; outputs out, dz, dv.
struct CausalCase {
  int64_t B, N, H, Dv;
  CatPath path;
  float score_range;  // amplitude of the scores: wide ranges make plans of several blocks
};

// The inputs of a Call are made once, with it, so that counting a call sees the operators'
// allocations only.
Call causal_call(const CausalCase& c) {
  return [c, z = wave(c.B * c.N * c.H, 0.37f, c.score_range),
          v = wave(c.B * c.N * c.H * c.Dv, 0.11f),
          dout = wave(c.B * c.N * c.H * c.Dv, 0.23f)](const Context& context, Outputs& r) {
    const View3<const float> zv(z.data(), {c.B, c.N, c.H});
    const View4<const float> vv(v.data(), {c.B, c.N, c.H, c.Dv});
    const CatCausalOptions options{c.path};
    cat_causal_forward<float>(context, zv, vv, options, View4<float>(r[0].data(), vv.shape));
    cat_causal_backward<float>(context, zv, vv, View4<const float>(r[0].data(), vv.shape),
                               View4<const float>(dout.data(), vv.shape), options,
                               View3<float>(r[1].data(), zv.shape),
                               View4<float>(r[2].data(), vv.shape));
  };
}

Outputs causal_outputs(const CausalCase& c) {
  const size_t values = c.B * c.N * c.H * c.Dv;
  return {std::vector<float>(values), std::vector<float>(c.B * c.N * c.H),
          std::vector<float>(values)};
}

// Averaged-key CAT: q, k [B, N, H, D], v and dout [B, N, H, Dv]; outputs out, dq, dk, dv.
struct AvgKeyCase {
  int64_t B, N, H, D, Dv;
};

Call avgkey_call(const AvgKeyCase& c) {
  return [c, q = wave(c.B * c.N * c.H * c.D, 0.31f), k = wave(c.B * c.N * c.H * c.D, 0.17f, 2.0f),
          v = wave(c.B * c.N * c.H * c.Dv, 0.13f),
          dout = wave(c.B * c.N * c.H * c.Dv, 0.29f)](const Context& context, Outputs& r) {
    const View4<const float> qv(q.data(), {c.B, c.N, c.H, c.D}), kv(k.data(), qv.shape);
    const View4<const float> vv(v.data(), {c.B, c.N, c.H, c.Dv});
    const CatAvgKeyOptions options;
    cat_avgkey_forward<float>(context, qv, kv, vv, options, View4<float>(r[0].data(), vv.shape));
    cat_avgkey_backward<float>(context, qv, kv, vv, View4<const float>(dout.data(), vv.shape),
                               options, View4<float>(r[1].data(), qv.shape),
                               View4<float>(r[2].data(), qv.shape),
                               View4<float>(r[3].data(), vv.shape));
  };
}

Outputs avgkey_outputs(const AvgKeyCase& c) {
  const size_t keys = c.B * c.N * c.H * c.D, values = c.B * c.N * c.H * c.Dv;
  return {std::vector<float>(values), std::vector<float>(keys), std::vector<float>(keys),
          std::vector<float>(values)};
}

// 2D circulant attention: q, k [B, Hg, Wg, H, D], v and dout [B, Hg, Wg, H, Dv]; outputs
// out, weights [B, H, Hg, Wg], dq, dk, dv.
struct CirculantCase {
  int64_t B, Hg, Wg, H, D, Dv;
};

Call circulant_call(const CirculantCase& c) {
  const int64_t tokens = c.B * c.Hg * c.Wg * c.H;
  return [c, q = wave(tokens * c.D, 0.31f), k = wave(tokens * c.D, 0.19f),
          v = wave(tokens * c.Dv, 0.13f),
          dout = wave(tokens * c.Dv, 0.41f)](const Context& context, Outputs& r) {
    const View5<const float> qv(q.data(), {c.B, c.Hg, c.Wg, c.H, c.D}), kv(k.data(), qv.shape);
    const View5<const float> vv(v.data(), {c.B, c.Hg, c.Wg, c.H, c.Dv});
    const Circulant2dOptions options;
    circulant2d_forward<float>(context, qv, kv, vv, options, View5<float>(r[0].data(), vv.shape),
                               View4<float>(r[1].data(), {c.B, c.H, c.Hg, c.Wg}));
    circulant2d_backward<float>(context, qv, kv, vv, View5<const float>(dout.data(), vv.shape),
                                options, View5<float>(r[2].data(), qv.shape),
                                View5<float>(r[3].data(), qv.shape),
                                View5<float>(r[4].data(), vv.shape));
  };
}

Outputs circulant_outputs(const CirculantCase& c) {
  const int64_t tokens = c.B * c.Hg * c.Wg * c.H;
  return {std::vector<float>(tokens * c.Dv), std::vector<float>(tokens),
          std::vector<float>(tokens * c.D), std::vector<float>(tokens * c.D),
          std::vector<float>(tokens * c.Dv)};
}

// Another operator's data left in the workspace before the calls under test.
const CirculantCase kDirtyCirculant{1, 5, 3, 2, 3, 2};
const CausalCase kDirtyCausal{1, 31, 2, 5, CatPath::automatic, 1.0f};

TEST(WorkspaceCausalCat, RepeatedCallAllocatesNoBuffer) {
  // FFT plans (one block, prime N), direct rows (N below the leaf size, forced direct), and
  // scores over a range wide enough for plans of several blocks (direct and FFT, split).
  for (const CausalCase& c : {CausalCase{2, 97, 3, 37, CatPath::automatic, 1.0f},
                              CausalCase{1, 7, 2, 5, CatPath::automatic, 1.0f},
                              CausalCase{2, 67, 1, 3, CatPath::direct, 1.0f},
                              CausalCase{1, 257, 2, 9, CatPath::fft, 1.0f},
                              CausalCase{1, 331, 2, 7, CatPath::automatic, 30.0f}}) {
    SCOPED_TRACE(testing::Message() << "N " << c.N << ", Dv " << c.Dv << ", path "
                                    << static_cast<int>(c.path) << ", range " << c.score_range);
    expect_reuse(causal_call(c), causal_outputs(c), circulant_call(kDirtyCirculant),
                 circulant_outputs(kDirtyCirculant), /*no_heap=*/false);
  }
}

TEST(WorkspaceAvgKeyCat, RepeatedCallAllocatesNoBuffer) {
  // N >= 1000: shapes printed longer than std::string's inline buffer.
  for (const AvgKeyCase& c :
       {AvgKeyCase{2, 97, 3, 13, 11}, AvgKeyCase{1, 7, 2, 5, 3}, AvgKeyCase{1, 1031, 2, 5, 3}}) {
    SCOPED_TRACE(testing::Message() << "N " << c.N);
    expect_reuse(avgkey_call(c), avgkey_outputs(c), causal_call(kDirtyCausal),
                 causal_outputs(kDirtyCausal), /*no_heap=*/true);
  }
}

TEST(WorkspaceCirculant2d, RepeatedCallAllocatesNoBuffer) {
  // Multi-channel heads (odd D, Dv: a lone last channel), one-channel heads on a token-major
  // grid (odd H: padded lanes) and on a plane-major one (2115 tokens, a shape printed longer
  // than std::string's inline buffer).
  for (const CirculantCase& c : {CirculantCase{2, 7, 5, 3, 5, 3}, CirculantCase{2, 7, 11, 3, 1, 1},
                                 CirculantCase{1, 45, 47, 2, 1, 1}}) {
    SCOPED_TRACE(testing::Message() << "grid " << c.Hg << " x " << c.Wg << ", H " << c.H
                                    << ", D " << c.D);
    expect_reuse(circulant_call(c), circulant_outputs(c), causal_call(kDirtyCausal),
                 causal_outputs(kDirtyCausal), /*no_heap=*/true);
  }
}

// A frame without Context::workspace allocates what it takes and nothing more: its own
// workspace is dropped at the close, so what spilled is not coalesced into a block of the
// peak (that allocation ran in the destructor, where an allocation failure under a memory
// limit ended the process).
TEST(WorkspaceFrame, WithoutAWorkspaceTheCloseAllocatesNothing) {
  const Context context{Device::cpu, 1};
  const int64_t before = buffer_allocations().load();
  {
    WorkspaceFrame frame(context);
    frame.take<float>(1000);
    frame.take<double>(10);
  }
  EXPECT_EQ(buffer_allocations().load() - before, 2);
}

}  // namespace
}  // namespace subquad
