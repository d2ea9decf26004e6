// zest/report/svg_plot.hpp — line plots of training curves as standalone SVG files.
//
//   zest::report::series train{"train", steps, losses};
//   zest::report::series lr{"learning rate", steps, rates, "", /*secondary_axis=*/true};
//   zest::report::plot_options o;
//   o.title = "loss, dp=2 tp=2";
//   o.y2_label = "lr";
//   o.reference_lines = {{"unigram entropy", 3.197}};
//   zest::write_text_file_atomically("loss.svg", zest::report::svg_line_plot({train, lr}, o));
//
// One polyline per series that has at least one finite point (a single point also gets a
// dot); points where x or y is NaN or infinite (or y <= 0 on a log axis) are skipped and
// the line joins their neighbours. Axes get "nice" ticks (steps of 1, 2 or 5 times a power
// of ten; decades on a log axis) and the range is widened to whole ticks. Series with
// secondary_axis use a second y axis on the right (always linear; log_y applies to the
// left axis). Reference lines are horizontal dashed lines on the left axis, labelled (at
// their left end) with their name and value, and included in its range. Colours default to a 10-colour
// palette in series order. All text is XML-escaped; all numbers are written
// independently of the C locale.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"

namespace zest::report {

struct series {
  std::string name;
  std::vector<double> x, y;
  std::string color = "";  // any SVG colour; "" picks the next palette colour
  bool secondary_axis = false;
};

struct plot_options {
  std::string title, x_label = "step", y_label = "loss", y2_label = "";
  int width = 720, height = 420;
  // Horizontal dashed lines on the left axis, e.g. {"unigram entropy", 3.197}.
  std::vector<std::pair<std::string, double>> reference_lines;
  bool log_y = false;
};

namespace detail {

// `s` with &, <, >, " and ' replaced by entities, and control characters other than tab
// and newline (not allowed in XML 1.0) by '?'.
inline std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

// A coordinate with two decimals ("12.5", "-3", "0.07").
inline std::string coord(double v) {
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 2).ptr;
  std::string s(buf, end);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

// A number for a human: shortest form with at most `digits` significant digits.
inline std::string short_number(double v, int digits = 4) {
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, digits).ptr;
  return std::string(buf, end);
}

// 1, 2 or 5 times a power of ten, close to range / target.
inline double nice_step(double range, int target) {
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double m = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return m * magnitude;
}

// `v` with `decimals` decimals: "0.25", "1000".
inline std::string fixed_label(double v, int decimals) {
  char buf[400];
  auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, decimals).ptr;
  return std::string(buf, end);
}

// `v` in scientific notation with a short exponent: "5.0e-5", "1.2e7", "0".
inline std::string scientific_label(double v, int decimals) {
  if (v == 0) return "0";
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific, decimals).ptr;
  std::string s(buf, end);
  const auto e = s.find('e');
  std::string exponent = s.substr(e + 1);  // "-05", "+07"
  const bool negative = exponent[0] == '-';
  exponent.erase(0, 1);
  while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
  return s.substr(0, e + 1) + (negative ? "-" : "") + exponent;
}

struct axis {
  double lo = 0, hi = 1;  // in axis units (log10 of the value on a log axis)
  bool log = false;
  std::vector<double> ticks;  // values (not logs)
  std::vector<std::string> labels;

  // The position in [0, 1] of value v along the axis.
  double fraction(double v) const {
    const double t = log ? std::log10(v) : v;
    return (t - lo) / (hi - lo);
  }
};

