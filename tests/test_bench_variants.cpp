// `vitrain bench --variant`'s pieces (cli/bench_variants.h): the spec's parsing and its errors,
// the rounds' rotated orders, and the environment a variant sets and gives back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cli/bench_variants.h"
#include "core/common.h"

namespace {

using vit::BenchVariant;

TEST(BenchVariants, ParsesANameAndItsAssignmentsInOrder) {
  const BenchVariant v = vit::parse_bench_variant("sm90dgrad:VIT_SM90_GEMM=fwd,dgrad  VIT_X=");
  EXPECT_EQ(v.name, "sm90dgrad");
  ASSERT_EQ(v.env.size(), 2u);
  EXPECT_EQ(v.env[0].first, "VIT_SM90_GEMM");
  EXPECT_EQ(v.env[0].second, "fwd,dgrad");  // commas belong to the value
  EXPECT_EQ(v.env[1].first, "VIT_X");
  EXPECT_EQ(v.env[1].second, "");  // set, but empty
  const BenchVariant none = vit::parse_bench_variant("default:");
  EXPECT_EQ(none.name, "default");
  EXPECT_TRUE(none.env.empty());
}

// Each malformed spec is one clear error naming what is wrong.
TEST(BenchVariants, RejectsMalformedSpecsWithOneLine) {
  const auto error_of = [](const std::string& spec) {
    try {
      vit::parse_bench_variant(spec);
    } catch (const vit::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("sm90").find("expected NAME:VAR=VALUE"), std::string::npos);
  EXPECT_NE(error_of(":VIT_X=1").find("expected NAME:VAR=VALUE"), std::string::npos);
  EXPECT_NE(error_of("a:VIT_X").find("'VIT_X' is not VAR=VALUE"), std::string::npos);
  EXPECT_NE(error_of("a:=1").find("'=1' is not VAR=VALUE"), std::string::npos);
  EXPECT_NE(error_of("a:VIT_X=1 VIT_X=2").find("VIT_X is set twice"), std::string::npos);
  EXPECT_THROW(vit::check_bench_variants({{"a", {}}, {"b", {}}, {"a", {{"X", "1"}}}}), vit::Error);
  EXPECT_NO_THROW(vit::check_bench_variants({{"a", {}}, {"b", {}}}));
}

// Round r starts at variant r: each is first once in n rounds, and each round runs all of them.
TEST(BenchVariants, RoundsRotateTheOrder) {
  EXPECT_EQ(vit::bench_round_order(3, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(vit::bench_round_order(3, 1), (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(vit::bench_round_order(3, 2), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(vit::bench_round_order(3, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(vit::bench_round_order(1, 5), (std::vector<int>{0}));
}

// A variant's variables hold while it is applied; after, each has its earlier value again, and
// one that was unset is unset again (not set to "").
TEST(BenchVariants, TheEnvironmentComesBackAsItWas) {
  setenv("VIT_TEST_VARIANT_SET", "outer", 1);
  unsetenv("VIT_TEST_VARIANT_UNSET");
  {
    const vit::ScopedVariantEnv env(
        vit::parse_bench_variant("v:VIT_TEST_VARIANT_SET=inner VIT_TEST_VARIANT_UNSET=1"));
    EXPECT_STREQ(std::getenv("VIT_TEST_VARIANT_SET"), "inner");
    EXPECT_STREQ(std::getenv("VIT_TEST_VARIANT_UNSET"), "1");
  }
  EXPECT_STREQ(std::getenv("VIT_TEST_VARIANT_SET"), "outer");
  EXPECT_EQ(std::getenv("VIT_TEST_VARIANT_UNSET"), nullptr);
  unsetenv("VIT_TEST_VARIANT_SET");
}

// A variant's opt-in kernel calls: the difference of two readings by route name (a route new in
// the second reading counts from 0), summed over its rounds, and the JSON and text of the result.
TEST(BenchVariants, RouteCallsAreDifferencesByNameSummedOverRounds) {
  const vit::KernelCalls before{{"sm90_gemm", 10}, {"cudnn_forward", 4}};
  const vit::KernelCalls after{{"sm90_gemm", 58}, {"cudnn_forward", 4}, {"cudnn_backward", 2}};
  const vit::KernelCalls since = vit::route_calls_since(before, after);
  EXPECT_EQ(since,
            (vit::KernelCalls{{"sm90_gemm", 48}, {"cudnn_forward", 0}, {"cudnn_backward", 2}}));
  vit::KernelCalls total;
  vit::add_route_calls(total, since);
  vit::add_route_calls(total, {{"cudnn_backward", 3}, {"flash_fused_backward", 1}});
  EXPECT_EQ(total, (vit::KernelCalls{{"sm90_gemm", 48},
                                     {"cudnn_forward", 0},
                                     {"cudnn_backward", 5},
                                     {"flash_fused_backward", 1}}));
  EXPECT_EQ(vit::route_calls_json(total).dump(),
            "{\"sm90_gemm\":48,\"cudnn_forward\":0,\"cudnn_backward\":5,"
            "\"flash_fused_backward\":1}");
  EXPECT_EQ(vit::route_calls_text(total), "sm90_gemm 48, cudnn_backward 5, flash_fused_backward 1");
  EXPECT_EQ(vit::route_calls_text(vit::route_calls_since(after, after)), "");
  EXPECT_EQ(vit::route_calls_json({}).dump(), "{}");  // the host backends have no routes
}

}  // namespace
