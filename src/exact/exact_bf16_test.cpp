// bfloat16 exact attention, forward and backward, under FlashAttention's rule: against the
// float64 reference at the same (bfloat16) inputs, the fast kernel's max error is at most
// twice that of the naive bfloat16 implementation (exact_bf16_ref.h), on the odd sizes,
// GQA ratios, causal and window masks of the float32 tests. Also the conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cpu/convert.h"
#include "exact/exact_bf16_ref.h"
#include "exact/exact_test_util.h"
#include "subquad/bfloat16.h"

namespace subquad::testing {
namespace {

float bits_to_float(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

TEST(Bfloat16, RoundsToNearestEven) {
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3F80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bfloat16(1.0f + 0x1p-8f).bits, 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bfloat16(1.0f + 3 * 0x1p-8f).bits, 0x3F82);
  EXPECT_EQ(bfloat16(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3F81);  // above halfway: up
  EXPECT_EQ(bfloat16(-2.5f).bits, 0xC020);
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::infinity()).bits, 0x7F80);
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits, 0x7F80);    // rounds to inf
  EXPECT_EQ(bfloat16(bits_to_float(0x7F800001u)).bits & 0x7FC0, 0x7FC0);  // NaN stays NaN
  EXPECT_EQ(bfloat16(bits_to_float(0x00000001u)).bits, 0x0000);           // subnormal rounds to 0
  for (float x : {0.0f, -0.0f, 1.5f, -3.0e-20f, 1.0e30f})
    EXPECT_EQ(static_cast<float>(bfloat16(static_cast<float>(bfloat16(x)))),
              static_cast<float>(bfloat16(x)));
}

// The vector conversions of cpu/convert.h agree with the scalar ones at every length
// around the vector width and on special values.
TEST(Bfloat16, VectorConversionsMatchScalar) {
  std::vector<float> values = random_vector<float>(61, 5, -1e3, 1e3);
  values[3] = std::numeric_limits<float>::quiet_NaN();
  values[4] = -std::numeric_limits<float>::infinity();
  values[5] = 1.0f + 0x1p-8f;
  values[6] = bits_to_float(0x7F800001u);
  for (int64_t n = 0; n <= 61; n += 1) {
    std::vector<bfloat16> narrowed(size_t(n) + 1, bfloat16::from_bits(0x1234));
    cpu::narrow(values.data(), narrowed.data(), n, 2.0f);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(narrowed[size_t(i)].bits, bfloat16(2.0f * values[size_t(i)]).bits) << n << " " << i;
    ASSERT_EQ(narrowed[size_t(n)].bits, 0x1234) << "wrote past the end";
    std::vector<float> widened(size_t(n) + 1, 7.0f);
    cpu::widen(narrowed.data(), widened.data(), n, 0.5f);
    for (int64_t i = 0; i < n; ++i) {
      const float want = 0.5f * static_cast<float>(narrowed[size_t(i)]);
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(widened[size_t(i)]));
      else
        ASSERT_EQ(widened[size_t(i)], want);
    }
    ASSERT_EQ(widened[size_t(n)], 7.0f);
  }
}

std::vector<bfloat16> to_bf16(const std::vector<double>& x) {
  std::vector<bfloat16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bfloat16(static_cast<float>(x[i]));
  return y;
}
std::vector<float> to_float(const std::vector<bfloat16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i]);
  return y;
}

// The rule: fast error <= 2 x naive error (+ a float32 rounding of the magnitude, as
// FlashAttention's atol), both max-abs against float64; outputs finite and not all zeros.
void expect_within_rule(const std::vector<float>& fast, const std::vector<float>& naive,
                        const std::vector<double>& reference, const char* what) {
  ASSERT_EQ(fast.size(), reference.size());
  if (reference.empty()) return;
  const double fast_error = max_abs_diff(fast, reference);
  const double naive_error = max_abs_diff(naive, reference);
  const double slack = 4 * std::numeric_limits<float>::epsilon() * (1 + max_abs(reference));
  EXPECT_LE(fast_error, 2 * naive_error + slack)
      << what << ": fast error " << fast_error << ", naive bfloat16 error " << naive_error;
  EXPECT_TRUE(all_finite(fast)) << what;
  if (max_abs(reference) > 0) {
    EXPECT_GT(max_abs(fast), 0.0) << what << " is all zeros";
  }
  // The figures, for the README (--gtest_output=xml keeps them).
  ::testing::Test::RecordProperty(std::string(what) + "_fast_error", std::to_string(fast_error));
  ::testing::Test::RecordProperty(std::string(what) + "_naive_error", std::to_string(naive_error));
}

