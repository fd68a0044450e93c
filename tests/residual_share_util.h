// The blocks' share of the stream's gradient, for the --fp32-residual tests on any backend
// (test_fp32_residual.cpp on the host backends, test_cuda_model.cpp on the GPU): with a small
// layer scale the blocks add less than half a bf16 spacing to dres, which a bf16 stream drops.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "model/vit.h"

namespace vit::test {

// A small model with layer scale `layer_scale` and the pooled classifier (every patch row of dres
// gets the head's gradient, so the blocks' share lands on rows that are not zero).
inline ModelConfig layer_scale_config(double layer_scale) {
  ModelConfig c = model_preset("vit_fmnist_tiny");
  c.img_size = 16;
  c.patch_size = 4;
  c.in_chans = 1;
  c.num_classes = 5;
  c.classifier = Classifier::Avg;
  c.layer_scale_init = layer_scale;
  c.validate();
  return c;
}

// The blocks' share of the position embedding's gradient (an fp32 parameter gradient): dpos
// minus dpos from a backward pass whose layer scales were zeroed after the same forward pass
// (the blocks then pass nothing back; the head's gradient and the pooling's share are the same,
// so the difference is what the blocks added to the stream's gradient).
template <class Backend>
std::vector<double> blocks_share_of_dpos(const ModelConfig& c, const std::vector<float>& p0,
                                         const Batch& batch, Index B) {
  using Store = typename Backend::Store;
  using Acc = typename Backend::Acc;
  VitModel<Backend> model(c, B);
  const ParamTable& table = model.table();
  std::vector<float> p_zero_scale = p0;  // p0 with every layer scale 0
  for (const ParamSpec& t : table.specs)
    if (t.name.find(".gamma") != std::string::npos)
      for (Index i = 0; i < t.numel(); ++i) p_zero_scale[size_t(t.offset + i)] = 0;
  std::vector<Store> host_images(batch.images.size());  // (B, Cin, S, S)
  for (size_t i = 0; i < host_images.size(); ++i) host_images[i] = Store(batch.images[i]);
  typename Backend::template Buffer<Store> images(host_images.size());
  typename Backend::template Buffer<Acc> targets(batch.targets.size());  // (B, K)
  Backend::upload(images.data(), host_images.data(), Index(host_images.size()));
  Backend::upload(targets.data(), batch.targets.data(), Index(batch.targets.size()));
  auto set_params = [&](const std::vector<float>& p) {
    Backend::upload(model.params.data(), p.data(), table.total);
    model.sync_weights();
  };
  const ParamSpec& pos = table.at("pos_embed");
  auto dpos = [&](bool zero_layer_scale) {
    set_params(p0);
    model.zero_grad();
    model.forward(images.data(), targets.data(), B, false, 0);
    if (zero_layer_scale) set_params(p_zero_scale);
    model.backward(Acc(1) / Acc(B));
    std::vector<float> g(size_t(pos.numel()));
    Backend::download(g.data(), model.grads.data() + pos.offset, pos.numel());
    return g;
  };
  const std::vector<float> with = dpos(false), without = dpos(true);
  std::vector<double> share(with.size());
  for (size_t i = 0; i < share.size(); ++i) share[i] = double(with[i]) - double(without[i]);
  return share;
}

// |got - ref| / |ref| over the whole vector (ref must not be zero).
inline double relative_distance(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace vit::test
