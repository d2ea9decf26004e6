// zest/train/weights.hpp — a model's weights out of zest and into it, as safetensors files
// that other frameworks read and write.
//
//   zest::io::export_safetensors(model, "out/");     // out/model.safetensors + out/config.json
//   zest::io::import_safetensors(model, "gpt2/model.safetensors");   // any ranks, stage, tp
//
// A model that says where its parameters lie in a file (`weight_map_of(model)`, an
// io::weight_map, and `model.engine()`): zest::gpt with Hugging Face GPT-2's names, the Llama
// example with Hugging Face Llama's. For any other model, or one with experts, the engine's
// own names (io::own_weight_map) write every parameter whole under its zest name.
//
// Export writes each parameter's stored copy in its element type (a bf16 run writes BF16),
// gathered to rank 0 (zest/io/safetensors.hpp). Import sets the stored copy and, where the
// policy keeps one, the fp32 master from the file's values; Adam's moments, the step count
// and the loss scaler stay the engine's (a fresh engine's: zeros), so an import starts a
// run (fine-tuning, evaluation) rather than resuming one: resuming is
// load_training_state's (zest/train/checkpoint.hpp). A path that is a folder (it exists, or
// ends in '/') means folder/model.safetensors, and an export writes the map's config beside
// it as config.json, so that Hugging Face's from_pretrained(folder) reads the two.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/core/source_site.hpp"
#include "zest/io/detail/rank_agreement.hpp"
#include "zest/io/safetensors.hpp"
#include "zest/io/tensor_record.hpp"
#include "zest/zero/engine.hpp"

namespace zest::io {

// The records of the engine's parameters: each stored copy under the parameter's name, and
// with `masters` each fp32 master too, under the same name (what an import fills).
template <class P>
std::vector<tensor_record> weight_records(zero_engine<P>& engine, bool masters) {
  std::vector<tensor_record> out;
  for (auto* p : engine.parameters()) {
    const std::string& name = p->name();
    p->visit_states([&](tensor_record r) {
      if (r.name == name) {
        out.push_back(std::move(r));
      } else if (masters && r.name == name + ".master") {
        r.name = name;
        out.push_back(std::move(r));
      }
    });
  }
  return out;
}

// Every parameter of the engine whole, under its zest name ("h0.attn.q.weight").
template <class P>
weight_map own_weight_map(zero_engine<P>& engine) {
  weight_map m;
  m.convention = "zest's own names";
  for (const auto& r : weight_records(engine, false)) {
    m.tensors.push_back(whole_tensor(r.name, r.name, r.global_extents));
  }
  return m;
}

// A model that says where its parameters lie in a file: `weight_map_of(model)`, found by
// argument-dependent lookup (zest/nn/gpt_weights.hpp has zest::gpt's), and its engine.
template <class Model>
concept weight_mapped_model = requires(Model& model) {
  model.engine();
  { weight_map_of(std::as_const(model)) } -> std::convertible_to<weight_map>;
};

namespace detail {

inline bool names_folder(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) || !path.has_filename();
}

// Collective: rank 0's reading of names_folder, on every rank (it decides which collectives
// follow).
template <class Comm>
bool agreed_folder(Comm& world, const std::filesystem::path& path) {
  std::array<std::int64_t, 1> folder{world.rank() == 0 && names_folder(path) ? 1 : 0};
  world.template broadcast<std::int64_t>(std::span<std::int64_t>(folder), 0);
  return folder[0] != 0;
}

}  // namespace detail

// Collective: writes the engine's weights as `map` names them (see the top of this header).
template <class P>
void export_safetensors(zero_engine<P>& engine, const weight_map& map,
                        const std::filesystem::path& path,
                        source_site at = source_site::current()) {
  const user_call user(at);
  const bool folder = detail::agreed_folder(engine.mesh().world(), path);
  const std::filesystem::path file = folder ? path / "model.safetensors" : path;
  const auto records = weight_records(engine, false);
  save_safetensors(file, engine.mesh(), std::span<const tensor_record>(records), map);
  if (!folder || map.config.is_null()) return;
  auto& world = engine.mesh().world();
  detail::agree(world, detail::attempt("export_safetensors", [&] {
                  if (world.rank() == 0) {
                    write_text_file_atomically(path / "config.json",
                                               json::dump(map.config, 2) + "\n");
                  }
                }));
}

// Collective: sets the engine's weights from the file (see the top of this header).
template <class P>
void import_safetensors(zero_engine<P>& engine, const weight_map& map,
                        const std::filesystem::path& path, const load_options& options = {},
                        source_site at = source_site::current()) {
  const user_call user(at);
  const std::filesystem::path file =
      detail::agreed_folder(engine.mesh().world(), path) ? path / "model.safetensors" : path;
  engine.release_states();  // an asynchronous save still reading them finishes first
  const auto records = weight_records(engine, true);
  load_safetensors(file, engine.mesh(), std::span<const tensor_record>(records), map, options);
}

template <weight_mapped_model Model>
void export_safetensors(Model& model, const std::filesystem::path& path,
                        source_site at = source_site::current()) {
  export_safetensors(model.engine(), weight_map_of(std::as_const(model)), path, at);
}

template <weight_mapped_model Model>
void import_safetensors(Model& model, const std::filesystem::path& path,
                        const load_options& options = {}, source_site at = source_site::current()) {
  import_safetensors(model.engine(), weight_map_of(std::as_const(model)), path, options, at);
}

}  // namespace zest::io
