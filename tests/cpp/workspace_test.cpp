// Context::workspace (subquad/workspace.h): the second call with the same shapes allocates
// nothing (neither a Buffer nor any operator new) and gives bit-identical results to a call
// without a workspace; the workspace grows once to a call's peak, also for nested operators.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/buffer.h"
#include "common/workspace_frame.h"
#include "subquad/cat.h"
#include "subquad/workspace.h"

// Every operator new of this test binary counts (the libraries' std::vector and friends
// included), so "no allocation" covers more than subquad's Buffer.
namespace {
std::atomic<int64_t> news{0};
}  // namespace
// Read by the other workspace tests of this binary (workspace_attention_test.cpp).
int64_t heap_allocations_so_far() { return news.load(); }
void* operator new(size_t bytes) {
  news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
// GCC pairs the inlined free with the builtin operator new it sees at `new` expressions
// and warns of a mismatch; both are the malloc-based pair above.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace subquad {
namespace {

struct Allocations {
  int64_t buffers = buffer_allocations().load(), heap = news.load();
  int64_t buffers_since() const { return buffer_allocations().load() - buffers; }
  int64_t heap_since() const { return news.load() - heap; }
};

// Deterministic inputs for CAT: z [B, N, H], v [B, N, H, Dv], dout like v.
struct CatInputs {
  int64_t B, N, H, Dv;
  std::vector<float> z, v, dout;
  CatInputs(int64_t b, int64_t n, int64_t h, int64_t dv) : B(b), N(n), H(h), Dv(dv) {
    z.resize(B * N * H);
    v.resize(B * N * H * Dv);
    for (size_t i = 0; i < z.size(); ++i) z[i] = std::sin(0.37f * i);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.11f * i);
    dout = v;
    for (float& x : dout) x = 0.5f - x;
  }
  View3<const float> zv() const { return {z.data(), {B, N, H}}; }
  View4<const float> vv() const { return {v.data(), {B, N, H, Dv}}; }
  View4<const float> dv() const { return {dout.data(), {B, N, H, Dv}}; }
};

struct CatResults {
  std::vector<float> out, dz, dv;
};

CatResults run_cat(const Context& context, const CatInputs& in, CatPath path) {
  CatResults r{std::vector<float>(in.v.size()), std::vector<float>(in.z.size()),
               std::vector<float>(in.v.size())};
  const CatOptions options{CatConvention::roll, path};
  const View4<float> out(r.out.data(), {in.B, in.N, in.H, in.Dv});
  const View3<float> dz(r.dz.data(), {in.B, in.N, in.H});
  const View4<float> dv(r.dv.data(), {in.B, in.N, in.H, in.Dv});
  cat_forward<float>(context, in.zv(), in.vv(), options, out);
  cat_backward<float>(context, in.zv(), in.vv(), in.dv(), options, dz, dv);
  return r;
}

// Both CAT paths (direct below the crossover, FFT above), one and two threads: the second
// call with a workspace allocates nothing and matches the call without one bit for bit.
TEST(Workspace, SecondCatCallAllocatesNothing) {
  for (const CatPath path : {CatPath::direct, CatPath::fft})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(testing::Message() << "path " << static_cast<int>(path) << ", threads "
                                      << threads);
      const CatInputs in(2, 257, 3, 37);
      const CatResults reference = run_cat(Context{Device::cpu, threads}, in, path);
      Workspace workspace;
      const Context context{Device::cpu, threads, &workspace};
      CatResults first = run_cat(context, in, path);
      ASSERT_GT(workspace.capacity_bytes(), 0);
      ASSERT_EQ(workspace.capacity_bytes(), workspace.peak_bytes());
      // The outputs exist already: only the calls themselves are counted.
      const CatOptions options{CatConvention::roll, path};
      const View4<float> out(first.out.data(), {in.B, in.N, in.H, in.Dv});
      const View3<float> dz(first.dz.data(), {in.B, in.N, in.H});
      const View4<float> dv(first.dv.data(), {in.B, in.N, in.H, in.Dv});
      std::fill(first.out.begin(), first.out.end(), 0.0f);
      std::fill(first.dz.begin(), first.dz.end(), 0.0f);
      const Allocations before;
      cat_forward<float>(context, in.zv(), in.vv(), options, out);
      cat_backward<float>(context, in.zv(), in.vv(), in.dv(), options, dz, dv);
      EXPECT_EQ(before.buffers_since(), 0);
      EXPECT_EQ(before.heap_since(), 0);
      EXPECT_EQ(first.out, reference.out);
      EXPECT_EQ(first.dz, reference.dz);
      EXPECT_EQ(first.dv, reference.dv);
      bool moved = false;
      for (float x : first.out) {
        ASSERT_TRUE(std::isfinite(x));
        moved |= x != 0.0f;
      }
      EXPECT_TRUE(moved) << "the output is all zeros";
    }
}