struct Bf16Problem {
  AttentionShape s;
  Inputs<double> x64;  // the bfloat16 inputs, exactly, in float64
  std::vector<bfloat16> q, k, v, dout;
  std::vector<float> dlse;
  Bf16Problem(const AttentionShape& shape, uint64_t seed) : s(shape) {
    const Inputs<double> raw = make_inputs(s, seed);
    q = to_bf16(raw.q), k = to_bf16(raw.k), v = to_bf16(raw.v), dout = to_bf16(raw.dout);
    dlse = cast_vector<float>(raw.dlse);
    x64 = {cast_vector<double>(to_float(q)), cast_vector<double>(to_float(k)),
           cast_vector<double>(to_float(v)), cast_vector<double>(to_float(dout)),
           cast_vector<double>(dlse)};
  }
  Inputs<float> x32() const { return cast_inputs<float>(x64); }
};

class Bf16Sweep : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(Bf16Sweep, ForwardWithinTwiceNaiveBf16Error) {
  const Bf16Problem p(GetParam(), 21);
  const AttentionShape& s = p.s;
  const Forward<double> ref = run_forward(s, p.x64, false);
  const Inputs<float> x32 = p.x32();
  Forward<float> naive{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size())};
  exact_attention_naive_bf16_forward(q_view(s, x32.q), k_view(s, x32.k), v_view(s, x32.v),
                                     s.options(),
                                     View4<float>(naive.out.data(), {s.B, s.N, s.H, s.Dv}),
                                     View3<float>(naive.lse.data(), {s.B, s.H, s.N}));
  std::vector<bfloat16> out(s.out_size());
  std::vector<float> lse(s.lse_size());
  exact_attention_forward<bfloat16>(Context{Device::cpu, 2}, q_view(s, p.q), k_view(s, p.k),
                                    v_view(s, p.v), s.options(),
                                    View4<bfloat16>(out.data(), {s.B, s.N, s.H, s.Dv}),
                                    View3<float>(lse.data(), {s.B, s.H, s.N}));
  expect_within_rule(to_float(out), naive.out, ref.out, "out");
  // lse: -inf exactly on fully masked rows, the rule elsewhere.
  std::vector<float> fast_lse = lse, naive_lse = naive.lse;
  std::vector<double> ref_lse = ref.lse;
  for (size_t i = 0; i < ref_lse.size(); ++i)
    if (std::isinf(ref_lse[i])) {
      EXPECT_EQ(fast_lse[i], ref_lse[i]) << "lse[" << i << "]";
      fast_lse[i] = naive_lse[i] = 0;
      ref_lse[i] = 0;
    }
  expect_within_rule(fast_lse, naive_lse, ref_lse, "lse");
}

