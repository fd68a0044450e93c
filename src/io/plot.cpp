#include "io/plot.h"

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <functional>
#include <string_view>

#include "core/common.h"
#include "io/atomic_file.h"

namespace vit {

namespace {

// ------------------------------------------------------------------------------------------
// A 5x7 bitmap font ('#' = ink), with two extra rows below the baseline for descenders.

struct Glyph {
  char c;
  std::array<const char*, 9> rows;  // missing trailing rows are blank
};

constexpr Glyph kFont[] = {
    {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
    {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
    {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
    {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
    {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
    {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
    {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
    {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
    {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
    {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
    {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
    {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
    {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
    {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
    {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
    {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
    {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
    {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
    {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
    {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
    {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
    {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
    {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
    {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
    {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
    {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
    {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
    {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
    {'a', {".....", ".....", ".###.", "....#", ".####", "#...#", ".####"}},
    {'b', {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "####."}},
    {'c', {".....", ".....", ".###.", "#....", "#....", "#...#", ".###."}},
    {'d', {"....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"}},
    {'e', {".....", ".....", ".###.", "#...#", "#####", "#....", ".###."}},
    {'f', {"..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..."}},
    {'g', {".....", ".....", ".####", "#...#", "#...#", "#...#", ".####", "....#", ".###."}},
    {'h', {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"}},
    {'i', {"..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."}},
    {'j', {"...#.", ".....", "..##.", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'k', {"#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."}},
    {'l', {".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'m', {".....", ".....", "##.#.", "#.#.#", "#.#.#", "#.#.#", "#.#.#"}},
    {'n', {".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"}},
    {'o', {".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."}},
    {'p', {".....", ".....", "####.", "#...#", "#...#", "#...#", "####.", "#....", "#...."}},
    {'q', {".....", ".....", ".####", "#...#", "#...#", "#...#", ".####", "....#", "....#"}},
    {'r', {".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."}},
    {'s', {".....", ".....", ".####", "#....", ".###.", "....#", "####."}},
    {'t', {".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."}},
    {'u', {".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"}},
    {'v', {".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'w', {".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."}},
    {'x', {".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"}},
    {'y', {".....", ".....", "#...#", "#...#", "#...#", "#...#", ".####", "....#", ".###."}},
    {'z', {".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"}},
    {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
    {',', {".....", ".....", ".....", ".....", ".....", ".##..", ".##..", "..#..", ".#..."}},
    {'-', {".....", ".....", ".....", ".###.", ".....", ".....", "....."}},
    {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
    {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
    {'%', {"##..#", "##..#", "...#.", "..#..", ".#...", "#..##", "#..##"}},
    {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
    {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
    {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
    {'[', {".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."}},
    {']', {".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."}},
    {'/', {"....#", "....#", "...#.", "..#..", ".#...", "#....", "#...."}},
    {'_', {".....", ".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
    {'@', {".###.", "#...#", "#.###", "#.#.#", "#.##.", "#....", ".###."}},
    {'#', {".#.#.", ".#.#.", "#####", ".#.#.", "#####", ".#.#.", ".#.#."}},
    {'*', {".....", "#.#.#", ".###.", "#####", ".###.", "#.#.#", "....."}},
    {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
};

const Glyph& glyph(char c) {
  for (const Glyph& g : kFont)
    if (g.c == c) return g;
  if (c >= 'a' && c <= 'z') return glyph(char(c - 'a' + 'A'));
  return glyph('?');
}

constexpr int kGlyphAdvance = 6;  // columns per character, including the gap
constexpr int kGlyphHeight = 7;   // rows above the baseline

struct Rgb {
  uint8_t r, g, b;
};

constexpr Rgb rgb(uint32_t hex) {
  return {uint8_t(hex >> 16), uint8_t(hex >> 8), uint8_t(hex)};
}

constexpr Rgb kBlack{0, 0, 0}, kText{50, 50, 50}, kFrame{150, 150, 150}, kGrid{228, 228, 228},
    kMuted{170, 170, 170};

// ------------------------------------------------------------------------------------------
// An RGB canvas with anti-aliased polylines (per-series coverage, blended once).

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(size_t(w) * h * 3, 255), cov_(size_t(w) * h, 0.f) {}
  int w() const { return w_; }
  int h() const { return h_; }
  const uint8_t* row(int y) const { return &px_[size_t(y) * w_ * 3]; }

  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    uint8_t* p = &px_[(size_t(y) * w_ + x) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void fill(int x0, int y0, int x1, int y1, Rgb c) {  // inclusive corners
    for (int y = std::max(y0, 0); y <= std::min(y1, h_ - 1); ++y)
      for (int x = std::max(x0, 0); x <= std::min(x1, w_ - 1); ++x) set(x, y, c);
  }

  // Text with its top-left corner at (x, y); each font dot is scale x scale pixels.
  void text(int x, int y, std::string_view s, Rgb c, int scale = 2, bool bold = false) {
    for (char ch : s) {
      const Glyph& g = glyph(ch);
      for (int r = 0; r < 9; ++r) {
        if (!g.rows[r]) continue;
        for (int k = 0; k < 5; ++k)
          if (g.rows[r][k] == '#')
            fill(x + k * scale, y + r * scale, x + (k + 1) * scale - 1 + (bold ? 1 : 0),
                 y + (r + 1) * scale - 1, c);
      }
      x += kGlyphAdvance * scale;
    }
  }
  static int text_width(std::string_view s, int scale = 2) {
    return s.empty() ? 0 : (int(s.size()) * kGlyphAdvance - 1) * scale;
  }

  // Coverage of a round-capped segment of half-width r, kept as the max over what was drawn,
  // restricted to the clip rectangle.
  void cover_segment(double x0, double y0, double x1, double y1, double r) {
    const int bx0 = std::max(clip_x0_, int(std::floor(std::min(x0, x1) - r - 1)));
    const int bx1 = std::min(clip_x1_, int(std::ceil(std::max(x0, x1) + r + 1)));
    const int by0 = std::max(clip_y0_, int(std::floor(std::min(y0, y1) - r - 1)));
    const int by1 = std::min(clip_y1_, int(std::ceil(std::max(y0, y1) + r + 1)));
    const double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    for (int y = by0; y <= by1; ++y)
      for (int x = bx0; x <= bx1; ++x) {
        const double px = x + 0.5 - x0, py = y + 0.5 - y0;
        const double t = len2 > 0 ? std::clamp((px * dx + py * dy) / len2, 0.0, 1.0) : 0.0;
        const double ex = px - t * dx, ey = py - t * dy;
        const double c = std::clamp(r + 0.5 - std::sqrt(ex * ex + ey * ey), 0.0, 1.0);
        float& cv = cov_[size_t(y) * w_ + x];
        cv = std::max(cv, float(c));
      }
  }
  void set_clip(int x0, int y0, int x1, int y1) {
    clip_x0_ = std::max(x0, 0), clip_y0_ = std::max(y0, 0);
    clip_x1_ = std::min(x1, w_ - 1), clip_y1_ = std::min(y1, h_ - 1);
  }
  // Paints the accumulated coverage in colour c and clears it.
  void flush_coverage(Rgb c) {
    for (int y = clip_y0_; y <= clip_y1_; ++y)
      for (int x = clip_x0_; x <= clip_x1_; ++x) {
        float& a = cov_[size_t(y) * w_ + x];
        if (a <= 0.f) continue;
        uint8_t* p = &px_[(size_t(y) * w_ + x) * 3];
        const uint8_t col[3] = {c.r, c.g, c.b};
        for (int k = 0; k < 3; ++k) p[k] = uint8_t(std::lround(p[k] * (1.0f - a) + col[k] * a));
        a = 0.f;
      }
  }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
  std::vector<float> cov_;
  int clip_x0_ = 0, clip_y0_ = 0, clip_x1_ = 0, clip_y1_ = 0;
};

// ------------------------------------------------------------------------------------------
// Axes with "nice" ticks (1, 2 or 5 times a power of ten).

struct Axis {
  double lo, hi, step;
};

Axis nice_axis(double lo, double hi, int target_ticks) {
  const double raw = (hi - lo) / target_ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double n = raw / mag;
  const double step = (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * mag;
  if (!std::isfinite(step) || step <= 0) return {lo, hi, hi - lo};
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

// The y range of some values: padded when constant, {0, 1} when there are none.
Axis value_axis(const std::vector<const std::vector<PlotPoint>*>& series, bool include_zero,
                bool percent) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* s : series)
    for (const PlotPoint& p : *s)
      if (std::isfinite(p.v) && std::isfinite(p.t)) lo = std::min(lo, p.v), hi = std::max(hi, p.v);
  if (lo > hi) lo = 0, hi = percent ? 100 : 1;
  if (include_zero) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  if (hi - lo <= 1e-12 * std::max(std::fabs(lo), std::fabs(hi))) {  // constant (or all zero)
    const double pad = hi != 0 ? std::fabs(hi) * 0.1 : 1.0;
    lo = include_zero && lo >= 0 ? lo : lo - pad;
    hi += pad;
  }
  Axis a = nice_axis(lo, hi, 5);
  if (percent && hi <= 100 && a.hi > 100) a.hi = 100;
  if (percent && lo >= 0 && a.lo < 0) a.lo = 0;
  return a;
}

// Tick labels of one axis share a format: fixed decimals, or "m.me-3" for tiny/huge values.
std::string tick_text(double v, const Axis& a) {
  if (std::fabs(v) < a.step * 1e-6) return "0";
  const double maxabs = std::max(std::fabs(a.lo), std::fabs(a.hi));
  if (maxabs >= 1e5 || maxabs < 1e-2) {
    const int e = int(std::floor(std::log10(maxabs)));
    const double scale = std::pow(10.0, e);
    const int dec = std::max(0, int(-std::floor(std::log10(a.step / scale) + 1e-9)));
    return fmt::format("{:.{}f}e{}", v / scale, dec, e);
  }
  const int dec = std::max(0, int(-std::floor(std::log10(a.step) + 1e-9)));
  return fmt::format("{:.{}f}", v, dec);
}

std::vector<double> ticks(const Axis& a) {
  std::vector<double> t;
  const long k0 = long(std::ceil(a.lo / a.step - 1e-9)),
             k1 = long(std::floor(a.hi / a.step + 1e-9));
  for (long k = k0; k <= k1 && t.size() < 50; ++k) t.push_back(double(k) * a.step);
  return t;
}

struct Series {
  const std::vector<PlotPoint>* pts;
  Rgb colour;
  std::string name;
  std::string last;  // the latest value, for the legend
};

struct Panel {
  std::string title;
  std::vector<Series> series;
  bool include_zero = false, percent = false;
  bool mark_labels = false;  // the marks' labels go at this panel's top
};

// The marks as dashed vertical lines between ptop and bottom (under the series), their labels
// just inside the panel's top where asked.
void draw_marks(Canvas& cv, const std::vector<PlotMark>& marks, int left, int right, int ptop,
                int bottom, bool labels, const std::function<double(double)>& X) {
  const Rgb colour = rgb(plot_colour::mark);
  for (const PlotMark& m : marks) {
    if (!std::isfinite(m.t)) continue;
    const int x = int(std::lround(X(m.t)));
    if (x <= left || x >= right) continue;
    for (int y = ptop + 1; y < bottom; y += 8)
      cv.fill(x, y, x, std::min(y + 3, bottom - 1), colour);
    if (labels) cv.text(x + 4, ptop + 4, m.label, kText, 1);
  }
}

void draw_panel(Canvas& cv, int top, int height, const Panel& p, const Axis& xa,
                const std::vector<PlotMark>& marks) {
  constexpr int kLeft = 104, kRightMargin = 28;
  const int left = kLeft, right = cv.w() - kRightMargin;
  const int ptop = top + 30, bottom = top + height - 34;
  cv.text(left, top + 6, p.title, kBlack, 2, true);

  std::vector<const std::vector<PlotPoint>*> pts;
  for (const Series& s : p.series) pts.push_back(s.pts);
  const Axis ya = value_axis(pts, p.include_zero, p.percent);
  auto X = [&](double t) { return left + (right - left) * (t - xa.lo) / (xa.hi - xa.lo); };
  auto Y = [&](double v) { return bottom - (bottom - ptop) * (v - ya.lo) / (ya.hi - ya.lo); };

  for (double v : ticks(ya)) {
    const int y = int(std::lround(Y(v)));
    if (y > ptop && y < bottom) cv.fill(left + 1, y, right - 1, y, kGrid);
    cv.fill(left - 6, y, left - 1, y, kText);
    const std::string s = tick_text(v, ya);
    cv.text(left - 10 - Canvas::text_width(s), y - 7, s, kText);
  }
  for (double t : ticks(xa)) {
    const int x = int(std::lround(X(t)));
    if (x > left && x < right) cv.fill(x, ptop + 1, x, bottom - 1, kGrid);
    cv.fill(x, bottom + 1, x, bottom + 6, kText);
    const std::string s = tick_text(t, xa);
    cv.text(x - Canvas::text_width(s) / 2, bottom + 10, s, kText);
  }
  cv.fill(left, ptop, right, ptop, kFrame);
  cv.fill(right, ptop, right, bottom, kFrame);
  cv.fill(left, bottom, right, bottom, kText);
  cv.fill(left, ptop, left, bottom, kText);
  draw_marks(cv, marks, left, right, ptop, bottom, p.mark_labels, X);

  // Legend, right-aligned on the title row: colour swatch, name, latest value.
  int lx = right;
  for (auto it = p.series.rbegin(); it != p.series.rend(); ++it) {
    const std::string label = it->last.empty() ? it->name : it->name + " " + it->last;
    lx -= Canvas::text_width(label) + 30;
    cv.fill(lx, top + 12, lx + 20, top + 14, it->colour);
    cv.text(lx + 26, top + 6, label, kText);
    lx -= 14;
  }

  bool any = false;
  cv.set_clip(left - 4, ptop - 4, right + 4, bottom + 4);
  for (const Series& s : p.series) {
    const double r = 1.3;  // line half-width
    const PlotPoint* prev = nullptr;
    size_t finite = 0;
    for (const PlotPoint& q : *s.pts) finite += std::isfinite(q.t) && std::isfinite(q.v);
    const bool markers = finite <= 40;  // sparse series (per-epoch eval) get dots
    for (const PlotPoint& q : *s.pts) {
      if (!std::isfinite(q.t) || !std::isfinite(q.v)) {
        prev = nullptr;  // a gap
        continue;
      }
      any = true;
      if (prev) cv.cover_segment(X(prev->t), Y(prev->v), X(q.t), Y(q.v), r);
      if (markers || !prev) cv.cover_segment(X(q.t), Y(q.v), X(q.t), Y(q.v), markers ? 3.5 : r);
      prev = &q;
    }
    cv.flush_coverage(s.colour);
  }
  if (!any) {
    const std::string msg = "no data yet";
    cv.text((left + right - Canvas::text_width(msg)) / 2, (ptop + bottom) / 2 - 7, msg, kMuted);
  }
}

std::string last_value(const std::vector<PlotPoint>& s, const char* format) {
  for (auto it = s.rbegin(); it != s.rend(); ++it)
    if (std::isfinite(it->v)) return fmt::format(fmt::runtime(format), it->v);
  return "";
}

void png_append(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
void png_no_flush(png_structp) {}

std::string encode_png(const Canvas& cv) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, &info);
    throw Error("cannot initialise the PNG encoder (out of memory?)");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error("PNG encoding of the training plot failed");
  }
  png_set_write_fn(png, &out, png_append, png_no_flush);
  png_set_IHDR(png, info, png_uint_32(cv.w()), png_uint_32(cv.h()), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < cv.h(); ++y) png_write_row(png, const_cast<png_bytep>(cv.row(y)));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

}  // namespace

std::string render_training_plot(const PlotData& d, int width, int height) {
  VIT_CHECK(
      width >= 300 && height >= 300 && width <= 10000 && height <= 10000,
      fmt::format("plot size {}x{} is out of range (300..10000 pixels a side)", width, height));
  Canvas cv(width, height);
  cv.text(20, 12, d.title.empty() ? std::string("Training curves") : d.title, kBlack, 2, true);

  // One time axis for all panels: 0 .. the latest time seen.
  double t0 = 0, t1 = 0;
  for (const auto* s : {&d.train_loss, &d.eval_loss, &d.eval_top1, &d.lr})
    for (const PlotPoint& p : *s)
      if (std::isfinite(p.t) && std::isfinite(p.v)) t0 = std::min(t0, p.t), t1 = std::max(t1, p.t);
  if (t1 <= t0) t1 = t0 + 1;
  const Axis xa = nice_axis(t0, t1, 6);

  const Panel panels[3] = {
      {"Loss",
       {{&d.train_loss, rgb(plot_colour::train_loss), "train", last_value(d.train_loss, "{:.4g}")},
        {&d.eval_loss, rgb(plot_colour::eval_loss), "eval", last_value(d.eval_loss, "{:.4g}")}},
       false,
       false,
       true},
      {"Eval top-1 accuracy (%)",
       {{&d.eval_top1, rgb(plot_colour::eval_top1), "top-1", last_value(d.eval_top1, "{:.2f}%")}},
       false,
       true},
      {"Learning rate",
       {{&d.lr, rgb(plot_colour::lr), "lr", last_value(d.lr, "{:.3e}")}},
       true,
       false},
  };
  const int header = 44, footer = 34;
  const int ph = (height - header - footer) / 3;
  for (int i = 0; i < 3; ++i) draw_panel(cv, header + i * ph, ph, panels[i], xa, d.marks);
  const std::string xlabel = "wall time (s)";
  cv.text((width - Canvas::text_width(xlabel)) / 2, height - footer + 8, xlabel, kBlack, 2, true);
  return encode_png(cv);
}

void write_training_plot(const std::string& png_path, const PlotData& data) {
  io::write_file_atomic(png_path, render_training_plot(data));
}

}  // namespace vit
