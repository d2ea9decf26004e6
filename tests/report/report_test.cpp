// Reports: svg_line_plot is well-formed SVG with one polyline per series that has points;
// training_log round-trips through write/read and validates its steps; progress_line
// writes plain lines off a terminal; numbers are formatted for humans; files are replaced
// atomically.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/report/progress.hpp"
#include "zest/report/svg_plot.hpp"
#include "zest/report/training_log.hpp"

namespace fs = std::filesystem;
namespace json = zest::json;
namespace report = zest::report;

namespace {

std::size_t count(std::string_view s, std::string_view part) {
  std::size_t n = 0;
  for (auto at = s.find(part); at != std::string_view::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// A tiny XML check: every tag is closed in order, attribute values are quoted, text holds
// no raw '<' or '&' outside entities. Returns "" or what is wrong.
std::string xml_problem(std::string_view s) {
  std::vector<std::string> open;
  std::size_t i = 0;
  bool root_seen = false;
  while (i < s.size()) {
    if (s[i] == '&') {
      const auto semi = s.find(';', i);
      if (semi == std::string_view::npos || semi - i > 6) return "bare '&'";
      const auto entity = s.substr(i, semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;")
        return "unknown entity " + std::string(entity);
      i = semi + 1;
      continue;
    }
    if (s[i] == '>') return "bare '>' in text at " + std::to_string(i);
    if (s[i] != '<') {
      ++i;
      continue;
    }
    if (s.substr(i, 5) == "<?xml") {
      const auto end = s.find("?>", i);
      if (end == std::string_view::npos || i != 0) return "bad declaration";
      i = end + 2;
      continue;
    }
    // Scan the tag, honouring quotes.
    std::size_t j = i + 1;
    char quote = 0;
    for (; j < s.size(); ++j) {
      if (quote != 0) {
        if (s[j] == quote) quote = 0;
        if (s[j] == '<') return "'<' inside an attribute";
      } else if (s[j] == '"' || s[j] == '\'') {
        quote = s[j];
      } else if (s[j] == '>') {
        break;
      }
    }
    if (j >= s.size()) return "unterminated tag";
    std::string_view tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (!tag.empty() && tag.front() == '/') {
      const std::string name(tag.substr(1));
      if (open.empty() || open.back() != name) return "unbalanced </" + name + ">";
      open.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    const std::string name(tag.substr(0, tag.find_first_of(" \n\t/")));
    if (name.empty()) return "empty tag name";
    if (open.empty()) {
      if (root_seen) return "second root element";
      root_seen = true;
    }
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (!root_seen) return "no root element";
  return "";
}

fs::path temp_folder(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("zest_report_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

}  // namespace

TEST_CASE("the XML checker catches what it should") {
  CHECK(xml_problem("<svg><g></g></svg>").empty());
  CHECK(xml_problem("<svg><line x=\"1>2\"/></svg>").empty());
  CHECK(!xml_problem("<svg><g></svg>").empty());
  CHECK(!xml_problem("<svg><g>a & b</g></svg>").empty());
  CHECK(!xml_problem("<svg><text>a < b</text></svg>").empty());
  CHECK(!xml_problem("<svg/><svg/>").empty());
}

TEST_CASE("svg_line_plot: well-formed, one polyline per series with points") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<report::series> all;
  all.push_back({"train <loss> & \"more\"", {1, 2, 3, 4, 5}, {4.2, 3.9, nan, 3.1, 2.9}});
  all.push_back({"validation", {1, 3, 5}, {4.3, inf, 3.2}, "#000000"});
  all.push_back({"empty", {}, {}});
  all.push_back({"all NaN", {1, 2}, {nan, nan}});
  all.push_back({"lr", {1, 2, 3, 4, 5}, {1e-4, 3e-4, 3e-4, 2e-4, 1e-4}, "", true});
  report::plot_options o;
  o.title = "loss <dp=2, tp=2> & 'friends'";
  o.y2_label = "learning rate";
  o.reference_lines = {{"unigram entropy", 3.197}};

  const std::string svg = report::svg_line_plot(all, o);
  CHECK(xml_problem(svg) == "");
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(count(svg, "<svg ") == 1);
  CHECK(count(svg, "<polyline") == 3);
  CHECK(count(svg, "nan") == 0);
  CHECK(count(svg, "inf") == 0);
  CHECK(svg.find("loss &lt;dp=2, tp=2&gt; &amp; &apos;friends&apos;") != std::string::npos);
  CHECK(svg.find("train &lt;loss&gt; &amp; &quot;more&quot;") != std::string::npos);
  CHECK(svg.find("unigram entropy 3.197") != std::string::npos);
  CHECK(svg.find("stroke-dasharray") != std::string::npos);
  CHECK(svg.find("learning rate") != std::string::npos);
  CHECK(svg.find("(right axis)") != std::string::npos);
  // The first series skips its NaN: four points.
  const auto first = svg.find("<polyline");
  const auto points = svg.find("points=\"", first) + 8;
  const std::string_view pts(svg.data() + points, svg.find('"', points) - points);
  CHECK(count(pts, ",") == 4);
}

TEST_CASE("svg_line_plot: edge cases") {
  report::plot_options o;
  // nothing at all
  std::string svg = report::svg_line_plot({}, o);
  CHECK(xml_problem(svg) == "");
  CHECK(count(svg, "<polyline") == 0);
  // one point: a polyline and a dot; a constant series
  svg = report::svg_line_plot({{"one", {3}, {2.5}}, {"flat", {0, 1, 2}, {1, 1, 1}}}, o);
  CHECK(xml_problem(svg) == "");
  CHECK(count(svg, "<polyline") == 2);
  CHECK(count(svg, "<circle") == 1);
  // log axis: non-positive points skipped
  o.log_y = true;
  o.reference_lines = {{"zero", 0.0}, {"one", 1.0}};
  svg = report::svg_line_plot({{"loss", {1, 2, 3, 4}, {100, 0, 10, 0.5}}}, o);
  CHECK(xml_problem(svg) == "");
  CHECK(count(svg, "<polyline") == 1);
  CHECK(svg.find(">100<") != std::string::npos);  // decade ticks
  CHECK(svg.find(">0.1<") != std::string::npos);
  CHECK(svg.find("zero 0") == std::string::npos);  // cannot be drawn on a log axis
  // mismatched series
  CHECK_THROWS_AS(report::svg_line_plot({{"bad", {1, 2}, {1}}}, o), zest::shape_error);
}

TEST_CASE("svg_line_plot: nice ticks") {
  const auto a = report::detail::linear_axis(0.13, 9.7, 5);
  CHECK(a.lo == 0);
  CHECK(a.hi == 10);
  CHECK(a.labels == std::vector<std::string>{"0", "2", "4", "6", "8", "10"});
  const auto b = report::detail::linear_axis(2.93, 4.31, 5);
  CHECK(b.labels.front() == "2.8");
  CHECK(b.labels.back() == "4.4");
  const auto c = report::detail::linear_axis(0, 5000, 5);
  CHECK(c.labels == std::vector<std::string>{"0", "1000", "2000", "3000", "4000", "5000"});
  const auto d = report::detail::linear_axis(-0.35, 0.3, 4);
  CHECK(d.labels == std::vector<std::string>{"-0.4", "-0.2", "0.0", "0.2", "0.4"});
  CHECK(report::detail::nice_step(9, 5) == 2);
  CHECK(report::detail::nice_step(0.03, 6) == doctest::Approx(0.005));
  // steps of 1, 2 or 5 times a power of ten, whatever the range
  for (double range : {1e-6, 0.37, 3.0, 42.0, 999.0, 1.7e9}) {
    const double step = report::detail::nice_step(range, 5);
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    CHECK((std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 ||
           std::abs(mantissa - 5) < 1e-9));
  }
}

TEST_CASE("training_log: write/read round-trip and resuming") {
  const fs::path folder = temp_folder("log");
  report::training_log log;
  log.set("mesh", json::object{{"dp", 2}, {"tp", 2}});
  log.set("stage", "zero-2");
  log.set("config", json::object{{"lr", 3e-4}, {"layers", 2}});
  for (int step = 1; step <= 5; ++step)
    log.add_step(json::object{{"step", step}, {"loss", 4.0 - 0.25 * step}, {"tokens", step * 512}});
  log.set_summary("final_loss", 2.75);
  const fs::path path = folder / "sub" / "log.json";  // the folder is created
  log.write(path);

  const std::string text = zest::read_text_file(path);
  CHECK(text.find("\n  \"run\": {") != std::string::npos);  // indented
  CHECK(text.find("\"run\"") < text.find("\"steps\""));
  CHECK(text.find("\"steps\"") < text.find("\"summary\""));

  report::training_log back = report::training_log::read(path);
  CHECK(back.to_json() == log.to_json());
  CHECK(json::dump(back.to_json()) == json::dump(log.to_json()));
  CHECK(back.run()["stage"].as_string() == "zero-2");
  CHECK(back.steps().size() == 5);
  CHECK(back.last_step() == 5);
  CHECK(back.summary()["final_loss"].as_number() == 2.75);

  // Resuming from the checkpoint of step 3.
  CHECK_THROWS_AS(back.add_step(json::object{{"step", 4}, {"loss", 1.0}}), std::invalid_argument);
  back.drop_steps_after(3);
  CHECK(back.last_step() == 3);
  back.add_step(json::object{{"step", 4}, {"loss", 1.0}});
  back.set("resumed_from", 3);
  back.write(path);
  const report::training_log again = report::training_log::read(path);
  CHECK(again.steps().size() == 4);
  CHECK(again.steps().back()["loss"].as_number() == 1.0);
  CHECK(again.run()["resumed_from"].as_int() == 3);

  // Nothing is left behind but the log.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(folder / "sub")) {
    CHECK(e.path().filename() == "log.json");
    ++files;
  }
  CHECK(files == 1);
  fs::remove_all(folder);
}

TEST_CASE("training_log: invalid steps and files") {
  report::training_log log;
  CHECK_THROWS_AS(log.add_step(json::object{{"step", 1}}), std::invalid_argument);
  CHECK_THROWS_AS(log.add_step(json::object{{"loss", 1.0}}), std::invalid_argument);
  CHECK_THROWS_AS(log.add_step(json::array{1, 2}), std::invalid_argument);
  CHECK_THROWS_AS(log.add_step(json::object{{"step", 1.5}, {"loss", 1.0}}), std::invalid_argument);
  CHECK_THROWS_AS(log.add_step(json::object{{"step", 1}, {"loss", "low"}}), std::invalid_argument);
  try {
    log.add_step(json::object{{"step", 1}, {"loss", nullptr}});
    FAIL("a null loss that \"nonfinite\" does not name was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("\"loss\"") != std::string::npos);
  }
  // "nonfinite" is the log's: a record's own must be of its form.
  CHECK_THROWS_AS(log.add_step(json::object{{"step", 1}, {"loss", 1.0}, {"nonfinite", 3}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      log.add_step(json::object{
          {"step", 1}, {"loss", nullptr}, {"nonfinite", json::object{{"loss", "huge"}}}}),
      std::invalid_argument);
  CHECK_THROWS_AS(log.set("nonfinite", 1), std::invalid_argument);
  CHECK(log.steps().empty());
  log.add_step(json::object{{"step", 1}, {"loss", 1.0}});
  CHECK_THROWS_AS(log.add_step(json::object{{"step", 1}, {"loss", 1.0}}), std::invalid_argument);

  const fs::path folder = temp_folder("bad");
  CHECK_THROWS_AS(report::training_log::read(folder / "missing.json"), fs::filesystem_error);
  zest::write_text_file_atomically(folder / "bad.json", "{\"run\": {}, \"steps\": [1,]}");
  try {
    report::training_log::read(folder / "bad.json");
    FAIL("a malformed log was read");
  } catch (const json::error& e) {
    CHECK(std::string(e.what()).find("bad.json") != std::string::npos);
    CHECK(std::string(e.what()).find("line 1, column 25") != std::string::npos);
  }
  zest::write_text_file_atomically(folder / "other.json", "{\"steps\": []}");
  CHECK_THROWS_AS(report::training_log::read(folder / "other.json"), json::error);
  fs::remove_all(folder);
}

TEST_CASE("training_log: non-finite numbers are null, named in \"nonfinite\"") {
  const fs::path folder = temp_folder("nonfinite");
  const double inf = std::numeric_limits<double>::infinity();
  report::training_log log;
  log.add_step(json::object{{"step", 1}, {"loss", 4.5}, {"grad_norm", 2.0}});
  log.add_step(json::object{{"step", 2},
                            {"loss", 4.4},
                            {"grad_norm", inf},
                            {"applied", false},
                            {"per_expert", json::array{1.0, -inf, 3.0}}});
  log.add_step(json::object{{"step", 3}, {"loss", std::nan("")}, {"grad_norm", nullptr}});
  log.set("lr_bound", inf);
  log.set_summary("final_loss", std::nan(""));
  log.set_summary("final_loss", 4.25);  // replaced: its "nonfinite" entry goes with it
  const fs::path path = folder / "log.json";
  log.write(path);

  // The file is JSON (the strict parser reads it) with nulls where the numbers were.
  const json::value j = json::parse(zest::read_text_file(path));
  const json::value& skipped = j["steps"][1];
  CHECK(skipped["grad_norm"].is_null());
  CHECK(skipped["nonfinite"]["grad_norm"].as_string() == "inf");
  CHECK(skipped["per_expert"][1].is_null());
  CHECK(skipped["nonfinite"]["per_expert[1]"].as_string() == "-inf");
  CHECK(skipped["nonfinite"].size() == 2);
  CHECK(j["steps"][0].find("nonfinite") == nullptr);  // only where there is something to say
  CHECK(j["steps"][2]["loss"].is_null());
  CHECK(j["steps"][2]["nonfinite"]["loss"].as_string() == "nan");
  CHECK(j["steps"][2]["nonfinite"].find("grad_norm") == nullptr);  // an ordinary null
  CHECK(j["run"]["nonfinite"]["lr_bound"].as_string() == "inf");
  CHECK(j["summary"]["final_loss"].as_number() == 4.25);
  CHECK(j["summary"].find("nonfinite") == nullptr);

  // Read back, the numbers are what they were.
  const report::training_log back = report::training_log::read(path);
  CHECK(back.to_json() == log.to_json());
  using report::training_log;
  CHECK(training_log::number(back.steps()[0], "grad_norm") == 2.0);
  CHECK(training_log::number(back.steps()[1], "grad_norm") == inf);
  CHECK(std::isnan(training_log::number(back.steps()[2], "loss")));
  CHECK(training_log::number(back.run(), "lr_bound") == inf);
  CHECK_THROWS_AS(training_log::number(back.steps()[2], "grad_norm"), json::error);  // null
  CHECK_THROWS_AS(training_log::number(back.steps()[0], "lr"), json::error);         // missing
  fs::remove_all(folder);
}

TEST_CASE("format_number: plain numbers, and the non-finite ones spelt alike") {
  CHECK(report::format_number(2.31456) == "2.315");
  CHECK(report::format_number(0.0003) == "0.0003");
  CHECK(report::format_number(1234567.0) == "1.235e+06");
  CHECK(report::format_number(65536.0, 8) == "65536");
  CHECK(report::format_number(std::nan("")) == "nan");
  CHECK(report::format_number(-std::nan("")) == "nan");  // no "-nan"
  CHECK(report::format_number(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(report::format_number(-std::numeric_limits<double>::infinity()) == "-inf");
}

TEST_CASE("write_text_file_atomically replaces the whole file") {
  const fs::path folder = temp_folder("atomic");
  const fs::path p = folder / "a.txt";
  zest::write_text_file_atomically(p, "first version, longer than the second\n");
  zest::write_text_file_atomically(p, "second");
  CHECK(zest::read_text_file(p) == "second");
  zest::write_text_file_atomically(p, "");
  CHECK(zest::read_text_file(p).empty());
  CHECK_THROWS_AS(zest::write_text_file_atomically(folder, "x"), fs::filesystem_error);  // a folder
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(folder)) ++files;
  CHECK(files == 1);
  fs::remove_all(folder);
}

TEST_CASE("progress_line off a terminal writes plain lines") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    report::progress_line p(100, f);
    CHECK(!p.on_terminal());
    p.update(1, "loss 4.20");
    p.update(45, "loss 2.31\tline\nbreak \x1b[31m");
    p.update(100, "");
    p.finish();
  }
  const std::string out = read_all(f);
  std::fclose(f);
  CHECK(out == "step 1/100  loss 4.20\nstep 45/100  loss 2.31 line break  [31m\nstep 100/100\n");
  for (char c : out) CHECK((c == '\n' || static_cast<unsigned char>(c) >= 0x20));

  std::FILE* g = std::tmpfile();
  REQUIRE(g != nullptr);
  {
    report::progress_line p(0, g);  // unknown total
    p.update(7, "x");
  }
  CHECK(read_all(g) == "step 7  x\n");
  std::fclose(g);
}

TEST_CASE("numbers for humans") {
  CHECK(report::format_bytes(0) == "0 B");
  CHECK(report::format_bytes(512) == "512 B");
  CHECK(report::format_bytes(1023) == "1023 B");
  CHECK(report::format_bytes(1024) == "1.00 KiB");
  CHECK(report::format_bytes(1.5 * 1024 * 1024) == "1.50 MiB");
  CHECK(report::format_bytes(12.34 * 1024 * 1024 * 1024) == "12.3 GiB");
  CHECK(report::format_bytes(1024.0 * 1024 * 1024 - 1) == "1.00 GiB");
  CHECK(report::format_bytes(150.0 * (1ull << 40)) == "150 TiB");
  CHECK(report::format_bytes(-2048) == "-2.00 KiB");

  CHECK(report::format_count(0) == "0");
  CHECK(report::format_count(999) == "999");
  CHECK(report::format_count(2.5) == "2.50");
  CHECK(report::format_count(12345) == "12.3k");
  CHECK(report::format_count(4.56e6) == "4.56M");
  CHECK(report::format_count(999950) == "1.00M");
  CHECK(report::format_count(1.2e9) == "1.20B");
  CHECK(report::format_count(3e12) == "3.00T");
  CHECK(report::format_count(-1500) == "-1.50k");
  CHECK(report::format_count(std::nan("")) == "nan");

  CHECK(report::format_duration(0.00085) == "850 us");
  CHECK(report::format_duration(0.0123) == "12.3 ms");
  CHECK(report::format_duration(0.85) == "850 ms");
  CHECK(report::format_duration(5.07) == "5.07 s");
  CHECK(report::format_duration(59.99) == "1m00s");
  CHECK(report::format_duration(245) == "4m05s");
  CHECK(report::format_duration(2 * 3600 + 3 * 60 + 10) == "2h03m");
  CHECK(report::format_duration(3 * 86400 + 4 * 3600) == "3d04h");
  CHECK(report::format_duration(-5.07) == "-5.07 s");
}
