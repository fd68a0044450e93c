#include "io/plot.h"

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>

#include "core/common.h"
#include "io/atomic_file.h"

namespace vit {

namespace {

struct Rgb {
  uint8_t r, g, b;
};

// A 5x7 bitmap font: each glyph is 7 rows of 5 pixels ('#' set). Text is drawn upper-case.
const std::map<char, const char*>& font() {
  static const std::map<char, const char*> f = {
      {'0', ".###.#...##..###.#.###..##...#.###."}, {'1', "..#...##....#....#....#....#...###."},
      {'2', ".###.#...#....#...#...#...#...#####"}, {'3', "#####...#...#.....#.....##...#.###."},
      {'4', "...#...##..#.#.#..#.#####...#....#."}, {'5', "######....####.....#....##...#.###."},
      {'6', "..##..#...#....####.#...##...#.###."}, {'7', "#####....#...#...#...#....#....#..."},
      {'8', ".###.#...##...#.###.#...##...#.###."}, {'9', ".###.#...##...#.####....#...#..##.."},
      {'A', ".###.#...##...#######...##...##...#"}, {'B', "####.#...##...#####.#...##...#####."},
      {'C', ".###.#...##....#....#....#...#.###."}, {'D', "###..#..#.#...##...##...##..#.###.."},
      {'E', "######....#....####.#....#....#####"}, {'F', "######....#....####.#....#....#...."},
      {'G', ".###.#...##....#.####...##...#.####"}, {'H', "#...##...##...#######...##...##...#"},
      {'I', ".###...#....#....#....#....#...###."}, {'J', "..###...#....#....#....#.#..#..##.."},
      {'K', "#...##..#.#.#..##...#.#..#..#.#...#"}, {'L', "#....#....#....#....#....#....#####"},
      {'M', "#...###.###.#.##.#.##...##...##...#"}, {'N', "#...##...###..##.#.##..###...##...#"},
      {'O', ".###.#...##...##...##...##...#.###."}, {'P', "####.#...##...#####.#....#....#...."},
      {'Q', ".###.#...##...##...##.#.##..#..##.#"}, {'R', "####.#...##...#####.#.#..#..#.#...#"},
      {'S', ".#####....#.....###.....#....#####."}, {'T', "#####..#....#....#....#....#....#.."},
      {'U', "#...##...##...##...##...##...#.###."}, {'V', "#...##...##...##...##...#.#.#...#.."},
      {'W', "#...##...##...##.#.##.#.##.#.#.#.#."}, {'X', "#...##...#.#.#...#...#.#.#...##...#"},
      {'Y', "#...##...#.#.#...#....#....#....#.."}, {'Z', "#####....#...#...#...#...#....#####"},
      {'.', "..........................##...##.."}, {'-', "................###................"},
      {'+', ".......#....#..#####..#....#......."}, {'%', "##...##..#...#...#...#...#..##...##"},
      {':', "......##...##........##...##......."}, {'(', "...#...#...#....#....#.....#.....#."},
      {')', ".#.....#.....#....#....#...#...#..."}, {'/', ".........#...#...#...#...#........."},
      {'_', "..............................#####"}, {',', ".....................##....#...#..."},
      {' ', "..................................."}, {'=', "..........#####.....#####.........."},
  };
  return f;
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(size_t(w) * h * 3, 255) {}
  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    uint8_t* p = &px_[(size_t(y) * w_ + x) * 3];
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  // Thick line (2 px) by stepping along the longer axis.
  void line(double x0, double y0, double x1, double y1, Rgb c) {
    const int n = int(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0))) + 1;
    for (int i = 0; i <= n; ++i) {
      const double t = double(i) / n;
      const int x = int(std::lround(x0 + (x1 - x0) * t)), y = int(std::lround(y0 + (y1 - y0) * t));
      rect(x, y, x + 1, y + 1, c);
    }
  }
  // Text at scale `s` (pixel size of a font dot); returns the width drawn.
  int text(int x, int y, const std::string& s, Rgb c, int scale = 2) {
    int cx = x;
    for (char ch : s) {
      const char u = char(std::toupper(static_cast<unsigned char>(ch)));
      auto it = font().find(u);
      const char* g = it == font().end() ? font().at(' ') : it->second;
      const int len = int(std::strlen(g));
      for (int i = 0; i < 35 && i < len; ++i)
        if (g[i] == '#') rect(cx + (i % 5) * scale, y + (i / 5) * scale, cx + (i % 5) * scale + scale - 1, y + (i / 5) * scale + scale - 1, c);
      cx += 6 * scale;
    }
    return cx - x;
  }
  static int text_width(const std::string& s, int scale = 2) { return int(s.size()) * 6 * scale; }
  const std::vector<uint8_t>& pixels() const { return px_; }
  int w() const { return w_; }
  int h() const { return h_; }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e4 || a < 1e-2) return fmt::format("{:.1e}", v);
  if (a >= 100) return fmt::format("{:.0f}", v);
  if (a >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.3g}", v);
}

