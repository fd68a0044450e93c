// The kernel plan's rules and its record (ops/kernel_plan.h, model/model_plan.h): every preset
// model planned on stand-ins for four GPUs, the options' parsing, forced picks, and a recorded
// plan replayed as it was.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "model/config.h"
#include "model/model_plan.h"
#include "ops/kernel_plan.h"

namespace vit {
namespace {

// The variants each family has, and the parameters each variant may carry.
bool supported(const OpKey& key, const KernelChoice& c) {
  switch (key.family) {
    case OpFamily::kAttention:
      return c.variant == "flash" || c.variant == "unfused";
    case OpFamily::kFlashForward:
    case OpFamily::kFlashBackward:
      return (c.variant == "mma" && key.storage == Storage::kBf16 && c.param >= 0 &&
              c.param <= 4) ||
             (c.variant == "fma" && key.storage == Storage::kFp32 && c.param == 0);
    case OpFamily::kDwconvForward:
    case OpFamily::kDwconvBackward:
      return c.variant == "columns" && (c.param == 1 || (c.param == 2 && key.dims[2] % 2 == 0));
    case OpFamily::kLayernorm:
      return c.variant == "rows" || (c.variant == "vec16" && key.storage == Storage::kBf16);
    case OpFamily::kEmbed:
    case OpFamily::kPool:
      return c.variant == "wide" || c.variant == "narrow";
    case OpFamily::kGelu:
      return c.variant == "erf" || c.variant == "fast";
    case OpFamily::kGemm:
      return c.variant == "cublaslt";
  }
  return false;
}

// A preset's batch as its recipes run it, and the image sizes a size curriculum takes it
// through (the smallest a half of the full size, rounded to the patch).
Index preset_batch(const ModelConfig& cfg) {
  return cfg.img_size >= 224 ? 256 : cfg.img_size >= 32 ? 1024 : 256;
}
std::vector<int> curriculum_sizes(const ModelConfig& cfg) {
  const int P = cfg.patch_size, full = cfg.img_size;
  return {std::max(P, full / 2 / P * P), std::max(P, full * 3 / 4 / P * P), full};
}

TEST(KernelPlan, EveryPresetOnEveryDeviceGetsOnlySupportedVariants) {
  for (const int sm : {80, 86, 89, 90})
    for (const auto& name : model_preset_names())
      for (const Storage storage : {Storage::kBf16, Storage::kFp32}) {
        SCOPED_TRACE(name + " sm" + std::to_string(sm));
        const ModelConfig cfg = model_preset(name);
        KernelPlan plan(fake_device(sm), KernelOptions{});
        plan_model(plan, cfg, preset_batch(cfg), curriculum_sizes(cfg), storage);
        const auto j = plan.to_json();
        ASSERT_GE(j.at("plan").size(), 8u);
        std::set<std::string> families;
        for (const auto& e : j.at("plan")) {
          OpKey key;
          key.family = OpFamily(e.at("family").get<int>());
          const auto dims = e.at("dims").get<std::vector<Index>>();
          std::copy(dims.begin(), dims.end(), key.dims.begin());
          key.storage = storage;
          const KernelChoice c{e.at("variant"), e.at("param"), ChoiceWhy::kRule};
          EXPECT_TRUE(supported(key, c)) << e.dump();
          EXPECT_EQ(e.at("why"), "rule") << e.dump();
          families.insert(e.at("op").get<std::string>());
        }
        // The flash kernels are planned exactly where the head dim has them.
        EXPECT_EQ(families.count("flash_forward") == 1, flash_head_dim_supported(cfg.head_dim()));
        EXPECT_EQ(families.count("dwconv_forward") == 1, cfg.ffn == Ffn::Local);
      }
}

TEST(KernelPlan, RulesFollowTheShape) {
  const DeviceProps h100 = fake_device(90);
  const KernelOptions defaults;
  const auto flash =
      choose(h100, attention_key(OpFamily::kAttention, 256, 197, 6, 64, Storage::kBf16), defaults);
  EXPECT_EQ(flash.variant, "flash");
  EXPECT_EQ(
      choose(h100, attention_key(OpFamily::kAttention, 8, 50, 2, 40, Storage::kBf16), defaults)
          .variant,
      "unfused");
  EXPECT_EQ(choose(h100, dwconv_key(true, 8, 197, 1536, Storage::kBf16), defaults).param, 2);
  EXPECT_EQ(choose(h100, dwconv_key(true, 8, 197, 1535, Storage::kBf16), defaults).param, 1);
  EXPECT_EQ(choose(h100, dwconv_key(false, 8, 197, 1536, Storage::kBf16), defaults).param, 1);
  EXPECT_EQ(choose(h100, layernorm_key(64, 384, Storage::kBf16), defaults).variant, "vec16");
  EXPECT_EQ(choose(h100, layernorm_key(64, 100, Storage::kBf16), defaults).variant, "rows");
  EXPECT_EQ(choose(h100, layernorm_key(64, 384, Storage::kFp32), defaults).variant, "rows");
  EXPECT_EQ(
      choose(h100, attention_key(OpFamily::kFlashForward, 8, 197, 6, 64, Storage::kFp32), defaults)
          .variant,
      "fma");
}

TEST(KernelPlan, ForcedOptionsArePickedOrRefusedWithOneLine) {
  const DeviceProps a100 = fake_device(80);
  const KernelOptions o = parse_kernel_options("attention=flash,flash_warps=2,dwconv_forward=1");
  const auto fwd =
      choose(a100, attention_key(OpFamily::kFlashForward, 8, 65, 3, 64, Storage::kBf16), o);
  EXPECT_EQ(fwd.param, 2);
  EXPECT_EQ(fwd.why, ChoiceWhy::kForced);
  EXPECT_EQ(choose(a100, dwconv_key(true, 8, 65, 384, Storage::kBf16), o).param, 1);
  try {
    choose(a100, attention_key(OpFamily::kAttention, 8, 65, 2, 40, Storage::kBf16), o);
    FAIL() << "attention=flash at D = 40 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 40"), std::string::npos) << e.what();
  }
  EXPECT_THROW(choose(a100, dwconv_key(true, 8, 65, 7, Storage::kBf16),
                      parse_kernel_options("dwconv_forward=2")),
               Error);
}

