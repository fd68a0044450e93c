// Wall-clock budget: duration parsing and the stop rule.
#include <gtest/gtest.h>

#include <string>

#include "core/common.h"
#include "train/budget.h"

namespace {

TEST(Duration, ParsesUnitsAndPlainSeconds) {
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("24h"), 86400.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("90m"), 5400.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("45s"), 45.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1h30m"), 5400.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("2.5h"), 9000.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("600"), 600.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("0.5"), 0.5);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1h0m30s"), 3630.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1m30s"), 90.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds(" 10m "), 600.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("0h5m"), 300.0);
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds(".5m"), 30.0);
}

TEST(Duration, RejectsBadText) {
  for (const char* bad : {"", "   ", "abc", "-5m", "10x", "0s", "0", "0h0m", "h", "1h1h", "30m1h",
                          "1h30", "1.2.3h", "+5m", "5 m", "1e3", "5mm", ".h", "inf"}) {
    try {
      vit::parse_duration_seconds(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const vit::Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"" + std::string(bad) + "\""), std::string::npos)
          << e.what();
    }
  }
}

// Numbers past double's range, or below it, are one vit::Error, not std::stod's out_of_range
// (fuzz_config campaign, 2026-11-25: 400 digits ended `vitrain train` with "error: stod").
TEST(Duration, RejectsNumbersOutOfRange) {
  const std::string huge(400, '9'), tiny = "0." + std::string(400, '0') + "1";
  for (const std::string& bad : {huge, huge + "s", "1h" + huge + "m", tiny, tiny + "h"})
    EXPECT_THROW(vit::parse_duration_seconds(bad), vit::Error) << bad.size() << " chars";
  EXPECT_DOUBLE_EQ(vit::parse_duration_seconds("1h" + tiny + "s"), 3600.0);  // underflows to 0
}

TEST(TimeBudget, FractionAndStopRule) {
  const vit::TimeBudget b{1000, 100};  // 900 s usable
  EXPECT_DOUBLE_EQ(b.usable_s(), 900.0);
  EXPECT_DOUBLE_EQ(b.fraction(0), 0.0);
  EXPECT_DOUBLE_EQ(b.fraction(450), 0.5);
  EXPECT_DOUBLE_EQ(b.fraction(2000), 1.0);
  // Usable 900 s; a step of 10 s and an evaluation of 50 s count twice: 120 s.
  EXPECT_FALSE(b.should_stop(700, 10, 50));
  EXPECT_FALSE(b.should_stop(780, 10, 50));  // exactly at the limit is still fine
  EXPECT_TRUE(b.should_stop(781, 10, 50));
  EXPECT_TRUE(b.should_stop(0, 10, 500));  // final evaluation alone does not fit twice
  const vit::TimeBudget nores{600, 0};
  EXPECT_FALSE(nores.should_stop(578, 1, 10));
  EXPECT_TRUE(nores.should_stop(578.5, 1, 10));
}

TEST(TimeBudget, RejectsBadConfiguration) {
  EXPECT_THROW((vit::TimeBudget{0, 0}.fraction(1)), vit::Error);
  EXPECT_THROW((vit::TimeBudget{100, 100}.should_stop(1, 1, 1)), vit::Error);
  EXPECT_THROW((vit::TimeBudget{100, -1}.fraction(1)), vit::Error);
  EXPECT_THROW((vit::TimeBudget{100, 0}.should_stop(1, -1, 1)), vit::Error);
}

}  // namespace
