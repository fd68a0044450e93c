// The activation arena plan and the parameter table's alignment: no overlaps, every slot and
// every tensor aligned, the expected total.
#include <gtest/gtest.h>

#include "model/arena.h"
#include "model/config.h"
#include "model/params.h"
#include "model/vit.h"
#include "model/vit_impl.h"  // VitModel over the test's backend below

namespace {

TEST(Arena, SlotsAreAlignedDisjointAndSized) {
  vit::ArenaPlan plan;
  const size_t a = plan.add("a", 3, 4);    // 12 bytes
  const size_t b = plan.add("b", 100, 2);  // 200 bytes
  const size_t z = plan.add("empty", 0, 4);
  const size_t c = plan.add("c", 65, 4);  // 260 bytes: spills into a second 256-byte line
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 256u);
  EXPECT_EQ(z, 512u);
  EXPECT_EQ(c, 512u);
  EXPECT_EQ(plan.total_bytes(), 512u + 512u);
  EXPECT_NO_THROW(plan.verify());
  ASSERT_EQ(plan.slots().size(), 4u);
  for (const auto& s : plan.slots()) EXPECT_EQ(s.offset % vit::kArenaAlign, 0u) << s.name;
  EXPECT_THROW(plan.add("negative", -1, 4), vit::Error);
}

TEST(Arena, PaddedRowsKeepSixteenByteAlignment) {
  EXPECT_EQ(vit::padded_row(197), 200);
  EXPECT_EQ(vit::padded_row(200), 200);
  EXPECT_EQ(vit::padded_row(1), 8);
}

// The model's plan for ViT-S/16 at batch 4 holds every buffer the old per-vector layout had,
// except the branch-gradient slot (B, N, C), which only layer scale or drop path need (without
// them a branch reads the residual gradient in place).
TEST(Arena, ModelArenaCoversEveryActivation) {
  for (double drop_path : {0.0, 0.1}) {
    SCOPED_TRACE("drop_path " + std::to_string(drop_path));
    vit::ModelConfig c = vit::model_preset("vit_small_patch16_224");
    c.depth = 2;  // the per-block part repeats; two blocks keep the test fast
    c.drop_path = drop_path;
    const bool dbranch = drop_path > 0;
    const vit::Index B = 4, N = c.num_tokens(), C = c.embed_dim, M = c.hidden_dim();
    const vit::Index H = c.num_heads, K = c.num_classes, Np = c.num_patches(), F = 3 * 16 * 16;
    vit::Vit<float> model(c, B);
    // Elements per block (see BlockActs) and outside the blocks, fp32 everywhere on the CPU;
    // the (B, N, C) gradients: dres, datty, dln and, with drop path, dbranch.
    const vit::Index per_block =
        6 * B * N * C + 4 * B * N + B * N * 3 * C + B * H * N * N + 2 * B * N * M + 2 * B;
    const vit::Index outside = B * Np * F + B * Np * C + (c.depth + 1) * B * N * C + 2 * B * C +
                               2 * B + 2 * B * K + B + (dbranch ? 4 : 3) * B * N * C +
                               B * N * 3 * C + 2 * B * N * M + B * Np * C + B * K + 2 * B * C;
    const size_t bytes = size_t(c.depth * per_block + outside) * sizeof(float);
    EXPECT_GE(model.arena_bytes(), bytes);
    // Alignment padding is at most one line per slot.
    const size_t slots = size_t(c.depth) * 17 + (dbranch ? 21 : 20) + size_t(c.depth) + 1;
    EXPECT_LE(model.arena_bytes(), bytes + slots * vit::kArenaAlign);
    // Without the slot the plan is smaller by about one (B, N, C) buffer, not more.
    if (!dbranch) {
      vit::ModelConfig with = c;
      with.drop_path = 0.1;
      const size_t grown = vit::Vit<float>(with, B).arena_bytes() - model.arena_bytes();
      EXPECT_GE(grown, size_t(B * N * C) * sizeof(float));
      EXPECT_LE(grown, size_t(B * N * C) * sizeof(float) + vit::kArenaAlign);
    }
  }
}

// A host policy that, like the CUDA backend, recomputes the locality FFN's act1 in the backward:
// only its arena plan is looked at (its model never runs).
struct CpuWithoutAct1 : vit::CpuBackend<float> {
  static constexpr bool kLocalFfnStoresAct1 = false;
};

// The locality FFN's act1 slot (B, N, M) per block is planned only where the backend stores it;
// the GELU MLP keeps its act1 (the GELU's output) on every backend.
TEST(Arena, LocalFfnAct1SlotOnlyWhereTheBackendStoresIt) {
  vit::ModelConfig c = vit::model_preset("vit_small_patch16_224");
  c.depth = 2;
  const vit::Index B = 4, N = c.num_tokens(), M = c.hidden_dim();
  c.ffn = vit::Ffn::Local;
  const size_t stored = vit::Vit<float>(c, B).arena_bytes();
  const size_t recomputed = vit::VitModel<CpuWithoutAct1>(c, B).arena_bytes();
  const size_t act1 = size_t(B * N * M) * sizeof(float);
  EXPECT_GE(stored - recomputed, size_t(c.depth) * act1);
  EXPECT_LE(stored - recomputed, size_t(c.depth) * (act1 + vit::kArenaAlign));
  c.ffn = vit::Ffn::Mlp;
  EXPECT_EQ(vit::VitModel<CpuWithoutAct1>(c, B).arena_bytes(), vit::Vit<float>(c, B).arena_bytes());
}

TEST(ParamTable, EveryTensorStartsAligned) {
  for (const char* name : {"vit_tiny_patch16_224", "vit_fmnist_local"}) {
    const vit::ModelConfig c = vit::model_preset(name);
    const vit::ParamTable t = vit::build_param_table(c);
    vit::Index sum = 0;
    for (const auto& s : t.specs) {
      EXPECT_EQ(s.offset % vit::kParamAlign, 0) << name << " " << s.name;
      EXPECT_LE(s.offset + s.numel(), t.total) << s.name;
      EXPECT_EQ(s.decay, s.offset < t.num_decay) << s.name;
      sum += s.numel();
    }
    EXPECT_EQ(sum, t.num_params);
    EXPECT_EQ(t.num_decay % vit::kParamAlign, 0);
    EXPECT_LT(t.total - t.num_params, vit::Index(t.specs.size()) * vit::kParamAlign) << name;
  }
}

}  // namespace
