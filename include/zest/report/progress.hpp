// zest/report/progress.hpp — a progress line for rank 0 of a training job, and numbers
// formatted for humans.
//
//   zest::report::progress_line progress(total_steps);        // on stdout
//   for (...) progress.update(step, "loss 2.31  " + zest::report::format_count(tok_s) + " tok/s");
//   progress.finish();
//
// On a terminal, update() redraws one line in place:
//   [#########...........]   45/100  loss 2.31  12.3k tok/s
// cut to the terminal's width (asked at every update, so a resized window is followed;
// 100 columns when it cannot be asked). Anywhere else (a file, a pipe, a job log) every
// update() prints one plain line, "step 45/100  loss 2.31  12.3k tok/s", with no control
// characters; callers decide how often to call it. Control characters in the fields are
// printed as spaces in both cases. A total of 0 or less means "unknown": no bar.
//
// format_bytes(1572864) == "1.50 MiB", format_count(12345) == "12.3k",
// format_count(4.56e6) == "4.56M", format_duration(245) == "4m05s": three significant
// digits (see each function), independent of the C locale. format_number(2.31456) == "2.315"
// (a plain number to four significant digits). Every one of them spells a NaN "nan" and the
// infinities "inf" and "-inf", whatever the sign bit of the NaN.
#pragma once

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace zest::report {

namespace detail {

// Decimals that give |v| three significant digits (1.50, 15.0, 150; more digits above).
inline int three_digit_decimals(double v) {
  const double a = std::abs(v);
  return a < 9.995 ? 2 : a < 99.95 ? 1 : 0;
}

// |v| rounded to three significant digits (999.7 -> 1000).
inline double round_three_digits(double v) {
  const double scale = std::pow(10.0, three_digit_decimals(v));
  return std::round(std::abs(v) * scale) / scale;
}

// |v| with three significant digits: "1.50", "15.0", "150", "1000".
inline std::string three_digits(double v) {
  const double a = std::abs(v);
  const int decimals = three_digit_decimals(a);
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, a, std::chars_format::fixed, decimals).ptr;
  return std::string(buf, end);
}

// v scaled down by `base` until it is below `base` (after rounding to three digits), with
// the unit of that scale appended after `gap`.
inline std::string scaled(double v, double base, const char* const* units, int n_units,
                          const char* gap, bool integral_first_unit) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  const char* sign = v < 0 ? "-" : "";
  double a = std::abs(v);
  int u = 0;
  while (u + 1 < n_units) {
    // Would this unit print "1000" (or "1024")? Then move to the next one.
    const double shown = u == 0 && integral_first_unit ? std::round(a) : round_three_digits(a);
    if (shown < base) break;
    a /= base;
    ++u;
  }
  std::string digits =
      u == 0 && integral_first_unit ? std::to_string(std::llround(a)) : three_digits(a);
  return sign + digits + gap + units[u];
}

}  // namespace detail

// Bytes in binary units: "0 B", "512 B", "1.50 MiB", "12.3 GiB", "150 TiB".
inline std::string format_bytes(double bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return detail::scaled(bytes, 1024, units, 7, " ", true);
}

// A count with a metric suffix: "999", "12.3k", "4.56M", "1.20B", "3.00T"; below 1000,
// integers print whole and fractions with three digits ("2.50").
inline std::string format_count(double count) {
  static constexpr const char* units[] = {"", "k", "M", "B", "T", "Q"};
  const bool integral = std::isfinite(count) && count == std::trunc(count);
  if (integral && std::abs(count) < 1000) return std::to_string(std::llround(count));
  return detail::scaled(count, 1000, units, 6, "", false);
}

// A duration: "850 us", "12.3 ms", "5.07 s", "4m05s", "2h03m", "3d04h".
inline std::string format_duration(double seconds) {
  if (std::isnan(seconds)) return "nan";
  if (seconds < 0) return "-" + format_duration(-seconds);
  if (std::isinf(seconds)) return "inf";
  const auto two = [](long long v) { return (v < 10 ? "0" : "") + std::to_string(v); };
  if (seconds < 0.9995e-3) return detail::three_digits(seconds * 1e6) + " us";
  if (seconds < 0.9995) return detail::three_digits(seconds * 1e3) + " ms";
  if (seconds < 59.95) return detail::three_digits(seconds) + " s";
  const long long s = std::llround(seconds);
  if (s < 3600) return std::to_string(s / 60) + "m" + two(s % 60) + "s";
  const long long m = std::llround(seconds / 60);
  if (m < 24 * 60) return std::to_string(m / 60) + "h" + two(m % 60) + "m";
  const long long h = std::llround(seconds / 3600);
  return std::to_string(h / 24) + "d" + two(h % 24) + "h";
}

// A plain number, `significant` digits in the shortest of fixed and scientific form:
// "2.315", "0.0003", "1.235e+06", "nan", "inf", "-inf".
inline std::string format_number(double v, int significant = 4) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general,
                           std::clamp(significant, 1, 17))
                 .ptr;
  return std::string(buf, end);
}

// See the top of this header.
class progress_line {
 public:
  explicit progress_line(std::int64_t total_steps, std::FILE* out = stdout)
      : total_(total_steps), out_(out), terminal_(out != nullptr && ::isatty(::fileno(out)) == 1) {}
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  ~progress_line() { finish(); }

  bool on_terminal() const { return terminal_; }

  void update(std::int64_t step, std::string_view fields) {
    if (out_ == nullptr) return;
    std::string clean(fields);
    for (char& c : clean)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    std::string line;
    if (!terminal_) {
      line = "step " + counts(step, false);
      if (!clean.empty()) line += "  " + clean;
      line += '\n';
      std::fwrite(line.data(), 1, line.size(), out_);
      std::fflush(out_);
      return;
    }
    if (total_ > 0) line = bar(step) + "  ";
    line += counts(step, true);
    if (!clean.empty()) line += "  " + clean;
    // One column short of the width, so that the cursor never wraps to a new line.
    line = cut(line, std::max(1, columns() - 1));
    line = "\r" + line + "\x1b[K";
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fflush(out_);
    open_ = true;
  }

  // Ends the line (on a terminal, moves to the next line); further updates start anew.
  void finish() {
    if (out_ == nullptr) return;
    if (terminal_ && open_) std::fputc('\n', out_);
    open_ = false;
    std::fflush(out_);
  }

 private:
  static constexpr int bar_width = 20;

  std::string bar(std::int64_t step) const {
    const double f = std::clamp(static_cast<double>(step) / static_cast<double>(total_), 0.0, 1.0);
    const int filled = static_cast<int>(std::floor(f * bar_width + 1e-9));
    return "[" + std::string(static_cast<std::size_t>(filled), '#') +
           std::string(static_cast<std::size_t>(bar_width - filled), '.') + "]";
  }

  // "45/100" (the step right-aligned to the width of the total when `pad`), or "45".
  std::string counts(std::int64_t step, bool pad) const {
    std::string s = std::to_string(step);
    if (total_ <= 0) return s;
    const std::string t = std::to_string(total_);
    if (pad && s.size() < t.size()) s.insert(0, t.size() - s.size(), ' ');
    return s + "/" + t;
  }

  int columns() const {
    winsize ws{};
    if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 100;
  }

  // The first `width` characters of `s` (UTF-8 sequences are kept whole).
  static std::string cut(const std::string& s, int width) {
    int chars = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // continuation byte
      if (chars == width) return s.substr(0, i);
      ++chars;
    }
    return s;
  }

  std::int64_t total_;
  std::FILE* out_;
  bool terminal_;
  bool open_ = false;
};

}  // namespace zest::report
