// The zest side of tests/io/hf_weights_check.py: a GPT (zest::gpt) or a Llama-style decoder
// (examples/llama.hpp) under ZeRO-3 on a dp x tp mesh of every rank, which
//   --import F    starts from the weights of F (a safetensors file or a folder with one),
//   --steps N     trains N steps on the default corpus,
//   --export F    writes its weights (Hugging Face's names; a folder: with config.json),
//   --logits F    writes the logits of one batch as a safetensors file ("ids" I64 [b, t],
//                 "logits" F32 [b, t, v]): of --ids F's "ids" when given, else of a batch
//                 of the corpus.
// Model flags: --arch gpt|llama --tp N --vocab --context --width --layers --heads
// --kv-heads --hidden --tied (llama) --batch.
#include <mpi.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "llama.hpp"
#include "zest/comm/mpi_environment.hpp"
#include "zest/core/files.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/io/safetensors.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/nn/gpt_weights.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/train/train_step.hpp"
#include "zest/train/weights.hpp"

namespace {

using mesh_t = zest::mesh<"dp", "tp">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<3>, float>;
using ids_t = zest::tensor<std::int32_t, mesh_t, "bt", zest::layout<zest::split<'b', "dp">>>;

struct settings {
  std::string arch = "gpt", import_from, export_to, logits, ids;
  int tp = 1;
  std::int64_t steps = 0;
  std::size_t vocab = 96, context = 16, width = 32, layers = 2, heads = 4, kv_heads = 2, hidden = 0,
              batch = 4;
  bool tied = false;
};

// The "ids" tensor of a safetensors file (I64 [b, t]), read whole.
std::vector<std::int64_t> read_ids(const std::string& file, std::size_t& b, std::size_t& t) {
  const auto header = zest::io::read_safetensors_header(file);
  const auto* e = header.find("ids");
  if (e == nullptr || e->dtype != "I64" || e->shape.size() != 2)
    throw std::runtime_error(file + ": no I64 [b, t] tensor \"ids\"");
  b = e->shape[0];
  t = e->shape[1];
  std::vector<std::int64_t> ids(b * t);
  const zest::io::detail::input_file in(file, "read_ids");
  in.read_at(header.data_start + e->begin,
             std::as_writable_bytes(std::span(ids.data(), ids.size())));
  return ids;
}

// ids I64 and logits F32 as one safetensors file (rank 0).
void write_logits(const std::string& file, const std::vector<std::int64_t>& ids,
                  const std::vector<float>& logits, std::size_t b, std::size_t t, std::size_t v) {
  const std::uint64_t id_bytes = ids.size() * sizeof(std::int64_t);
  const std::vector<zest::io::safetensors_entry> entries{
      {"ids", "I64", {b, t}, 0, id_bytes},
      {"logits", "F32", {b, t, v}, id_bytes, id_bytes + logits.size() * sizeof(float)}};
  zest::atomic_file_writer out(file, "write_logits");
  zest::io::detail::write_safetensors_header(out, entries, {});
  out.write(std::as_bytes(std::span(ids.data(), ids.size())));
  out.write(std::as_bytes(std::span(logits.data(), logits.size())));
  out.commit();
}

template <class Model, class Options>
void run(const settings& s, const mesh_t& mesh, const Options& options) {
  zest::zero_engine<policy> engine(mesh, {.seed = 5});
  Model model(engine, options);
  if (!s.import_from.empty()) zest::io::import_safetensors(model, s.import_from);
  const zest::text_dataset data = zest::text_dataset::from_path();
  zest::batch_sampler sampler(data.train(), s.batch, s.context, 3);
  for (std::int64_t k = 0; k < s.steps; ++k) {
    const auto [in, tg] = sampler.batch<"dp">(mesh, static_cast<std::uint64_t>(k));
    (void)zest::train_step(engine, model, in, tg, 3e-3, static_cast<std::uint64_t>(k));
  }
  if (!s.export_to.empty()) zest::io::export_safetensors(model, s.export_to);
  if (s.logits.empty()) return;
  std::size_t b = s.batch, t = s.context;
  std::vector<std::int64_t> ids;
  if (!s.ids.empty()) {
    ids = read_ids(s.ids, b, t);
  } else {
    const auto batch = sampler.global_batch(1000);
    ids.assign(batch.inputs.begin(), batch.inputs.end());
  }
  const auto in = ids_t::generate(
      mesh, {b, t}, [&](const auto& i) { return static_cast<std::int32_t>(ids[i[0] * t + i[1]]); });
  zest::autodiff::tape tape;
  const auto logits = zest::to_global(model.logits(tape, in).value());
  if (mesh.rank() == 0) write_logits(s.logits, ids, logits, b, t, options.vocab);
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  settings s;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      if (flag == "--tied") {
        s.tied = true;
        continue;
      }
      if (i + 1 >= argc) throw std::runtime_error("flag " + std::string(flag) + " needs a value");
      const std::string value = argv[++i];
      if (flag == "--arch") s.arch = value;
      else if (flag == "--import") s.import_from = value;
      else if (flag == "--export") s.export_to = value;
      else if (flag == "--logits") s.logits = value;
      else if (flag == "--ids") s.ids = value;
      else if (flag == "--tp") s.tp = std::stoi(value);
      else if (flag == "--steps") s.steps = std::stoll(value);
      else if (flag == "--vocab") s.vocab = std::stoul(value);
      else if (flag == "--context") s.context = std::stoul(value);
      else if (flag == "--width") s.width = std::stoul(value);
      else if (flag == "--layers") s.layers = std::stoul(value);
      else if (flag == "--heads") s.heads = std::stoul(value);
      else if (flag == "--kv-heads") s.kv_heads = std::stoul(value);
      else if (flag == "--hidden") s.hidden = std::stoul(value);
      else if (flag == "--batch") s.batch = std::stoul(value);
      else throw std::runtime_error("unknown flag " + std::string(flag));
    }
    if (s.tp < 1 || world % s.tp != 0) throw std::runtime_error("--tp must divide the ranks");
    const mesh_t mesh(MPI_COMM_WORLD, {world / s.tp, s.tp});
    if (s.arch == "gpt") {
      zest::gpt_options o;
      o.vocab = s.vocab;
      o.context = s.context;
      o.width = s.width;
      o.layers = s.layers;
      o.heads = s.heads;
      run<zest::gpt<policy>>(s, mesh, o);
    } else if (s.arch == "llama") {
      llama_example::llama_options o;
      o.vocab = s.vocab;
      o.context = s.context;
      o.width = s.width;
      o.layers = s.layers;
      o.heads = s.heads;
      o.kv_heads = s.kv_heads;
      o.hidden = s.hidden;
      o.tied_head = s.tied;
      run<llama_example::llama<policy>>(s, mesh, o);
    } else {
      throw std::runtime_error("--arch gpt or llama");
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << '\n';
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return 0;
}
