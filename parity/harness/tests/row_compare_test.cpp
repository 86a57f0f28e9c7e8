// row_compare_test.cpp - row_diff / compare_row on full logits rows and on
// top-N log-probability rows (TS_CAP_TOP_N_LOGPROBS).
#include "../src/row_compare.h"
#include "../src/serving_internal.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace touchstone::detail {
namespace {

constexpr float kNone = -INFINITY;  // a token a top-N row does not list

TEST(RowDiff, FullRowsUseNmseAndMaxAbs) {
  const std::vector<float> a{1.0f, -2.0f, 3.0f}, b{1.0f, -2.5f, 3.0f};
  const RowDiff d = row_diff(a, b);
  EXPECT_DOUBLE_EQ(d.max_abs, 0.5);
  EXPECT_NEAR(d.nmse, 0.25 / 14.0, 1e-12);
  EXPECT_EQ(d.non_finite, 0u);
  const std::vector<float> bad{1.0f, kNone, 3.0f};
  EXPECT_EQ(row_diff(a, bad).non_finite, 1u);  // -Inf in a full row is not a listed-or-not mark
}

TEST(RowDiff, TopNRowsCompareTheTokensBothList) {
  const std::vector<float> a{-0.5f, -1.5f, kNone, kNone}, b{-0.6f, -1.5f, kNone, kNone};
  const RowDiff d = row_diff(a, b);
  EXPECT_NEAR(d.max_abs, 0.1, 1e-6);
  EXPECT_EQ(d.non_finite, 0u);
  EXPECT_TRUE(std::isfinite(d.nmse));
  EXPECT_EQ(row_diff(a, a).max_abs, 0.0);
}

TEST(RowDiff, TopNBoundaryChangeCountsItsLowerBound) {
  // Token 2 enters b's list at -1.0; a's smallest listed value is -1.5, so a
  // held it at -1.5 or below: at least 0.5 apart. Token 1 leaves (b lists -1.0
  // as its smallest): -1.5 < -1.0 adds nothing.
  const std::vector<float> a{-0.5f, -1.5f, kNone}, b{-0.5f, kNone, -1.0f};
  EXPECT_NEAR(row_diff(a, b).max_abs, 0.5, 1e-6);
}

TEST(RowDiff, TopNNaNOrPlusInfIsNonFinite) {
  const std::vector<float> a{-0.5f, kNone}, b{NAN, kNone}, c{INFINITY, kNone};
  EXPECT_EQ(row_diff(a, b).non_finite, 1u);
  EXPECT_EQ(row_diff(a, c).non_finite, 1u);
}

TEST(CompareRow, TopNArgmaxFlipIsAViolation) {
  Profile p;
  p.name = "test";
  p.logits_max_abs_max = 10.0;
  p.near_tie_margin = 0.01;
  const std::vector<float> a{-0.1f, -3.0f, kNone}, b{-3.0f, -0.1f, kNone};
  CaseResult r;
  EXPECT_FALSE(compare_row(a, b, 7, false, "", p, "", r));
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].check, "argmax");
  CaseResult same;
  EXPECT_TRUE(compare_row(a, a, 7, true, "bits", p, "", same));
}

}  // namespace
}  // namespace touchstone::detail

namespace touchstone::detail {
namespace {

// One shape's runs: a single needle row of x and of y, and the shape's noise.
IsolationRuns shape(float x0, float y0, double noise) {
  IsolationRuns s;
  s.where = " (test shape)";
  s.x.positions = s.y.positions = {3};
  s.x.rows = {{x0, -1.0f, -2.0f}};
  s.y.rows = {{y0, -1.0f, -2.0f}};
  s.noise = noise;
  return s;
}

CaseResult judge(const std::vector<IsolationRuns>& runs, const Profile& p = {}) {
  CaseResult r;
  judge_isolation(runs, p, r);
  finish_rows(r, "isolation");
  return r;
}

TEST(JudgeIsolation, RepeatsNeverDifferSoOtherContentsMustGiveTheSameBits) {
  const CaseResult r = judge({shape(0.5f, 0.5f, 0.0), shape(0.5f, 0.5001f, 0.0)});
  EXPECT_FALSE(r.passed);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].check, "isolation_max_abs");
}

TEST(JudgeIsolation, OneShapesNoiseIsTheBaselineOfEvery) {
  // Shape 0's repeats were identical, shape 1's differed by 0.1: 0.3 is within 4 x 0.1.
  EXPECT_TRUE(judge({shape(0.5f, 0.8f, 0.0), shape(0.5f, 0.5f, 0.1)}).passed);
  EXPECT_FALSE(judge({shape(0.5f, 1.0f, 0.0), shape(0.5f, 0.5f, 0.1)}).passed);
}

TEST(JudgeIsolation, TheNoiseAllowanceIsCappedAtTheProfilesTolerance) {
  // Repeats 1.0 apart would allow 4.0; the profile allows 0.002.
  Profile p;
  p.logits_max_abs_max = 0.002;
  EXPECT_TRUE(judge({shape(0.5f, 0.8f, 1.0)}).passed);
  const CaseResult r = judge({shape(0.5f, 0.8f, 1.0)}, p);
  EXPECT_FALSE(r.passed);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].check, "isolation_max_abs");
}

TEST(JudgeIsolation, NonFiniteIsAFailNeverNoise) {
  const CaseResult r = judge({shape(0.5f, NAN, HUGE_VAL)});
  EXPECT_FALSE(r.passed);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].check, "non_finite");
}

}  // namespace
}  // namespace touchstone::detail
