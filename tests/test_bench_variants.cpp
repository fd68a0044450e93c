// `vitrain bench --variant`'s pieces (cli/bench_variants.h): the spec's parsing and its errors,
// and the rounds' rotated orders.
#include <gtest/gtest.h>

#include <string>

#include "cli/bench_variants.h"
#include "core/common.h"

namespace {

using vit::BenchVariant;

TEST(BenchVariants, ParsesANameAndItsKernelOptions) {
  const BenchVariant v = vit::parse_bench_variant("tuned:autotune=on,attention=unfused");
  EXPECT_EQ(v.name, "tuned");
  EXPECT_EQ(v.kernels, "autotune=on,attention=unfused");
  EXPECT_TRUE(v.options.autotune);
  EXPECT_EQ(v.options.attention, vit::AttentionOption::kUnfused);
  const BenchVariant none = vit::parse_bench_variant("default:");
  EXPECT_EQ(none.name, "default");
  EXPECT_EQ(none.options, vit::KernelOptions{});
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
  EXPECT_NE(error_of("tuned").find("expected NAME:k=v"), std::string::npos);
  EXPECT_NE(error_of(":autotune=on").find("expected NAME:k=v"), std::string::npos);
  EXPECT_NE(error_of("a:VIT_X=1").find("unknown key 'VIT_X'"), std::string::npos);
  EXPECT_NE(error_of("a:gelu=tanh").find("gelu=tanh: expected one of erf, fast"),
            std::string::npos);
  EXPECT_NE(error_of("a:pool=wide,pool=narrow").find("given twice"), std::string::npos);
  EXPECT_EQ(error_of("a:pool=wide,pool=narrow").find('\n'), std::string::npos);
  const auto v = [](const char* spec) { return vit::parse_bench_variant(spec); };
  EXPECT_THROW(vit::check_bench_variants({v("a:"), v("b:"), v("a:gelu=fast")}), vit::Error);
  EXPECT_NO_THROW(vit::check_bench_variants({v("a:"), v("b:gelu=fast")}));
}

// Round r starts at variant r: each is first once in n rounds, and each round runs all of them.
TEST(BenchVariants, RoundsRotateTheOrder) {
  EXPECT_EQ(vit::bench_round_order(3, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(vit::bench_round_order(3, 1), (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(vit::bench_round_order(3, 2), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(vit::bench_round_order(3, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(vit::bench_round_order(1, 5), (std::vector<int>{0}));
}

}  // namespace
