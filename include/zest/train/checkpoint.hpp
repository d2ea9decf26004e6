// zest/train/checkpoint.hpp — saving and resuming a ZeRO training run.
//
//   zest::save_training_state("ckpt", engine, step, config, data.identity());  // collective
//   auto info = zest::load_training_state("ckpt", engine, {.corpus = data.identity()});
//   info.step;                                                          // where it stopped
//
// Every parameter's stored copy, fp32 master (16-bit policies) and Adam moments, sharded as
// the engine's stage keeps them (zest/io/checkpoint.hpp: one file per rank and a manifest,
// saved atomically). Loading reshards: another number of ranks or another ZeRO stage reads
// the same checkpoint. The metadata carries the optimizer's step count, the loss scaler and
// the corpus identity (text_dataset::identity(): what the token ids mean). A load checks
// all of it before any tensor changes: a checkpoint of another corpus is refused, naming
// both identities, unless resume_options::allow_other_corpus says that is meant (say,
// fine-tuning on another text, accepting that the ids change meaning); given this run's
// config (resume_options::config), one that differs is refused naming the first differing
// field, unless resume_options::allow_other_config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/core/json.hpp"
#include "zest/core/source_site.hpp"
#include "zest/data/stream.hpp"
#include "zest/io/checkpoint.hpp"
#include "zest/zero/engine.hpp"

