// The training plot: a PNG libpng reads back at the requested size, with ink in every panel and
// each series' colour in its own panel; empty, constant and non-finite data do not break it.
#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/common.h"
#include "io/plot.h"

namespace fs = std::filesystem;

namespace {

struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;
  uint32_t at(int x, int y) const {
    const uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
    return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2];
  }
};

Image decode(const std::string& png_bytes) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  EXPECT_TRUE(png_image_begin_read_from_memory(&img, png_bytes.data(), png_bytes.size()))
      << img.message;
  img.format = PNG_FORMAT_RGB;
  Image out;
  out.w = int(img.width);
  out.h = int(img.height);
  out.rgb.resize(PNG_IMAGE_SIZE(img));
  EXPECT_TRUE(png_image_finish_read(&img, nullptr, out.rgb.data(), 0, nullptr)) << img.message;
  return out;
}

vit::PlotData sample() {
  vit::PlotData d;
  d.title = "vit_fmnist_tiny 20260101-120000";
  for (int i = 0; i <= 200; ++i) {
    const double t = i * 2.0;
    d.train_loss.push_back({t, 2.3 * std::exp(-t / 100) + 0.4});
    d.lr.push_back(
        {t, t < 40 ? 1e-6 + t / 40 * 2e-3 : 1e-5 + 1e-3 * (1 + std::cos(M_PI * (t - 40) / 360))});
  }
  for (int e = 1; e <= 5; ++e) {
    d.eval_loss.push_back({80.0 * e, 2.0 * std::exp(-80.0 * e / 100) + 0.45});
    d.eval_top1.push_back({80.0 * e, 70 + 3.0 * e});
  }
  return d;
}

// Pixels of exactly this colour, and how many of them lie in rows [y0, y1).
struct Count {
  int total = 0, inside = 0;
};
Count count(const Image& im, uint32_t colour, double y0, double y1) {
  Count c;
  for (int y = 0; y < im.h; ++y)
    for (int x = 0; x < im.w; ++x)
      if (im.at(x, y) == colour) {
        ++c.total;
        c.inside += y >= y0 * im.h && y < y1 * im.h;
      }
  return c;
}

bool has_ink(const Image& im, double y0, double y1) {
  int n = 0;
  for (int y = int(y0 * im.h); y < int(y1 * im.h); ++y)
    for (int x = 0; x < im.w; ++x) n += im.at(x, y) != 0xffffff;
  return n > 500;
}

TEST(Plot, PanelsAxesAndColours) {
  const Image im = decode(vit::render_training_plot(sample()));
  ASSERT_EQ(im.w, 900);
  ASSERT_EQ(im.h, 900);
  EXPECT_EQ(im.at(2, 2), 0xffffffu);  // white background
  for (int p = 0; p < 3; ++p) EXPECT_TRUE(has_ink(im, 0.05 + p * 0.31, 0.05 + (p + 1) * 0.31)) << p;
  // Each series draws a real line (far more pixels than its legend swatch), in its panel.
  const struct {
    uint32_t colour;
    double y0, y1;
  } expect[] = {{vit::plot_colour::train_loss, 0.0, 0.36},
                {vit::plot_colour::eval_loss, 0.0, 0.36},
                {vit::plot_colour::eval_top1, 0.33, 0.67},
                {vit::plot_colour::lr, 0.64, 1.0}};
  for (const auto& e : expect) {
    const Count c = count(im, e.colour, e.y0, e.y1);
    EXPECT_GT(c.total, 300) << std::hex << e.colour;
    EXPECT_EQ(c.inside, c.total) << std::hex << e.colour;
  }
}

// Stage marks (a curriculum's size changes): dashed grey lines at their times in every panel,
// none where there are no marks.
TEST(Plot, StageMarksAreDashedLinesAtTheirTimes) {
  const Image plain = decode(vit::render_training_plot(sample()));
  EXPECT_EQ(count(plain, vit::plot_colour::mark, 0.0, 1.0).total, 0);
  vit::PlotData d = sample();
  d.marks = {{100.0, "96px"}, {300.0, "160px"}};
  const Image im = decode(vit::render_training_plot(d));
  std::vector<int> columns;  // x of each column with mark pixels
  for (int x = 0; x < im.w; ++x) {
    int n = 0;
    for (int y = 0; y < im.h; ++y) n += im.at(x, y) == vit::plot_colour::mark;
    if (n > 0) columns.push_back(x);
    if (n > 0) EXPECT_GT(n, 100) << "column " << x << ": a line across the panels, not a dot";
  }
  ASSERT_EQ(columns.size(), 2u);
  // Time 0..400 spans the same x range in every panel: 300 s lies three times as far from 0 as
  // 100 s.
  EXPECT_GT(columns[1], columns[0]);
  // In each panel (a third of the height) there are dashes.
  for (int p = 0; p < 3; ++p)
    EXPECT_GT(count(im, vit::plot_colour::mark, 0.05 + p * 0.31, 0.05 + (p + 1) * 0.31).total, 20)
        << "panel " << p;
}

TEST(Plot, OtherSizes) {
  const Image im = decode(vit::render_training_plot(sample(), 640, 1200));
  EXPECT_EQ(im.w, 640);
  EXPECT_EQ(im.h, 1200);
  EXPECT_GT(count(im, vit::plot_colour::lr, 0.6, 1.0).inside, 300);
  EXPECT_THROW(vit::render_training_plot(sample(), 10, 900), vit::Error);
}

TEST(Plot, EmptyConstantAndOddData) {
  vit::PlotData empty;
  const Image a = decode(vit::render_training_plot(empty));
  EXPECT_EQ(a.w, 900);
  EXPECT_LT(count(a, vit::plot_colour::train_loss, 0, 1).total, 120);  // just the legend swatch

  vit::PlotData odd;
  odd.train_loss = {{0, 1.0}, {10, 1.0}, {20, 1.0}};  // constant
  odd.eval_loss = {{5, 0.0}};                         // one point, zero
  odd.eval_top1 = {{5, 100.0}, {6, NAN}, {7, INFINITY}, {8, 99.0}};
  odd.lr = {{0, 1e-3}, {0, 1e-3}};  // constant, no time span
  const Image b = decode(vit::render_training_plot(odd));
  EXPECT_GT(count(b, vit::plot_colour::train_loss, 0, 0.36).total, 300);
  EXPECT_GT(count(b, vit::plot_colour::eval_loss, 0, 0.36).total, 60);
  EXPECT_GT(count(b, vit::plot_colour::eval_top1, 0.33, 0.67).total, 60);

  vit::PlotData only_nan;
  only_nan.train_loss = {{NAN, NAN}, {1, INFINITY}};
  EXPECT_NO_THROW(decode(vit::render_training_plot(only_nan)));
}

TEST(Plot, WritesFileAtomically) {
  const fs::path dir = fs::temp_directory_path() / ("vitrain_plot_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path p = dir / "plot.png";
  vit::write_training_plot(p.string(), sample());
  vit::write_training_plot(p.string(), sample());  // replaces
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_EQ(decode(bytes).w, 900);
  int files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += 1 + 0 * int(f.is_regular_file());
  EXPECT_EQ(files, 1);  // no temp file left behind
  EXPECT_THROW(vit::write_training_plot((dir / "missing" / "plot.png").string(), sample()),
               vit::Error);
  fs::remove_all(dir);
}

}  // namespace
