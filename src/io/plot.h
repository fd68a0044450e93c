// The training curves as a PNG a person opens: three stacked panels against wall time —
// train/eval loss, eval top-1 accuracy, learning rate — with axes, tick labels and a legend.
#pragma once
#include <string>
#include <vector>

namespace vit {

struct PlotPoint {
  double t;  // seconds since the start of training
  double v;
};

struct PlotData {
  std::string title;
  std::vector<PlotPoint> train_loss, eval_loss, eval_top1, lr;
};

// Written atomically. Empty or constant series are fine.
void write_training_plot(const std::string& png_path, const PlotData& data);

// The PNG bytes (for tests), width x height RGB.
std::string render_training_plot(const PlotData& data, int width = 900, int height = 900);

}  // namespace vit