namespace zest {

template <class P>
std::vector<io::tensor_record> training_state_records(zero_engine<P>& engine) {
  std::vector<io::tensor_record> records;
  for (auto* p : engine.parameters()) {
    p->visit_states([&](io::tensor_record r) { records.push_back(std::move(r)); });
  }
  return records;
}

// What a load checks beyond the tensors.
struct resume_options {
  // This run's corpus identity (text_dataset::identity()); empty: not checked.
  std::string corpus = {};
  // Load a checkpoint whose corpus identity differs from `corpus` (or that records none).
  bool allow_other_corpus = false;
  // This run's config, as saved with save_training_state (the model's hyperparameters: what
  // the tensors' names and extents do not show, a RoPE base, an eps); null: not checked.
  // A saved config that differs in any field is refused, naming the first such field.
  json::value config = {};
  // Load a checkpoint whose config differs from `config` (say, fine-tuning with another
  // dropout): the caller has looked at the differences and means it.
  bool allow_other_config = false;
  // This run's data stream (stream_cursor::state(); the position is not compared): a
  // checkpoint of another stream (identity, global batch, sequence length), or of none, is
  // refused naming what differs, unless allow_other_data. Unset: not checked.
  std::optional<stream_state> data = std::nullopt;
  bool allow_other_data = false;
};

// The data stream's state a checkpoint records (saved with one), or nothing.
inline std::optional<stream_state> stream_state_of(const io::checkpoint_info& info) {
  const json::value* d = info.metadata.find("data");
  if (d == nullptr || !d->is_object()) return std::nullopt;
  const json::value* identity = d->find("identity");
  const json::value* rows = d->find("batch_size");
  const json::value* length = d->find("sequence_length");
  const json::value* position = d->find("position");
  const auto count = [](const json::value* v) {
    return v != nullptr && v->is_integer() && v->as_int() >= 0;
  };
  if (identity == nullptr || !identity->is_string() || !count(rows) || !count(length) ||
      !count(position)) {
    throw checkpoint_error(detail::message(
        "zest: stream_state_of: the checkpoint's metadata \"data\" is not a stream's state "
        "(identity, batch_size, sequence_length, position): ",
        json::dump(*d)));
  }
  return stream_state{identity->as_string(), static_cast<std::size_t>(rows->as_int()),
                      static_cast<std::size_t>(length->as_int()),
                      static_cast<std::uint64_t>(position->as_int())};
}

namespace detail {

// The first field in which two configs differ, as `field "a.b": saved X, this run Y`
// (members in the saved order, then this run's extra ones); empty when they are equal.
inline std::string config_difference(const json::value& saved, const json::value& now,
                                     const std::string& at = {}) {
  const auto name = [&](const std::string& key) { return at.empty() ? key : at + "." + key; };
  if (saved.is_object() && now.is_object()) {
    for (const auto& [key, value] : saved.as_object()) {
      const json::value* other = now.find(key);
      if (other == nullptr) {
        return message("field \"", name(key), "\": saved ", json::dump(value),
                       ", not in this run's config");
      }
      std::string d = config_difference(value, *other, name(key));
      if (!d.empty()) return d;
    }
    for (const auto& [key, value] : now.as_object()) {
      if (saved.find(key) == nullptr) {
        return message("field \"", name(key), "\": not in the saved config, this run ",
                       json::dump(value));
      }
    }
    return {};
  }
  if (saved == now) return {};
  return message("field \"", at.empty() ? std::string("(the config)") : at, "\": saved ",
                 json::dump(saved), ", this run ", json::dump(now));
}

}  // namespace detail

namespace detail {

// What save_training_state writes beside the tensors.
template <class P>
io::checkpoint_info training_state_info(zero_engine<P>& engine, std::int64_t step,
                                        json::value config, std::string corpus,
                                        const std::optional<stream_state>& data) {
  json::value meta = json::object{};
  meta["config"] = std::move(config);
  if (!corpus.empty()) meta["corpus"] = std::move(corpus);
  if (data) {
    json::value d = json::object{};
    d["identity"] = data->identity;
    d["batch_size"] = static_cast<std::int64_t>(data->batch_size);
    d["sequence_length"] = static_cast<std::int64_t>(data->sequence_length);
    d["position"] = static_cast<std::int64_t>(data->position);
    meta["data"] = std::move(d);
  }
  meta["zero_stage"] = static_cast<std::int64_t>(P::stage::stage);
  meta["precision"] = std::string(name_of(dtype_of<typename P::param_type>()));
  meta["optimizer_steps"] = engine.steps_taken();
  const auto s = engine.loss_scaler().state();
  json::value scaler = json::object{};
  scaler["scale"] = static_cast<double>(s.scale);
  scaler["good_steps"] = static_cast<std::int64_t>(s.good_steps);
  scaler["skipped_steps"] = static_cast<std::int64_t>(s.skipped_steps);
  meta["loss_scaler"] = std::move(scaler);
  io::checkpoint_info info;
  info.step = step;
  info.metadata = std::move(meta);
  return info;
}

}  // namespace detail

// `config` is saved as metadata["config"] (e.g. the model's options) for the caller to
// compare on load; `corpus` (text_dataset::identity()) as metadata["corpus"].
template <class P>
void save_training_state(const std::filesystem::path& dir, zero_engine<P>& engine,
                         std::int64_t step, json::value config = {}, std::string corpus = {},
                         std::optional<stream_state> data = std::nullopt,
                         source_site at = source_site::current()) {
  const user_call user(at);
  engine.release_states();  // an asynchronous save still reading them finishes first
  const auto records = training_state_records(engine);
  io::save_checkpoint(
      dir, engine.mesh(), std::span<const io::tensor_record>(records),
      detail::training_state_info(engine, step, std::move(config), std::move(corpus), data), at);
}

// Collective: save_training_state with the shards written beside the training, on a thread
// of each rank (io::save_checkpoint_async): it returns once the ranks agreed and drew the
// save's generation; the engine's next step waits, before it updates the states, until this
// rank's shard is on disk (zero_engine::hold_states), so training goes on through the
// forward and backward meanwhile. The result's start_commit() and wait() (collective)
// commit the checkpoint (see io::save_checkpoint_async): wait() before the run ends and
// before the next save into the folder starts its commit. The engine must outlive the
// result.
template <class P>
[[nodiscard]] io::pending_save save_training_state_async(
    const std::filesystem::path& dir, zero_engine<P>& engine, std::int64_t step,
    json::value config = {}, std::string corpus = {},
    std::optional<stream_state> data = std::nullopt, source_site at = source_site::current()) {
  const user_call user(at);
  engine.release_states();
  const auto records = training_state_records(engine);
  io::pending_save pending = io::save_checkpoint_async(
      dir, engine.mesh(), std::span<const io::tensor_record>(records),
      detail::training_state_info(engine, step, std::move(config), std::move(corpus), data), at);
  engine.hold_states(pending.written_fence());
  return pending;
}

// Collective: loads what save_training_state saved, on any rank count and stage. The
// metadata (optimizer steps, loss scaler, corpus) is checked on every rank before any data
// is read; on any failure every rank throws checkpoint_error and nothing changes.
template <class P>
io::checkpoint_info load_training_state(const std::filesystem::path& dir, zero_engine<P>& engine,
                                        const resume_options& options = {},
                                        source_site at = source_site::current()) {
  const user_call user(at);
  constexpr std::string_view op = "load_training_state";
  engine.release_states();  // an asynchronous save still reading them finishes first
  const auto records = training_state_records(engine);
  std::int64_t steps = engine.steps_taken();
  auto scaler = engine.loss_scaler().state();
  // The config (load_checkpoint runs `accept` before it matches the tensors: a model that
  // differs in width or layers is refused by the field that says why, not by an extent).
  const auto check_config = [&](const json::value& meta) {
    if (options.config.is_null() || options.allow_other_config) return;
    const json::value* saved = meta.find("config");
    if (saved == nullptr || saved->is_null()) {
      throw checkpoint_error(
          detail::message("zest: ", op, ": ", dir,
                          ": the checkpoint records no config (saved without one), "
                          "this run's is ",
                          json::dump(options.config),
                          "; set resume_options::allow_other_config to load it anyway"));
    }
    const std::string d = detail::config_difference(*saved, options.config);
    if (!d.empty()) {
      throw checkpoint_error(detail::message(
          "zest: ", op, ": ", dir, ": the checkpoint's config differs from this run's in ", d,
          "; load a checkpoint of this model, or set resume_options::allow_other_config to "
          "load it anyway"));
    }
  };
  auto accept = [&](const io::checkpoint_info& info) {
    const json::value& meta = info.metadata;
    auto bad = [&](std::string_view field, std::string_view why) {
      throw checkpoint_error(
          detail::message("zest: ", op, ": ", dir, ": metadata \"", field, "\" ", why));
    };
    if (!options.corpus.empty() && !options.allow_other_corpus) {
      const json::value* saved = meta.find("corpus");
      if (saved == nullptr || !saved->is_string()) {
        bad("corpus", detail::message("is missing: the checkpoint does not say which corpus it "
                                      "was trained on (this run's is ",
                                      options.corpus,
                                      "); set resume_options::allow_other_corpus to load it"));
      }
      if (saved->as_string() != options.corpus) {
        throw checkpoint_error(detail::message(
            "zest: ", op, ": ", dir, ": the checkpoint was trained on corpus ", saved->as_string(),
            ", this run's corpus is ", options.corpus,
            ": their byte-to-id mappings differ, so token ids would mean other characters; "
            "resume with the corpus it was trained on, or set "
            "resume_options::allow_other_corpus to load it anyway"));
      }
    }
    check_config(meta);
    if (options.data && !options.allow_other_data) {
      const std::optional<stream_state> saved = stream_state_of(info);
      if (!saved) {
        throw checkpoint_error(detail::message(
            "zest: ", op, ": ", dir,
            ": the checkpoint records no data stream (saved without one), this run's is \"",
            options.data->identity,
            "\"; set resume_options::allow_other_data to load it and start the stream anew"));
      }
      if (const std::string d = stream_difference(*saved, *options.data); !d.empty()) {
        throw checkpoint_error(detail::message(
            "zest: ", op, ": ", dir, ": the checkpoint's data stream differs from this run's (", d,
            "): resuming would skip or repeat data; resume with the same stream, or set "
            "resume_options::allow_other_data to continue this one at the saved position ",
            saved->position));
      }
    }
    if (const json::value* n = meta.find("optimizer_steps")) {
      if (!n->is_integer() || n->as_int() < 0) bad("optimizer_steps", "is not a count");
      steps = n->as_int();
    }
    if (const json::value* s = meta.find("loss_scaler")) {
      const json::value* scale = s->find("scale");
      const json::value* good = s->find("good_steps");
      const json::value* skipped = s->find("skipped_steps");
      if (scale == nullptr || !scale->is_number() || good == nullptr || !good->is_integer() ||
          skipped == nullptr || !skipped->is_integer()) {
        bad("loss_scaler",
            "needs a number \"scale\" and integers \"good_steps\", "
            "\"skipped_steps\"");
      }
      scaler.scale = static_cast<float>(scale->as_number());
      scaler.good_steps = good->as_int();
      scaler.skipped_steps = skipped->as_int();
      try {
        dynamic_loss_scaler trial = engine.loss_scaler();
        trial.restore(scaler);
      } catch (const shape_error& e) {
        bad("loss_scaler", detail::message("does not fit this run's scaler: ", e.what()));
      }
    }
  };
  io::checkpoint_info info =
      io::load_checkpoint(dir, engine.mesh(), std::span<const io::tensor_record>(records), accept);
  engine.set_steps_taken(steps);
  engine.loss_scaler().restore(scaler);
  return info;
}

}  // namespace zest