// A linear axis over [lo, hi] (finite; lo > hi when there are no data), widened to whole
// ticks.
inline axis linear_axis(double lo, double hi, int target) {
  axis a;
  if (!(lo <= hi)) {
    lo = 0;
    hi = 1;
  }
  if (lo == hi) {
    const double d = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= d;
    hi += d;
  }
  const double step = nice_step(hi - lo, target);
  const double first = std::floor(lo / step + 1e-9);
  const double last = std::ceil(hi / step - 1e-9);
  a.lo = first * step;
  a.hi = last * step;
  int decimals = 0;
  if (step < 1) decimals = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  const double biggest = std::max(std::abs(a.lo), std::abs(a.hi));
  const bool scientific = biggest >= 1e7 || (biggest < 1e-3 && biggest > 0);
  // Decimals of a scientific mantissa that tell the ticks apart: 1.5e-4 next to 5.0e-5.
  const int digits = std::clamp(static_cast<int>(std::floor(std::log10(biggest) + 1e-9) -
                                                 std::floor(std::log10(step) + 1e-9)),
                                0, 6);
  const double count = std::min(last - first, 100.0);  // 100: only reached when rounding fails
  for (double i = 0; i <= count + 0.5; ++i) {
    double t = (first + i) * step;
    if (std::abs(t) < step * 1e-6) t = 0;
    a.ticks.push_back(t);
    a.labels.push_back(scientific ? scientific_label(t, digits) : fixed_label(t, decimals));
  }
  return a;
}

// A log axis over [lo, hi] (positive values; lo > hi when there are no data), widened to
// whole decades; ticks at decades, and at 2 and 5 times them when there are few.
inline axis log_axis(double lo, double hi) {
  axis a;
  a.log = true;
  if (!(lo <= hi) || !(lo > 0)) {
    lo = 1;
    hi = 10;
  }
  double first = std::floor(std::log10(lo) + 1e-9);
  double last = std::ceil(std::log10(hi) - 1e-9);
  if (last <= first) last = first + 1;
  a.lo = first;
  a.hi = last;
  const double decades = last - first;
  const double every = std::max(1.0, std::ceil(decades / 8));
  for (double k = first; k <= last + 0.5; k += every) {
    const double base = std::pow(10.0, k);
    a.ticks.push_back(base);
    a.labels.push_back(short_number(base, 3));
    if (decades <= 2 && k + 0.5 < last) {
      for (double m : {2.0, 5.0}) {
        a.ticks.push_back(m * base);
        a.labels.push_back(short_number(m * base, 3));
      }
    }
  }
  return a;
}

inline const char* palette_color(std::size_t i) {
  static constexpr const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colors[i % 10];
}

}  // namespace detail