TEST(KernelPlan, OnlySameBitsFamiliesHaveCandidates) {
  const DeviceProps d = fake_device(89);
  const KernelOptions o;
  EXPECT_TRUE(
      tune_candidates(d, attention_key(OpFamily::kAttention, 8, 65, 3, 64, Storage::kBf16), o)
          .empty());
  EXPECT_TRUE(tune_candidates(d, gelu_key(1000, Storage::kBf16), o).empty());
  EXPECT_TRUE(tune_candidates(d, layernorm_key(8, 384, Storage::kBf16), o).empty());
  EXPECT_TRUE(tune_candidates(d, gemm_key(8, 384, 384, Storage::kBf16), o).empty());
  EXPECT_EQ(
      tune_candidates(d, attention_key(OpFamily::kFlashBackward, 8, 65, 3, 64, Storage::kBf16), o)
          .size(),
      4u);
  EXPECT_EQ(tune_candidates(d, dwconv_key(true, 8, 65, 384, Storage::kBf16), o).size(), 2u);
  // Ops that accumulate cannot be timed on their own arguments: their rule stands.
  EXPECT_TRUE(tune_candidates(d, dwconv_key(false, 8, 65, 384, Storage::kBf16), o).empty());
  EXPECT_TRUE(tune_candidates(d, pool_key(8, 65, 384, Storage::kBf16), o).empty());
  EXPECT_EQ(tune_candidates(d, embed_key(8, 64, Storage::kBf16), o).size(), 2u);
  // A forced pick is not tuned.
  EXPECT_TRUE(
      tune_candidates(d, embed_key(8, 64, Storage::kBf16), parse_kernel_options("embed=narrow"))
          .empty());
}