TEST_P(Bf16Sweep, BackwardWithinTwiceNaiveBf16Error) {
  const Bf16Problem p(GetParam(), 22);
  const AttentionShape& s = p.s;
  const Forward<double> ref_forward = run_forward(s, p.x64, false);
  const Backward<double> ref = run_backward(s, p.x64, ref_forward, false);
  const Inputs<float> x32 = p.x32();
  Backward<float> naive{std::vector<float>(s.q_size()), std::vector<float>(s.k_size()),
                        std::vector<float>(s.v_size())};
  exact_attention_naive_bf16_backward(
      q_view(s, x32.q), k_view(s, x32.k), v_view(s, x32.v), out_view(s, x32.dout),
      View3<const float>(x32.dlse.data(), {s.B, s.H, s.N}), s.options(),
      View4<float>(naive.dq.data(), {s.B, s.N, s.H, s.D}),
      View4<float>(naive.dk.data(), {s.B, s.M, s.Hkv, s.D}),
      View4<float>(naive.dv.data(), {s.B, s.M, s.Hkv, s.Dv}));
  // The fast backward from the fast bfloat16 forward, as a training step runs it.
  const Context context{Device::cpu, 2};
  std::vector<bfloat16> out(s.out_size());
  std::vector<float> lse(s.lse_size());
  exact_attention_forward<bfloat16>(context, q_view(s, p.q), k_view(s, p.k), v_view(s, p.v),
                                    s.options(), View4<bfloat16>(out.data(), {s.B, s.N, s.H, s.Dv}),
                                    View3<float>(lse.data(), {s.B, s.H, s.N}));
  std::vector<bfloat16> dq(s.q_size()), dk(s.k_size()), dv(s.v_size());
  exact_attention_backward<bfloat16>(
      context, q_view(s, p.q), k_view(s, p.k), v_view(s, p.v), out_view(s, out),
      View3<const float>(lse.data(), {s.B, s.H, s.N}), out_view(s, p.dout),
      View3<const float>(p.dlse.data(), {s.B, s.H, s.N}), s.options(),
      View4<bfloat16>(dq.data(), {s.B, s.N, s.H, s.D}),
      View4<bfloat16>(dk.data(), {s.B, s.M, s.Hkv, s.D}),
      View4<bfloat16>(dv.data(), {s.B, s.M, s.Hkv, s.Dv}));
  expect_within_rule(to_float(dq), naive.dq, ref.dq, "dq");
  expect_within_rule(to_float(dk), naive.dk, ref.dk, "dk");
  expect_within_rule(to_float(dv), naive.dv, ref.dv, "dv");
}

// Odd and prime sizes of the float32 sweep, Dv != D, H / Hkv in {1/1, 8/2, 6/3}, causal
// (N > M gives fully masked rows) and windows.
const AttentionShape kShapes[] = {
    {1, 1, 1, 1, 1, 1, 1},
    {1, 2, 7, 1, 1, 8, 8, true},
    {2, 7, 2, 8, 2, 59, 64, true},
    {1, 97, 257, 8, 2, 64, 59},
    {1, 257, 97, 1, 1, 128, 128, true},
    {1, 257, 257, 6, 3, 59, 128, true, 64},
    {1, 97, 1025, 2, 1, 128, 8, false, 100},
    {1, 1025, 1025, 1, 1, 64, 64, true},
    {2, 1025, 64, 8, 2, 8, 16},
};
INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Sweep, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<AttentionShape>& info) {
                           std::ostringstream name;
                           name << info.param;
                           return name.str();
                         });

// Same inputs and thread count: bit-identical; the forward is independent of threads.
TEST(Bf16, ForwardIsDeterministic) {
  const AttentionShape s{2, 97, 97, 4, 2, 64, 64, true};
  const Bf16Problem p(s, 23);
  std::vector<bfloat16> first(s.out_size()), second(s.out_size());
  std::vector<float> lse(s.lse_size());
  for (auto [threads, out] : {std::pair{1, &first}, std::pair{2, &second}})
    exact_attention_forward<bfloat16>(Context{Device::cpu, threads}, q_view(s, p.q), k_view(s, p.k),
                                      v_view(s, p.v), s.options(),
                                      View4<bfloat16>(out->data(), {s.B, s.N, s.H, s.Dv}),
                                      View3<float>(lse.data(), {s.B, s.H, s.N}));
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(bfloat16)), 0);
}

// Only the portable kernel is built, whatever the CPU offers (README.md, bfloat16).
TEST(Bf16, KernelChoiceIsPortableAndFeaturesAreNamed) {
  EXPECT_STREQ(exact_bf16_kernel_name(), "portable");
  const std::string native = exact_bf16_native_support();
  EXPECT_TRUE(native == "amx_bf16" || native == "avx512_bf16" || native == "none") << native;
}

}  // namespace
}  // namespace subquad::testing
