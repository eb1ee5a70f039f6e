// Views: contiguous strides, indexing of sliced (non-contiguous) views, the const
// conversion, and the boundary checks' messages.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/buffer.h"
#include "subquad/error.h"
#include "subquad/view.h"

namespace subquad {
namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(View, ContiguousStridesAndIndexing) {
  std::vector<float> data(2 * 3 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  const View3<float> view(data.data(), {2, 3, 4});
  EXPECT_EQ(view.strides, (std::array<int64_t, 3>{12, 4, 1}));
  EXPECT_EQ(view(1, 2, 3), 23.0f);
  EXPECT_EQ(view.row(1, 1)[2], 18.0f);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_EQ(view.size(), 24);
  const View3<const float> constant = view;  // const conversion keeps shape and strides
  EXPECT_EQ(constant(0, 1, 1), 5.0f);
}

TEST(View, SliceOfAPackedTensorIsStrided) {
  // qkv [B=2, N=3, 3, D=4]: the k slice is [B, N, D] with strides {36, 12, 1}.
  std::vector<double> qkv(2 * 3 * 3 * 4);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<double>(i);
  const View3<const double> k(qkv.data() + 4, {2, 3, 4}, {36, 12, 1});
  EXPECT_FALSE(k.is_contiguous());
  EXPECT_EQ(k(1, 2, 3), qkv[36 + 24 + 4 + 3]);
  EXPECT_NO_THROW(check_view(k, "k"));
}

TEST(View, BoundaryChecksNameTheArgument) {
  float x[8] = {};
  EXPECT_NE(error_of([&] { check_view(View2<float>(x, {2, 4}, {4, 2}), "q"); })
                .find("q: the last dimension must be contiguous"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_view(View2<float>(nullptr, {2, 4}), "k"); })
                .find("k: null data for shape [2, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_shape(View2<float>(x, {2, 4}), {4, 2}, "v"); })
                .find("v: expected shape [4, 2], got [2, 4]"),
            std::string::npos);
  EXPECT_NO_THROW(check_view(View2<float>(nullptr, {0, 4}), "empty"));
  // NumPy 2 hands over zero-size arrays with all strides 0: an empty view is never read.
  EXPECT_NO_THROW(check_view(View3<float>(x, {3, 0, 5}, {0, 0, 0}), "empty"));
}

TEST(Buffer, AlignedZeroedAndMovable) {
  Buffer<float> buffer(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kBufferAlignment, 0u);
  for (float x : buffer) EXPECT_EQ(x, 0.0f);
  Buffer<float> moved = std::move(buffer);
  EXPECT_EQ(moved.size(), 100);
  EXPECT_EQ(buffer.data(), nullptr);
}

}  // namespace
}  // namespace subquad