// Without a workspace every call allocates its scratch (what the workspace saves).
TEST(Workspace, WithoutOneEveryCallAllocates) {
  const CatInputs in(1, 257, 2, 16);
  std::vector<float> out(in.v.size());
  const Context context{Device::cpu, 1};
  const CatOptions options{CatConvention::roll, CatPath::fft};
  const View4<float> out_view(out.data(), {in.B, in.N, in.H, in.Dv});
  cat_forward<float>(context, in.zv(), in.vv(), options, out_view);
  const Allocations before;
  cat_forward<float>(context, in.zv(), in.vv(), options, out_view);
  EXPECT_GT(before.buffers_since(), 0);
}

// A larger call grows the workspace; a smaller one after it fits and allocates nothing.
TEST(Workspace, GrowsToThePeakOnce) {
  Workspace workspace;
  const Context context{Device::cpu, 1, &workspace};
  const CatInputs small(1, 97, 2, 8), large(2, 1025, 2, 24);
  run_cat(context, small, CatPath::fft);
  const int64_t small_bytes = workspace.capacity_bytes();
  const CatResults large_first = run_cat(context, large, CatPath::fft);
  EXPECT_GT(workspace.capacity_bytes(), small_bytes);
  const int64_t large_bytes = workspace.capacity_bytes();
  CatResults again = run_cat(context, small, CatPath::fft);
  EXPECT_EQ(workspace.capacity_bytes(), large_bytes);
  EXPECT_EQ(again.out, run_cat(Context{Device::cpu, 1}, small, CatPath::fft).out);
  workspace.release();
  EXPECT_EQ(workspace.capacity_bytes(), 0);
  EXPECT_EQ(run_cat(context, large, CatPath::fft).dv, large_first.dv);
}

// Frames nest (an operator calling another): blocks of the inner frame follow the outer
// ones and are given back at its close; the outermost close coalesces what spilled.
TEST(Workspace, NestedFramesShareOneBlock) {
  Workspace workspace;
  const Context context{Device::cpu, 1, &workspace};
  {
    WorkspaceFrame outer(context);
    float* a = outer.take<float>(100);
    {
      WorkspaceFrame inner(context);
      double* b = inner.take<double>(1000);
      ASSERT_NE(static_cast<void*>(a), static_cast<void*>(b));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kBufferAlignment, 0u);
    }
    float* c = outer.take<float>(10);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c) % kBufferAlignment, 0u);
  }
  // 100 floats (448 bytes rounded up), then 8000 bytes (the inner frame), given back.
  EXPECT_EQ(workspace.peak_bytes(), 448 + 8000);
  EXPECT_EQ(workspace.capacity_bytes(), workspace.peak_bytes());
  const Allocations before;
  {
    WorkspaceFrame outer(context);
    outer.take<float>(100);
    WorkspaceFrame inner(context);
    inner.take<double>(1000);
  }
  EXPECT_EQ(before.buffers_since(), 0);
}

}  // namespace
}  // namespace subquad