// The SVG document (a complete file, starting with the XML declaration) of `all` under
// `options`; see the top of this header. Throws zest::shape_error when a series has
// different numbers of x and y values, or the size is not positive.
inline std::string svg_line_plot(const std::vector<series>& all, const plot_options& options) {
  using detail::coord;
  using detail::xml_escape;
  if (options.width <= 0 || options.height <= 0)
    throw shape_error(zest::detail::message("zest: svg_line_plot: size ", options.width, "x",
                                            options.height, " is not positive"));
  for (const auto& s : all)
    if (s.x.size() != s.y.size())
      throw shape_error(zest::detail::message("zest: svg_line_plot: series \"", s.name, "\" has ",
                                              s.x.size(), " x values but ", s.y.size(),
                                              " y values"));

  const bool log_y = options.log_y;
  const auto usable = [&](const series& s, std::size_t i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) return false;
    return s.secondary_axis || !log_y || s.y[i] > 0;
  };
  bool has_secondary = false;
  double x_lo = HUGE_VAL, x_hi = -HUGE_VAL;
  double y_lo = HUGE_VAL, y_hi = -HUGE_VAL, y2_lo = HUGE_VAL, y2_hi = -HUGE_VAL;
  for (const auto& s : all) {
    has_secondary = has_secondary || s.secondary_axis;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s, i)) continue;
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      double& lo = s.secondary_axis ? y2_lo : y_lo;
      double& hi = s.secondary_axis ? y2_hi : y_hi;
      lo = std::min(lo, s.y[i]);
      hi = std::max(hi, s.y[i]);
    }
  }
  for (const auto& [name, y] : options.reference_lines) {
    if (!std::isfinite(y) || (log_y && y <= 0)) continue;
    y_lo = std::min(y_lo, y);
    y_hi = std::max(y_hi, y);
  }

  const double width = options.width, height = options.height;
  const double top = options.title.empty() ? 16 : 36, bottom = 46;
  const double plot_h = std::max(1.0, height - top - bottom);
  const int y_ticks = std::max(2, static_cast<int>(plot_h / 60));
  const detail::axis ya =
      log_y ? detail::log_axis(y_lo, y_hi) : detail::linear_axis(y_lo, y_hi, y_ticks);
  const detail::axis y2a = detail::linear_axis(y2_lo, y2_hi, y_ticks);
  // Margins wide enough for the tick labels (about 7 pixels a character) and axis labels.
  const auto label_width = [](const detail::axis& a) {
    std::size_t n = 0;
    for (const auto& l : a.labels) n = std::max(n, l.size());
    return 7.0 * static_cast<double>(n);
  };
  const double left = 34 + label_width(ya);
  const double right =
      has_secondary ? 16 + label_width(y2a) + (options.y2_label.empty() ? 0 : 18) : 20;
  const double plot_w = std::max(1.0, width - left - right);
  const int x_ticks = std::max(2, static_cast<int>(plot_w / 90));
  const detail::axis xa = detail::linear_axis(x_lo, x_hi, x_ticks);
  const auto px = [&](double x) { return left + xa.fraction(x) * plot_w; };
  const auto py = [&](const detail::axis& a, double y) {
    return top + plot_h - a.fraction(y) * plot_h;
  };

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + coord(width) + "\" height=\"" +
       coord(height) + "\" viewBox=\"0 0 " + coord(width) + " " + coord(height) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + coord(width) + "\" height=\"" + coord(height) +
       "\" fill=\"white\"/>\n";
  if (!options.title.empty())
    o += "<text x=\"" + coord(width / 2) +
         "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" +
         xml_escape(options.title) + "</text>\n";

  // Grid and tick labels.
  const std::string x0 = coord(left), x1 = coord(left + plot_w);
  const std::string y0 = coord(top), y1 = coord(top + plot_h);
  o += "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (double t : xa.ticks)
    o += "<line x1=\"" + coord(px(t)) + "\" y1=\"" + y0 + "\" x2=\"" + coord(px(t)) + "\" y2=\"" +
         y1 + "\"/>\n";
  for (double t : ya.ticks)
    o += "<line x1=\"" + x0 + "\" y1=\"" + coord(py(ya, t)) + "\" x2=\"" + x1 + "\" y2=\"" +
         coord(py(ya, t)) + "\"/>\n";
  o += "</g>\n";
  o += "<g fill=\"#333333\">\n";
  for (std::size_t i = 0; i < xa.ticks.size(); ++i)
    o += "<text x=\"" + coord(px(xa.ticks[i])) + "\" y=\"" + coord(top + plot_h + 16) +
         "\" text-anchor=\"middle\">" + xml_escape(xa.labels[i]) + "</text>\n";
  for (std::size_t i = 0; i < ya.ticks.size(); ++i)
    o += "<text x=\"" + coord(left - 6) + "\" y=\"" + coord(py(ya, ya.ticks[i]) + 4) +
         "\" text-anchor=\"end\">" + xml_escape(ya.labels[i]) + "</text>\n";
  if (has_secondary)
    for (std::size_t i = 0; i < y2a.ticks.size(); ++i)
      o += "<text x=\"" + coord(left + plot_w + 6) + "\" y=\"" + coord(py(y2a, y2a.ticks[i]) + 4) +
           "\" text-anchor=\"start\">" + xml_escape(y2a.labels[i]) + "</text>\n";
  o += "</g>\n";

  // Axes and their labels.
  o += "<rect x=\"" + x0 + "\" y=\"" + y0 + "\" width=\"" + coord(plot_w) + "\" height=\"" +
       coord(plot_h) + "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
  if (!options.x_label.empty())
    o += "<text x=\"" + coord(left + plot_w / 2) + "\" y=\"" + coord(height - 8) +
         "\" text-anchor=\"middle\">" + xml_escape(options.x_label) + "</text>\n";
  if (!options.y_label.empty()) {
    const std::string cy = coord(top + plot_h / 2);
    o += "<text x=\"16\" y=\"" + cy + "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " + cy +
         ")\">" + xml_escape(options.y_label) + "</text>\n";
  }
  if (has_secondary && !options.y2_label.empty()) {
    const std::string cx = coord(width - 12), cy = coord(top + plot_h / 2);
    o += "<text x=\"" + cx + "\" y=\"" + cy + "\" text-anchor=\"middle\" transform=\"rotate(90 " +
         cx + " " + cy + ")\">" + xml_escape(options.y2_label) + "</text>\n";
  }

  // Reference lines.
  for (const auto& [name, y] : options.reference_lines) {
    if (!std::isfinite(y) || (log_y && y <= 0)) continue;
    const std::string ry = coord(py(ya, y));
    o += "<line x1=\"" + x0 + "\" y1=\"" + ry + "\" x2=\"" + x1 + "\" y2=\"" + ry +
         "\" stroke=\"#555555\" stroke-width=\"1\" stroke-dasharray=\"6 4\"/>\n";
    o += "<text x=\"" + coord(left + 6) + "\" y=\"" + coord(py(ya, y) - 4) +
         "\" text-anchor=\"start\" fill=\"#555555\" font-size=\"11\">" +
         xml_escape(name + " " + detail::short_number(y)) + "</text>\n";
  }

  // The series.
  std::vector<std::string> colors;
  for (std::size_t k = 0; k < all.size(); ++k) {
    const series& s = all[k];
    colors.push_back(s.color.empty() ? detail::palette_color(k) : s.color);
    const detail::axis& a = s.secondary_axis ? y2a : ya;
    std::string points;
    std::size_t n = 0;
    double last_x = 0, last_y = 0;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s, i)) continue;
      last_x = px(s.x[i]);
      last_y = py(a, s.y[i]);
      if (n++ > 0) points += ' ';
      points += coord(last_x) + "," + coord(last_y);
    }
    if (n == 0) continue;
    const std::string color = xml_escape(colors.back());
    o += "<polyline fill=\"none\" stroke=\"" + color +
         "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"" + points + "\"/>\n";
    if (n == 1)
      o += "<circle cx=\"" + coord(last_x) + "\" cy=\"" + coord(last_y) + "\" r=\"2.5\" fill=\"" +
           color + "\"/>\n";
  }

  // Legend: top right inside the plot, one line per series.
  if (!all.empty()) {
    std::size_t longest = 0;
    std::vector<std::string> names;
    for (const auto& s : all) {
      names.push_back(s.name + (s.secondary_axis && has_secondary ? " (right axis)" : ""));
      longest = std::max(longest, names.back().size());
    }
    const double box_w = 34 + 6.5 * static_cast<double>(longest);
    const double box_h = 8 + 16 * static_cast<double>(all.size());
    const double bx = left + plot_w - box_w - 8, by = top + 8;
    o += "<g>\n<rect x=\"" + coord(bx) + "\" y=\"" + coord(by) + "\" width=\"" + coord(box_w) +
         "\" height=\"" + coord(box_h) +
         "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#cccccc\"/>\n";
    for (std::size_t k = 0; k < all.size(); ++k) {
      const double ly = by + 12 + 16 * static_cast<double>(k);
      o += "<line x1=\"" + coord(bx + 6) + "\" y1=\"" + coord(ly) + "\" x2=\"" + coord(bx + 24) +
           "\" y2=\"" + coord(ly) + "\" stroke=\"" + xml_escape(colors[k]) +
           "\" stroke-width=\"2\"/>\n";
      o += "<text x=\"" + coord(bx + 28) + "\" y=\"" + coord(ly + 4) + "\">" +
           xml_escape(names[k]) + "</text>\n";
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace zest::report
