// zest/train/checkpoint.hpp — saving and resuming a ZeRO training run.
//
//   zest::save_training_state("ckpt", engine, step, config);     // collective
//   auto info = zest::load_training_state("ckpt", engine);       // collective; info.step
//
// Every parameter's stored copy, fp32 master (16-bit policies) and Adam moments, sharded as
// the engine's stage keeps them (zest/io/checkpoint.hpp writes one file per rank and a
// manifest). Loading reshards: another number of ranks or another ZeRO stage reads the
// same checkpoint. The metadata carries the optimizer's step count and the loss scaler.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/core/json.hpp"
#include "zest/io/checkpoint.hpp"
#include "zest/zero/engine.hpp"

namespace zest {

template <class P>
std::vector<io::tensor_record> training_state_records(zero_engine<P>& engine) {
  std::vector<io::tensor_record> records;
  for (auto* p : engine.parameters()) p->checkpoint_records(records);
  return records;
}

// `config` is saved as metadata["config"] (e.g. the model's options) for the caller to
// compare on load.
template <class P>
void save_training_state(const std::filesystem::path& dir, zero_engine<P>& engine,
                         std::int64_t step, json::value config = {}) {
  json::value meta = json::object{};
  meta["config"] = std::move(config);
  meta["zero_stage"] = static_cast<std::int64_t>(P::stage::stage);
  meta["precision"] = std::string(name_of(dtype_of<typename P::param_type>()));
  meta["optimizer_steps"] = engine.steps_taken();
  const auto s = engine.loss_scaler().state();
  json::value scaler = json::object{};
  scaler["scale"] = static_cast<double>(s.scale);
  scaler["good_steps"] = static_cast<std::int64_t>(s.good_steps);
  scaler["skipped_steps"] = static_cast<std::int64_t>(s.skipped_steps);
  meta["loss_scaler"] = std::move(scaler);
  const auto records = training_state_records(engine);
  io::checkpoint_info info;
  info.step = step;
  info.metadata = std::move(meta);
  io::save_checkpoint(dir, engine.mesh(), std::span<const io::tensor_record>(records), info);
}

template <class P>
io::checkpoint_info load_training_state(const std::filesystem::path& dir, zero_engine<P>& engine) {
  const auto records = training_state_records(engine);
  io::checkpoint_info info =
      io::load_checkpoint(dir, engine.mesh(), std::span<const io::tensor_record>(records));
  const json::value& meta = info.metadata;
  if (const json::value* n = meta.find("optimizer_steps")) engine.set_steps_taken(n->as_int());
  if (const json::value* s = meta.find("loss_scaler")) {
    auto st = engine.loss_scaler().state();
    st.scale = static_cast<float>((*s)["scale"].as_number());
    st.good_steps = (*s)["good_steps"].as_int();
    st.skipped_steps = (*s)["skipped_steps"].as_int();
    engine.loss_scaler().restore(st);
  }
  return info;
}

}  // namespace zest