TEST(KernelOptions, ParseRoundTripAndErrors) {
  EXPECT_EQ(parse_kernel_options(""), KernelOptions{});
  EXPECT_EQ(parse_kernel_options("default"), KernelOptions{});
  const KernelOptions o = parse_kernel_options(" gelu=fast , attention=unfused,autotune=on ");
  EXPECT_EQ(o.gelu, GeluOption::kFast);
  EXPECT_EQ(o.attention, AttentionOption::kUnfused);
  EXPECT_TRUE(o.autotune);
  EXPECT_EQ(parse_kernel_options(to_string(o)), o);
  EXPECT_EQ(to_string(KernelOptions{}),
            "attention=auto,gelu=erf,autotune=off,flash_warps=auto,dwconv_forward=auto,"
            "dwconv_backward=auto,embed=auto,pool=auto");
  for (const char* bad :
       {"attention", "attention=fast", "warps=2", "gelu=erf,gelu=fast", "flash_warps=5", "=on"}) {
    try {
      parse_kernel_options(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(what.rfind("--kernels", 0), 0u) << what;
    }
  }
}

TEST(KernelOptions, OnlyAttentionAndGeluChangeBits) {
  const KernelOptions a;
  EXPECT_TRUE(bit_changing_differences(a, parse_kernel_options("autotune=on,flash_warps=3,"
                                                               "embed=narrow,pool=wide,"
                                                               "dwconv_forward=1"))
                  .empty());
  const auto d = bit_changing_differences(a, parse_kernel_options("gelu=fast,attention=unfused"));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "attention: auto -> unfused");
  EXPECT_EQ(d[1], "gelu: erf -> fast");
}

TEST(KernelPlan, ReplayKeepsTheRecordedPicks) {
  KernelPlan first(fake_device(90), parse_kernel_options("flash_warps=3"));
  const ModelConfig cfg = model_preset("vit_small_patch16_224");
  plan_model(first, cfg, 64, {}, Storage::kBf16);
  const auto recorded = first.to_json();

  // Resumed without the forced height: the recorded picks win over the rules.
  KernelPlan resumed(fake_device(90), KernelOptions{});
  resumed.replay(nlohmann::json::parse(recorded.dump()));
  const auto key = attention_key(OpFamily::kFlashForward, 64, 197, 6, 64, Storage::kBf16);
  const KernelChoice c = resumed.choice(key);
  EXPECT_EQ(c.param, 3);
  EXPECT_EQ(c.why, ChoiceWhy::kRecorded);
  EXPECT_EQ(resumed.size(), first.size());

  // A bit-changing option may not change on resume.
  KernelPlan other(fake_device(90), parse_kernel_options("gelu=fast"));
  try {
    other.replay(nlohmann::json::parse(recorded.dump()));
    FAIL() << "gelu erf -> fast must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gelu: erf -> fast"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resumed.replay(nlohmann::json::parse("{\"plan\": []}")), Error);
}

TEST(KernelPlan, ActiveScopeNestsAndRestores) {
  EXPECT_EQ(active_kernel_plan(), nullptr);
  KernelPlan outer(fake_device(80), parse_kernel_options("attention=unfused"));
  KernelPlan inner(fake_device(80), KernelOptions{});
  const auto key = attention_key(OpFamily::kAttention, 2, 65, 3, 64, Storage::kBf16);
  EXPECT_EQ(planned_choice(key).variant, "flash");  // no plan: the rules, default options
  {
    ActivePlanScope a(&outer);
    EXPECT_EQ(planned_choice(key).variant, "unfused");
    {
      ActivePlanScope b(&inner);
      EXPECT_EQ(planned_choice(key).variant, "flash");
    }
    EXPECT_EQ(active_kernel_plan(), &outer);
  }
  EXPECT_EQ(active_kernel_plan(), nullptr);
}

}  // namespace
}  // namespace vit
