// The training curves as a PNG a person opens: three stacked panels against wall time in
// seconds — (1) train and eval loss, (2) eval top-1 accuracy %, (3) learning rate — with axes,
// numbered ticks, panel titles and legends, drawn with a built-in bitmap font (no font files).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vit {

struct PlotPoint {
  double t;  // x: seconds of training wall time
  double v;  // y: the value
};

// A moment of the run drawn across every panel as a dashed vertical line, its label at the top
// of the first panel: a size curriculum's or EfficientTrain++'s change of image size ("160px").
struct PlotMark {
  double t;  // seconds of training wall time
  std::string label;
};

struct PlotData {
  std::string title;  // drawn at the top; empty = "Training curves"
  std::vector<PlotPoint> train_loss, eval_loss, eval_top1, lr;
  std::vector<PlotMark> marks;
};

// The line colour of each series, 0xRRGGBB (a fully covered line pixel has exactly this colour).
namespace plot_colour {
inline constexpr uint32_t train_loss = 0x1f64c8;  // blue
inline constexpr uint32_t eval_loss = 0xe66e14;   // orange
inline constexpr uint32_t eval_top1 = 0x1e963c;   // green
inline constexpr uint32_t lr = 0x8c3caa;          // purple
inline constexpr uint32_t mark = 0x9a9a9a;        // grey: the stage marks' dashes
}  // namespace plot_colour

// Writes the PNG atomically (io::write_file_atomic). Empty, single-point, constant and
// non-finite values are all fine (non-finite points are skipped). Throws vit::Error.
void write_training_plot(const std::string& png_path, const PlotData& data);

// The PNG bytes: an 8-bit RGB image, width x height (each at least 300).
std::string render_training_plot(const PlotData& data, int width = 900, int height = 900);

}  // namespace vit
