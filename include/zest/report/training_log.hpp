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
// an integer "step" and a number "loss", whose steps strictly increase.
//
// Non-finite numbers (JSON has no spelling for NaN or infinity): a step record, a summary
// entry or a run setting may hold them, and the log writes each one as null and names it in
// the object's "nonfinite" member, its path mapped to "nan", "inf" or "-inf":
//   {"step": 8, "loss": 9.7, "grad_norm": null, "applied": false,
//    "nonfinite": {"grad_norm": "inf"}}
// (a nested value's path reads "a.b[2]"). "nonfinite" is therefore a reserved key: a record
// or an object of the log that already holds one must hold it in that form. Readers take
// the numbers back with training_log::number(record, "grad_norm"), which gives the NaN or
// the infinity again; a null that "nonfinite" does not name is an ordinary null.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
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

  // Run metadata: sets (or replaces) run[key]; non-finite numbers as above.
  void set(std::string key, json::value v) { set_member(run_, std::move(key), std::move(v)); }
  // Summary entries: sets (or replaces) summary[key]; non-finite numbers as above.
  void set_summary(std::string key, json::value v) {
    set_member(summary_, std::move(key), std::move(v));
  }

  // Appends one step's record; throws std::invalid_argument unless it is an object with an
  // integer "step" after the last logged one and a number "loss" (which may be NaN or
  // infinite: the record is stored with its non-finite numbers as null, named in
  // "nonfinite"), and any "nonfinite" it already has is of that form.
  void add_step(json::value record) {
    if (!record.is_object()) fail("a step record must be an object, not ", record.type_name());
    const json::value* step = record.find("step");
    if (step == nullptr || record.find("loss") == nullptr)
      fail("a step record needs \"step\" and \"loss\"; got ", json::dump(record));
    if (!step->is_integer()) fail("\"step\" must be an integer, not ", json::dump(*step));
    const std::int64_t at = step->as_int();
    encode_nonfinite(record, zest::detail::message("step ", at));
    const json::value& loss = std::as_const(record)["loss"];
    if (!loss.is_number() && !(loss.is_null() && nonfinite_spelling(record, "loss")))
      fail("step ", at, ": \"loss\" must be a number, not ", json::dump(loss));
    if (const auto last = last_step(); last && at <= *last)
      fail("step ", at, " is not after the last logged step ", *last,
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
  // The number `key` of a record (a step record, run() or summary()): the number itself, or
  // the NaN or infinity that the record's "nonfinite" names for it. Throws json::error when
  // the record has no such number.
  static double number(const json::value& record, std::string_view key) {
    const json::value* v = record.find(key);
    if (v != nullptr && v->is_number()) return v->as_number();
    if (v != nullptr && v->is_null()) {
      if (const std::string* s = nonfinite_spelling(record, key)) return nonfinite_value(*s);
    }
    throw json::error(zest::detail::message("zest: training_log::number: \"", key, "\" is ",
                                            v == nullptr ? "missing" : v->type_name(),
                                            ", not a number, in ", json::dump(record)));
  }

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
    encode_nonfinite(log.run_, "run");
    for (const auto& record : steps.as_array()) log.add_step(record);
    if (const json::value* summary = v.find("summary")) {
      if (!summary->is_object())
        throw json::error("zest: training_log: \"summary\" is not an object");
      log.summary_ = *summary;
      encode_nonfinite(log.summary_, "summary");
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

  static constexpr std::string_view nonfinite_key = "nonfinite";

  static const char* spelling_of(double d) {
    return std::isnan(d) ? "nan" : d < 0 ? "-inf" : "inf";
  }
  static double nonfinite_value(const std::string& s) {
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    return s == "-inf" ? -std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::infinity();
  }

  // What the object's "nonfinite" says of `path` ("nan", "inf", "-inf"), or nullptr.
  static const std::string* nonfinite_spelling(const json::value& object, std::string_view path) {
    const json::value* named = object.find(nonfinite_key);
    if (named == nullptr || !named->is_object()) return nullptr;
    const json::value* s = named->find(path);
    return s != nullptr && s->is_string() ? &s->as_string() : nullptr;
  }

  // Replaces each non-finite number below `v` with null, recording path -> spelling.
  static void collect_nonfinite(json::value& v, const std::string& path, json::object& found) {
    if (v.is_number() && !std::isfinite(v.as_number())) {
      found.emplace_back(path, spelling_of(v.as_number()));
      v = nullptr;
    } else if (v.is_array()) {
      for (std::size_t i = 0; i < v.size(); ++i)
        collect_nonfinite(v[i], zest::detail::message(path, "[", i, "]"), found);
    } else if (v.is_object()) {
      for (auto& [k, e] : v.as_object())
        collect_nonfinite(e, path.empty() ? k : path + "." + k, found);
    }
  }

  // The stored form of an object of the log (a step record, run, summary): its non-finite
  // numbers as null, named in its "nonfinite" member. A "nonfinite" already there must map
  // paths to "nan", "inf" or "-inf" (the form read back from a file); `where` names the
  // object in the message when it does not.
  static void encode_nonfinite(json::value& object, const std::string& where) {
    json::object found;
    json::value* named = nullptr;
    for (auto& [k, e] : object.as_object()) {
      if (k == nonfinite_key) {
        named = &e;
        continue;
      }
      collect_nonfinite(e, k, found);
    }
    if (named != nullptr) {
      if (!named->is_object())
        fail(where, ": \"nonfinite\" must be an object of paths, not ", json::dump(*named));
      for (const auto& [path, s] : std::as_const(*named).as_object()) {
        if (!s.is_string() ||
            (s.as_string() != "nan" && s.as_string() != "inf" && s.as_string() != "-inf"))
          fail(where, ": \"nonfinite\" maps \"", path, "\" to ", json::dump(s),
               "; it takes \"nan\", \"inf\" or \"-inf\"");
      }
    }
    if (found.empty()) return;
    if (named == nullptr) {
      object[std::string(nonfinite_key)] = json::object{};
      named = &object[std::string(nonfinite_key)];
    }
    for (auto& [path, s] : found) (*named)[path] = std::move(s);
  }

  // object[key] = v, stored as above (a replaced value's old "nonfinite" entries go).
  static void set_member(json::value& object, std::string key, json::value v) {
    if (key == nonfinite_key)
      throw std::invalid_argument(
          "zest: training_log: \"nonfinite\" is reserved (it names the log's non-finite numbers)");
    if (json::value* named = object.find(nonfinite_key)) {
      json::object kept;
      for (auto& [path, s] : named->as_object()) {
        const bool below =
            path == key || path.starts_with(key + ".") || path.starts_with(key + "[");
        if (!below) kept.emplace_back(path, std::move(s));
      }
      *named = std::move(kept);
    }
    object[std::move(key)] = std::move(v);
    encode_nonfinite(object, "training_log");
    if (const json::value* named = object.find(nonfinite_key); named && named->size() == 0) {
      auto& members = object.as_object();
      std::erase_if(members, [](const auto& m) { return m.first == nonfinite_key; });
    }
  }

  json::value run_ = json::object{};
  std::vector<json::value> steps_;
  json::value summary_ = json::object{};
};

}  // namespace zest::report
