// SoloGovernor: runs the mode measured faster, re-measures the other one at
// the documented rate, and follows a change of conditions (a neighbour that
// arrives or leaves). Step times here are synthetic and exact.
#include "solo_governor.h"

#include <gtest/gtest.h>

namespace touchstone::cpu_simd {
namespace {

// Runs `steps` steps with fixed per-mode times; returns how many ran solo.
int run_steps(SoloGovernor& g, int steps, double parallel, double solo) {
  int n_solo = 0;
  for (int i = 0; i < steps; ++i) {
    const bool s = g.choose();
    g.record(s, s ? solo : parallel);
    n_solo += s;
  }
  return n_solo;
}

TEST(SoloGovernor, QuietMachineStaysParallelAndRarelyProbes) {
  SoloGovernor g;  // parallel twice as fast: solo re-measured every 64 steps
  const int n_solo = run_steps(g, 6400, 5.0, 10.0);
  EXPECT_FALSE(g.solo_preferred());
  EXPECT_LE(n_solo, 6400 / 64 + 1);
  EXPECT_GE(n_solo, 6400 / 64 - 1);  // it does keep measuring
}

TEST(SoloGovernor, BusyMachineRunsSoloAndProbesParallelOften) {
  SoloGovernor g;  // solo preferred: parallel is probed every 16 steps
  const int n_solo = run_steps(g, 1600, 11.5, 10.0);
  EXPECT_TRUE(g.solo_preferred());
  EXPECT_GE(1600 - n_solo, 1600 / 16 - 2);
  EXPECT_LE(1600 - n_solo, 1600 / 16 + 2);
}

TEST(SoloGovernor, FollowsTheNeighbourInAndOut) {
  SoloGovernor g;
  run_steps(g, 200, 5.0, 10.0);
  ASSERT_FALSE(g.solo_preferred());
  // A neighbour arrives: parallel is slower now. Its median moves within 3
  // steps, which starts a probe of solo at once; 3 probes confirm.
  int arrive = 0;
  for (; arrive < 200 && !g.solo_preferred(); ++arrive) run_steps(g, 1, 14.0, 10.0);
  EXPECT_TRUE(g.solo_preferred());
  EXPECT_LE(arrive, 3 + 3 + 1);
  // It leaves: found at the next probe of parallel (every 16 steps while solo
  // is preferred), then confirmed by the repeated probes.
  int steps = 0;
  for (; steps < 200 && g.solo_preferred(); ++steps) run_steps(g, 1, 5.0, 10.0);
  EXPECT_FALSE(g.solo_preferred());
  EXPECT_LE(steps, 16 + 3);
}

TEST(SoloGovernor, OneInterruptedStepDoesNotFlipTheChoice) {
  SoloGovernor g;
  run_steps(g, 300, 5.0, 10.0);
  g.record(false, 500.0);  // one parallel step the OS stopped for half a second
  run_steps(g, 1, 5.0, 10.0);
  EXPECT_FALSE(g.solo_preferred());
}

TEST(SoloGovernor, OneLuckyProbeDoesNotFlipTheChoice) {
  SoloGovernor g;
  run_steps(g, 300, 5.0, 10.0);
  g.record(true, 1.0);         // one solo probe that happened to be fast
  run_steps(g, 2, 5.0, 10.0);  // the repeated probes lose
  EXPECT_FALSE(g.solo_preferred());
}

TEST(SoloGovernor, HysteresisIgnoresTinyDifferences) {
  SoloGovernor g;  // solo 1 % faster: within the hysteresis, no switch
  run_steps(g, 500, 10.1, 10.0);
  EXPECT_FALSE(g.solo_preferred());
}

}  // namespace
}  // namespace touchstone::cpu_simd
