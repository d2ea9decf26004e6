// zest/report/training_log.hpp — a training run's JSON log: metadata, one record per step,
// a summary.
//
//   zest::report::training_log log;
//   log.set("mesh", "dp=2,tp=2");
//   log.set("config", config_json);
//   log.add_step(zest::json::object{{"step", 1}, {"loss", 4.21}, {"lr", 3e-4}});
//   log.set_summary("final_loss", 1.93);
//   log.write("runs/a/log.json");               // atomic, indented
//
//   // Resuming from the checkpoint of step 500: steps the crashed run logged after it
//   // are dropped, and the log goes on from there.
//   auto log = zest::report::training_log::read("runs/a/log.json");
//   log.drop_steps_after(500);
//
// The file is {"run": {...}, "steps": [{...}, ...], "summary": {...}}, in that order; keys
// keep the order in which they were first set. Each step record is an object with at least
// an integer "step" and a number "loss", whose steps strictly increase, and whose numbers
// are all finite (JSON has no NaN: a diverged loss throws at add_step, where it happens,
// rather than when the log is written).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"

namespace zest::report {

class training_log {
 public:
  training_log() = default;

  // Run metadata: sets (or replaces) run[key].
  void set(std::string key, json::value v) { run_[std::move(key)] = std::move(v); }
  // Summary entries: sets (or replaces) summary[key].
  void set_summary(std::string key, json::value v) { summary_[std::move(key)] = std::move(v); }

  // Appends one step's record; throws std::invalid_argument unless it is an object with an
  // integer "step" after the last logged one, a number "loss", and only finite numbers.
  void add_step(json::value record) {
    if (!record.is_object()) fail("a step record must be an object, not ", record.type_name());
    const json::value* step = record.find("step");
    const json::value* loss = record.find("loss");
    if (step == nullptr || loss == nullptr)
      fail("a step record needs \"step\" and \"loss\"; got ", json::dump(record));
    if (!step->is_integer()) fail("\"step\" must be an integer, not ", json::dump(*step));
    if (!loss->is_number()) fail("\"loss\" must be a number, not ", json::dump(*loss));
    check_finite(record, "", step->as_int());
    if (const auto last = last_step(); last && step->as_int() <= *last)
      fail("step ", step->as_int(), " is not after the last logged step ", *last,
           " (resuming from a checkpoint? call drop_steps_after(<its step>) first)");
    steps_.push_back(std::move(record));
  }

  // Removes the records of steps after `step` (those a resumed run will redo).
  void drop_steps_after(std::int64_t step) {
    while (!steps_.empty() && std::as_const(steps_.back())["step"].as_int() > step)
      steps_.pop_back();
  }

  const json::value& run() const { return run_; }  // an object (empty at first)
  const std::vector<json::value>& steps() const { return steps_; }
  const json::value& summary() const { return summary_; }  // an object (empty at first)
  std::optional<std::int64_t> last_step() const {
    if (steps_.empty()) return std::nullopt;
    return steps_.back()["step"].as_int();
  }

  json::value to_json() const {
    return json::object{{"run", run_}, {"steps", json::array(steps_)}, {"summary", summary_}};
  }
  // Reads back what to_json() made; throws json::error when it is not such a log (and
  // std::invalid_argument when a step record is not valid).
  static training_log from_json(const json::value& v) {
    training_log log;
    const json::value& run = v["run"];
    const json::value& steps = v["steps"];
    if (!run.is_object()) throw json::error("zest: training_log: \"run\" is not an object");
    if (!steps.is_array()) throw json::error("zest: training_log: \"steps\" is not an array");
    log.run_ = run;
    for (const auto& record : steps.as_array()) log.add_step(record);
    if (const json::value* summary = v.find("summary")) {
      if (!summary->is_object())
        throw json::error("zest: training_log: \"summary\" is not an object");
      log.summary_ = *summary;
    }
    return log;
  }

  // Writes the log to `path` atomically (a reader sees the old file or the whole new one),
  // indented by 2.
  void write(const std::filesystem::path& path) const {
    write_text_file_atomically(path, json::dump(to_json(), 2) + "\n");
  }
  // The log written to `path`; throws std::filesystem::filesystem_error when it cannot be
  // read and json::error (naming the file) when it is not a training log.
  static training_log read(const std::filesystem::path& path) {
    const std::string text = read_text_file(path);
    try {
      return from_json(json::parse(text));
    } catch (const json::error& e) {
      throw json::error(
          zest::detail::message("zest: training_log::read: ", path.string(), ": ", e.what()));
    } catch (const std::invalid_argument& e) {
      throw json::error(
          zest::detail::message("zest: training_log::read: ", path.string(), ": ", e.what()));
    }
  }

 private:
  template <class... Parts>
  [[noreturn]] static void fail(Parts&&... parts) {
    throw std::invalid_argument(
        zest::detail::message("zest: training_log::add_step: ", std::forward<Parts>(parts)...));
  }

  static void check_finite(const json::value& v, const std::string& where, std::int64_t step) {
    if (v.is_number() && !std::isfinite(v.as_number()))
      fail("step ", step, ": \"", where, "\" is ", v.as_number(),
           " (JSON cannot hold a non-finite number)");
    if (v.is_array()) {
      for (std::size_t i = 0; i < v.size(); ++i)
        check_finite(v[i], zest::detail::message(where, "[", i, "]"), step);
    } else if (v.is_object()) {
      for (const auto& [k, e] : v.as_object())
        check_finite(e, where.empty() ? k : where + "." + k, step);
    }
  }

  json::value run_ = json::object{};
  std::vector<json::value> steps_;
  json::value summary_ = json::object{};
};

}  // namespace zest::report