struct Series {
  const std::vector<PlotPoint>* pts;
  Rgb color;
  std::string name;
};

void panel(Canvas& cv, int top, int height, const std::string& title,
           const std::vector<Series>& series, double t_max) {
  const int left = 110, right = cv.w() - 30, bottom = top + height - 40, ptop = top + 30;
  const Rgb axis{40, 40, 40}, grid{225, 225, 225};
  cv.text(left, top + 6, title, axis, 2);
  double lo = 1e300, hi = -1e300;
  for (const auto& s : series)
    for (const auto& p : *s.pts) {
      if (!std::isfinite(p.v)) continue;
      lo = std::min(lo, p.v);
      hi = std::max(hi, p.v);
    }
  if (lo > hi) lo = 0, hi = 1;  // no data
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {  // constant series
    const double pad = std::max(std::fabs(hi) * 0.1, 1e-6);
    lo -= pad;
    hi += pad;
  }
  const double span = hi - lo;
  lo -= 0.05 * span;
  hi += 0.05 * span;
  const double tmax = t_max > 0 ? t_max : 1.0;
  auto X = [&](double t) { return left + (right - left) * t / tmax; };
  auto Y = [&](double v) { return bottom - (bottom - ptop) * (v - lo) / (hi - lo); };
  for (int i = 0; i <= 4; ++i) {  // horizontal grid + y ticks
    const double v = lo + (hi - lo) * i / 4;
    const int y = int(Y(v));
    cv.rect(left, y, right, y, grid);
    const std::string l = tick_label(v);
    cv.text(left - 10 - Canvas::text_width(l), y - 7, l, axis);
  }
  for (int i = 0; i <= 5; ++i) {  // x ticks (seconds)
    const double t = tmax * i / 5;
    const int x = int(X(t));
    cv.rect(x, ptop, x, bottom, grid);
    const std::string l = tick_label(t);
    cv.text(x - Canvas::text_width(l) / 2, bottom + 8, l, axis);
  }
  cv.rect(left, bottom, right, bottom + 1, axis);
  cv.rect(left - 1, ptop, left, bottom, axis);
  int lx = right - 10;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {  // legend, right-aligned
    lx -= Canvas::text_width(it->name) + 30;
    cv.rect(lx, top + 12, lx + 18, top + 15, it->color);
    cv.text(lx + 24, top + 6, it->name, it->color);
  }
  for (const auto& s : series) {
    const auto& p = *s.pts;
    for (size_t i = 0; i < p.size(); ++i) {
      if (!std::isfinite(p[i].v)) continue;
      if (p.size() == 1 || (i > 0 && std::isfinite(p[i - 1].v) && p.size() > 1)) {
        if (i > 0)
          cv.line(X(p[i - 1].t), Y(p[i - 1].v), X(p[i].t), Y(p[i].v), s.color);
      }
      cv.rect(int(X(p[i].t)) - 2, int(Y(p[i].v)) - 2, int(X(p[i].t)) + 2, int(Y(p[i].v)) + 2, s.color);
    }
  }
}

void png_write_to_string(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
void png_flush_noop(png_structp) {}

}  // namespace

std::string render_training_plot(const PlotData& d, int width, int height) {
  Canvas cv(width, height);
  double t_max = 0;
  for (const auto* s : {&d.train_loss, &d.eval_loss, &d.eval_top1, &d.lr})
    for (const auto& p : *s) t_max = std::max(t_max, p.t);
  cv.text(20, 12, d.title, Rgb{0, 0, 0}, 2);
  const int ph = (height - 70) / 3;
  const Rgb blue{31, 100, 200}, orange{230, 110, 20}, green{30, 150, 60}, purple{140, 60, 170};
  panel(cv, 40, ph, "LOSS", {{&d.train_loss, blue, "TRAIN"}, {&d.eval_loss, orange, "EVAL"}}, t_max);
  panel(cv, 40 + ph, ph, "EVAL TOP-1 %", {{&d.eval_top1, green, "TOP-1"}}, t_max);
  panel(cv, 40 + 2 * ph, ph, "LEARNING RATE", {{&d.lr, purple, "LR"}}, t_max);
  cv.text(width / 2 - 100, height - 24, "WALL TIME (S)", Rgb{40, 40, 40});

  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, &info);
    throw Error("cannot initialise the PNG writer");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error("PNG encoding failed");
  }
  png_set_write_fn(png, &out, png_write_to_string, png_flush_noop);
  png_set_IHDR(png, info, cv.w(), cv.h(), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < cv.h(); ++y)
    png_write_row(png, const_cast<png_bytep>(cv.pixels().data() + size_t(y) * cv.w() * 3));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

void write_training_plot(const std::string& png_path, const PlotData& data) {
  io::write_file_atomic(png_path, render_training_plot(data));
}

}  // namespace vit
