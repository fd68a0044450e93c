// The op profile (core/profile.h): the work each model op reports, the table, and the device
// timer plumbing (a fake timer stands in for the CUDA event timer).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/profile.h"
#include "model/vit.h"

namespace {

using vit::Index;
using vit::OpTotals;
using vit::Profile;

vit::ModelConfig mlp_config() {
  vit::ModelConfig c = vit::model_preset("vit_fmnist_tiny");  // C 96, L 4, H 3, patch 4, 28 px
  c.ffn = vit::Ffn::Mlp;
  c.classifier = vit::Classifier::Token;
  c.validate();
  return c;
}

struct ProfileOn {
  ProfileOn() {
    Profile::set_enabled(true);
    Profile::reset();
  }
  ~ProfileOn() {
    Profile::set_timer(nullptr);
    Profile::reset();
    Profile::set_enabled(false);
  }
};

void forward_once(const vit::ModelConfig& c, Index B) {
  vit::Vit<float> model(c, B);
  std::vector<float> images(size_t(B * c.in_chans * c.img_size * c.img_size), 0.5f);
  std::vector<float> targets(size_t(B * c.num_classes), 1.0f / float(c.num_classes));
  Profile::reset();  // construction ran no ops, but be sure
  model.forward(images.data(), targets.data(), B, false, 0);
}

std::string printed_table(int steps) {
  std::FILE* f = std::tmpfile();
  Profile::print(f, steps);
  std::rewind(f);
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) text += buf;
  std::fclose(f);
  return text;
}

// The whitespace-separated fields of the table row that starts with `name`.
std::vector<std::string> row_of(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name);
  if (at == std::string::npos) return {};
  std::istringstream line(text.substr(at + 1, text.find('\n', at + 1) - at - 1));
  std::vector<std::string> fields;
  for (std::string f; line >> f;) fields.push_back(f);
  return fields;
}

// The forward's GEMM and attention flops add up to the model's analytic count (the MFU's
// numerator), and each op is called as often as the architecture says.
TEST(Profile, ForwardWorkMatchesTheAnalyticFlops) {
  ProfileOn on;
  const vit::ModelConfig c = mlp_config();
  const Index B = 3;
  forward_once(c, B);
  const auto& t = Profile::totals();
  ASSERT_TRUE(t.count("matmul_forward") && t.count("matmul_gelu_forward") &&
              t.count("attention_forward"));
  const double flops = t.at("matmul_forward").flops + t.at("matmul_gelu_forward").flops +
                       t.at("attention_forward").flops;
  EXPECT_NEAR(flops, c.forward_flops_per_image() * B, 1e-9 * flops);
  EXPECT_EQ(t.at("matmul_forward").calls, 2 + 3 * c.depth);  // patch, head; qkv, proj, fc2
  EXPECT_EQ(t.at("matmul_gelu_forward").calls, c.depth);     // fc1 and its GELU
  // Every residual add but the last is fused with the LayerNorm after it (norm2, the next
  // block's norm1); block 0's norm1 and the final norm stand alone.
  EXPECT_EQ(t.at("residual_layernorm_forward").calls, 2 * c.depth - 1);
  EXPECT_EQ(t.at("residual_forward").calls, 1);
  EXPECT_EQ(t.at("layernorm_forward").calls, 2);
  EXPECT_GT(t.at("layernorm_forward").bytes, 0.0);
  EXPECT_EQ(t.at("layernorm_forward").flops, 0.0);
  for (const auto& [name, op] : t) EXPECT_GE(op.seconds, 0.0) << name;
}

TEST(Profile, TablePrintsPerStepTimesAndRates) {
  ProfileOn on;
  Profile::add("matmul_forward", 0.004, {2e9, 0});
  Profile::add("matmul_forward", 0.004, {2e9, 0});
  Profile::add("layernorm_forward", 0.002, {0, 4e6});
  const std::string text = printed_table(2);
  // 8 ms over 2 steps = 4 ms per step, 80% of the profiled time, 1 call per step, 4e9 flops
  // in 8 ms = 0.50 TFLOP/s; 4e6 bytes in 2 ms = 2.0 GB/s.
  EXPECT_EQ(
      row_of(text, "matmul_forward"),
      (std::vector<std::string>{"matmul_forward", "4.000", "80.0%", "1.0", "0.50", "TFLOP/s"}))
      << text;
  EXPECT_EQ(row_of(text, "layernorm_forward"),
            (std::vector<std::string>{"layernorm_forward", "1.000", "20.0%", "0.5", "2.0", "GB/s"}))
      << text;
  EXPECT_EQ(row_of(text, "total"),
            (std::vector<std::string>{"total", "(profiled", "ops)", "5.000"}))
      << text;
  EXPECT_LT(text.find("matmul_forward"), text.find("layernorm_forward")) << "slowest first";
}

// A device timer: scopes go to it instead of the host clock, and its intervals (collected when
// the totals are read) are what the table shows.
class FakeTimer : public vit::ProfileTimer {
 public:
  int begin() override { return begins_++; }
  void end(int token, const char* name, const vit::OpWork& work) override {
    pending_.push_back({token, name, work});
  }
  void collect(std::map<std::string, OpTotals>& totals) override {
    for (const auto& p : pending_) {
      OpTotals& t = totals[p.name];
      t.seconds += 1e-3 * (p.token + 1);  // "device time": 1 ms, 2 ms, ... by token
      t.flops += p.work.flops;
      t.bytes += p.work.bytes;
      ++t.calls;
    }
    ++collects_;
    pending_.clear();
  }
  int begins_ = 0, collects_ = 0;

 private:
  struct Pending {
    int token;
    std::string name;
    vit::OpWork work;
  };
  std::vector<Pending> pending_;
};

TEST(Profile, DeviceTimerTakesOverTheScopes) {
  ProfileOn on;
  FakeTimer timer;
  Profile::set_timer(&timer);
  { vit::ProfileScope a("op_a", {10, 0}); }
  { vit::ProfileScope b("op_b", {0, 20}); }
  EXPECT_EQ(timer.begins_, 2);
  EXPECT_EQ(timer.collects_, 0) << "nothing is read back until the totals are";
  const auto& t = Profile::totals();
  EXPECT_EQ(timer.collects_, 1);
  ASSERT_TRUE(t.count("op_a") && t.count("op_b"));
  EXPECT_DOUBLE_EQ(t.at("op_a").seconds, 1e-3);
  EXPECT_DOUBLE_EQ(t.at("op_b").seconds, 2e-3);
  EXPECT_EQ(t.at("op_a").flops, 10.0);
  EXPECT_EQ(t.at("op_b").bytes, 20.0);
}

TEST(Profile, OffRecordsNothing) {
  Profile::set_enabled(false);
  Profile::reset();
  forward_once(mlp_config(), 2);
  EXPECT_TRUE(Profile::totals().empty());
}

}  // namespace
