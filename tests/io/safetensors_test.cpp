// Weights as safetensors files (zest/io/safetensors.hpp, zest/train/weights.hpp): every file
// tensor of the GPT-2 and Llama maps checked against the parameters by its own formula (the
// conventions as Hugging Face's modules read them, written out here again, not taken from
// the maps); round trips onto other layouts (another stage, tp, rank count, element type)
// exact, with the same bytes exported again; a file saved from a base model or with a tied
// head; bad files and bad maps refused on every rank with nothing changed.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "llama.hpp"
#include "train/training_fixture.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/io/safetensors.hpp"
#include "zest/nn/gpt_weights.hpp"
#include "zest/train/weights.hpp"

namespace {
using namespace zest;
using zest::testing::shared_temp_dir;
namespace fs = std::filesystem;

using mesh_t = mesh<"dp", "tp">;
using stage3 = training_policy<mesh_t, zero_stage<3>, float>;
using stage1 = training_policy<mesh_t, zero_stage<1>, float>;
using stage3_bf16 = training_policy<mesh_t, zero_stage<3>, bfloat16>;

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
// dp x tp over every rank: tp 2 where the ranks are even, or 1.
mesh_t make_mesh(int tp) { return mesh_t(MPI_COMM_WORLD, {world_size() / tp, tp}); }
int some_tp() { return world_size() % 2 == 0 ? 2 : 1; }

gpt_options small() {
  gpt_options o;
  o.vocab = 96;  // the corpus's 86 bytes, padded
  o.context = 8;
  o.width = 16;
  o.layers = 2;
  o.heads = 4;
  return o;
}

llama_example::llama_options small_llama(bool tied) {
  llama_example::llama_options o;
  o.vocab = 96;  // the corpus's 86 bytes, padded
  o.context = 8;
  o.width = 16;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.hidden = 24;
  o.tied_head = tied;
  return o;
}

template <class P>
std::map<std::string, std::vector<float>> values(zero_engine<P>& engine) {
  return zest::testing::parameter_values(engine);
}

// A file read whole by plain code: the header and each tensor's floats.
struct file_view {
  io::safetensors_header header;
  std::vector<std::byte> bytes;
  std::vector<float> floats(const std::string& name) const {
    const auto* e = header.find(name);
    REQUIRE_MESSAGE(e != nullptr, "no tensor " << name);
    std::vector<float> out;
    const std::byte* p = bytes.data() + header.data_start + e->begin;
    const std::size_t n = (e->end - e->begin) / (e->dtype == "F32" ? 4 : 2);
    for (std::size_t i = 0; i < n; ++i) {
      if (e->dtype == "F32") {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        out.push_back(v);
      } else {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out.push_back(e->dtype == "BF16" ? static_cast<float>(bfloat16::from_bits(b))
                                         : static_cast<float>(float16::from_bits(b)));
      }
    }
    return out;
  }
};

std::vector<std::byte> read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

file_view view(const fs::path& file) {
  return {io::read_safetensors_header(file), read_bytes(file)};
}

// Rank 0 writes `out`: the tensors of `in` that `rename` keeps (under the name it returns),
// then `extra` (name, F32 values, shape); every rank waits for it.
void rewrite(const fs::path& in, const fs::path& out,
             const std::function<std::optional<std::string>(const std::string&)>& rename,
             const std::vector<std::pair<std::string, std::vector<float>>>& extra = {}) {
  if (world_rank() == 0) {
    const file_view v = view(in);
    std::vector<io::safetensors_entry> entries;
    std::vector<std::byte> data;
    for (const auto& e : v.header.tensors) {
      const auto name = rename(e.name);
      if (!name) continue;
      entries.push_back({*name, e.dtype, e.shape, data.size(), data.size() + (e.end - e.begin)});
      const std::byte* p = v.bytes.data() + v.header.data_start + e.begin;
      data.insert(data.end(), p, p + (e.end - e.begin));
    }
    for (const auto& [name, floats] : extra) {
      entries.push_back(
          {name, "F32", {floats.size()}, data.size(), data.size() + 4 * floats.size()});
      const auto* p = reinterpret_cast<const std::byte*>(floats.data());
      data.insert(data.end(), p, p + 4 * floats.size());
    }
    const std::string header = io::detail::safetensors_header_text(entries, v.header.metadata);
    std::ofstream o(out, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = header.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << header;
    o.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0 writes raw bytes: a header text as given, then `data` bytes of zeros.
void write_raw(const fs::path& out, const std::string& header, std::size_t data) {
  if (world_rank() == 0) {
    std::ofstream o(out, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = header.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << header << std::string(data, '\0');
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

void check_equal(const std::map<std::string, std::vector<float>>& got,
                 const std::map<std::string, std::vector<float>>& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, v] : want) {
    INFO("parameter " << name);
    CHECK(got.at(name) == v);
  }
}

TEST_CASE("GPT-2's names: every tensor where Hugging Face's GPT2LMHeadModel reads it") {
  const auto dir = shared_temp_dir("st-gpt2");
  const gpt_options o = small();
  const mesh_t mesh = make_mesh(some_tp());
  zero_engine<stage3> engine(mesh, {.seed = 11});
  gpt<stage3> model(engine, o);
  io::export_safetensors(model, dir / "out/");
  const auto p = values(engine);
  const file_view f = view(dir / "out" / "model.safetensors");
  const std::size_t D = o.width, H = o.heads, d = D / H, F = 4 * D, V = o.vocab;

  CHECK(f.header.tensors.size() == 2 + 12 * o.layers + 3);
  for (const auto& e : f.header.tensors) CHECK(e.dtype == "F32");
  REQUIRE(f.header.metadata.is_object());
  CHECK(f.header.metadata["format"].as_string() == "pt");
  const json::value config = json::parse(f.header.metadata["config"].as_string());
  CHECK(config["model_type"].as_string() == "gpt2");
  CHECK(config["n_embd"].as_int() == static_cast<std::int64_t>(D));
  CHECK(config["n_inner"].as_int() == static_cast<std::int64_t>(F));
  CHECK(json::parse(read_text_file(dir / "out" / "config.json")) == config);

  CHECK(f.floats("transformer.wte.weight") == p.at("wte"));
  CHECK(f.floats("transformer.wpe.weight") == p.at("wpe"));
  for (std::size_t l = 0; l < o.layers; ++l) {
    const std::string z = "h" + std::to_string(l) + ".",
                      t = "transformer.h." + std::to_string(l) + ".";
    for (const char* n :
         {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_proj.bias",
          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      std::string zn = n;
      if (zn.starts_with("attn.c_proj")) zn = "attn.proj" + zn.substr(11);
      if (zn.starts_with("mlp.c_fc")) zn = "mlp.fc" + zn.substr(8);
      if (zn.starts_with("mlp.c_proj")) zn = "mlp.proj" + zn.substr(10);
      INFO((t + n));
      CHECK(f.floats(t + n) == p.at(z + zn));
    }
    // Conv1D: x @ W + b, W [D, 3D]; columns [0, D) q, [D, 2D) k, [2D, 3D) v, head h at h d.
    const auto w = f.floats(t + "attn.c_attn.weight"), b = f.floats(t + "attn.c_attn.bias");
    const char* qkv[] = {"attn.q", "attn.k", "attn.v"};
    for (std::size_t s = 0; s < 3; ++s) {
      const auto& pw = p.at(z + qkv[s] + ".weight");  // [D, H, d]
      const auto& pb = p.at(z + qkv[s] + ".bias");    // [H, d]
      for (std::size_t i = 0; i < D; ++i)
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t e = 0; e < d; ++e) {
            REQUIRE(w[i * 3 * D + s * D + h * d + e] == pw[(i * H + h) * d + e]);
            REQUIRE(b[s * D + h * d + e] == pb[h * d + e]);
          }
    }
    // c_proj: W [D (heads x d), D].
    CHECK(f.floats(t + "attn.c_proj.weight") == p.at(z + "attn.proj.weight"));
  }
  CHECK(f.floats("transformer.ln_f.weight") == p.at("ln_f.weight"));
  const auto head = f.floats("lm_head.weight");  // nn.Linear [V, D]; zest's [D, V]
  const auto& zh = p.at("lm_head.weight");
  for (std::size_t j = 0; j < V; ++j)
    for (std::size_t i = 0; i < D; ++i) REQUIRE(head[j * D + i] == zh[i * V + j]);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a GPT exported on one layout imports exactly onto another, and exports the same bytes") {
  const auto dir = shared_temp_dir("st-roundtrip");
  const mesh_t from_mesh = make_mesh(some_tp());
  zero_engine<stage3> from(from_mesh, {.seed = 12});
  gpt<stage3> from_model(from, small());
  // Trained a little, so that no value is its initializer's.
  auto s = batch_sampler(zest::testing::corpus().train(), 4, small().context, 2);
  for (std::uint64_t k = 0; k < 2; ++k) {
    const auto [in, tg] = s.batch<"dp">(from_mesh, k);
    (void)train_step(from, from_model, in, tg, 1e-2, k);
  }
  io::export_safetensors(from_model, dir / "a.safetensors");
  const auto want = values(from);

  // ZeRO-1 with the whole job on dp; and ZeRO-3 with every rank on tp where it divides.
  const mesh_t to_mesh = make_mesh(1);
  zero_engine<stage1> to(to_mesh, {.seed = 99});
  gpt<stage1> to_model(to, small());
  io::import_safetensors(to_model, dir / "a.safetensors");
  check_equal(values(to), want);
  io::export_safetensors(to_model, dir / "b.safetensors");
  if (world_rank() == 0)
    CHECK(read_bytes(dir / "a.safetensors") == read_bytes(dir / "b.safetensors"));

  if (small().heads % world_size() == 0) {
    const mesh_t all_tp = make_mesh(world_size());
    zero_engine<stage3> again(all_tp, {.seed = 98});
    gpt<stage3> again_model(again, small());
    io::import_safetensors(again_model, dir / "a.safetensors");
    check_equal(values(again), want);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("Llama's names: nn.Linear's [out, in], grouped-query heads, a tied head") {
  const auto dir = shared_temp_dir("st-llama");
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    const auto o = small_llama(tied);
    const mesh_t mesh = make_mesh(some_tp());
    zero_engine<stage3> engine(mesh, {.seed = 13});
    llama_example::llama<stage3> model(engine, o);
    const fs::path file = dir / (tied ? "tied.safetensors" : "untied.safetensors");
    io::export_safetensors(model, file);
    const auto p = values(engine);
    const file_view f = view(file);
    const std::size_t D = o.width, H = o.heads, K = o.kv_heads, G = H / K, d = D / H, F = o.hidden,
                      V = o.vocab;
    CHECK(f.header.tensors.size() == 1 + 9 * o.layers + 1 + (tied ? 0 : 1));
    CHECK((f.header.find("lm_head.weight") == nullptr) == tied);
    CHECK(f.floats("model.embed_tokens.weight") == p.at("wte"));
    CHECK(f.floats("model.norm.weight") == p.at("norm_f.weight"));
    for (std::size_t l = 0; l < o.layers; ++l) {
      const std::string z = "h" + std::to_string(l) + ".",
                        t = "model.layers." + std::to_string(l) + ".";
      CHECK(f.floats(t + "input_layernorm.weight") == p.at(z + "attn_norm.weight"));
      CHECK(f.floats(t + "post_attention_layernorm.weight") == p.at(z + "mlp_norm.weight"));
      // q_proj [H d, D]: query head k G + j (it reads kv head k), zest's q "m k g d".
      const auto q = f.floats(t + "self_attn.q_proj.weight");
      const auto& zq = p.at(z + "attn.q.weight");
      const auto o_ = f.floats(t + "self_attn.o_proj.weight");  // [D, H d]
      const auto& zo = p.at(z + "attn.o.weight");               // "k g d m"
      for (std::size_t m = 0; m < D; ++m)
        for (std::size_t k = 0; k < K; ++k)
          for (std::size_t j = 0; j < G; ++j)
            for (std::size_t e = 0; e < d; ++e) {
              const std::size_t head = k * G + j;
              REQUIRE(q[(head * d + e) * D + m] == zq[((m * K + k) * G + j) * d + e]);
              REQUIRE(o_[m * H * d + head * d + e] == zo[((k * G + j) * d + e) * D + m]);
            }
      for (const char* kv : {"k", "v"}) {  // [K d, D], zest's "m k d"
        const auto w = f.floats(t + "self_attn." + kv + "_proj.weight");
        const auto& zw = p.at(z + "attn." + kv + ".weight");
        for (std::size_t m = 0; m < D; ++m)
          for (std::size_t k = 0; k < K; ++k)
            for (std::size_t e = 0; e < d; ++e)
              REQUIRE(w[(k * d + e) * D + m] == zw[(m * K + k) * d + e]);
      }
      for (const char* g : {"gate", "up"}) {  // [F, D], zest's [D, F]
        const auto w = f.floats(t + "mlp." + g + "_proj.weight");
        const auto& zw = p.at(z + "mlp." + g + ".weight");
        for (std::size_t h = 0; h < F; ++h)
          for (std::size_t m = 0; m < D; ++m) REQUIRE(w[h * D + m] == zw[m * F + h]);
      }
      const auto down = f.floats(t + "mlp.down_proj.weight");  // [D, F], zest's [F, D]
      const auto& zd = p.at(z + "mlp.down.weight");
      for (std::size_t m = 0; m < D; ++m)
        for (std::size_t h = 0; h < F; ++h) REQUIRE(down[m * F + h] == zd[h * D + m]);
    }
    if (!tied) {
      const auto head = f.floats("lm_head.weight");
      const auto& zh = p.at("lm_head.weight");
      for (std::size_t j = 0; j < V; ++j)
        for (std::size_t i = 0; i < D; ++i) REQUIRE(head[j * D + i] == zh[i * V + j]);
    }
    // Onto one tp rank per dp rank.
    const mesh_t other = make_mesh(1);
    zero_engine<stage3> to(other, {.seed = 77});
    llama_example::llama<stage3> to_model(to, o);
    io::import_safetensors(to_model, file);
    check_equal(values(to), p);
  }
  // A tied file into an untied model: the head is the embedding's table, transposed.
  const mesh_t mesh = make_mesh(1);
  zero_engine<stage3> engine(mesh, {.seed = 14});
  llama_example::llama<stage3> untied(engine, small_llama(false));
  io::import_safetensors(untied, dir / "tied.safetensors");
  const auto p = values(engine);
  const std::size_t D = 16, V = 96;
  for (std::size_t j = 0; j < V; ++j)
    for (std::size_t i = 0; i < D; ++i)
      REQUIRE(p.at("lm_head.weight")[i * V + j] == p.at("wte")[j * D + i]);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("element types: a bf16 run exports BF16; fp32 weights into a bf16 run keep the master") {
  const auto dir = shared_temp_dir("st-bf16");
  const mesh_t mesh = make_mesh(some_tp());
  zero_engine<stage3> f32(mesh, {.seed = 15});
  gpt<stage3> f32_model(f32, small());
  io::export_safetensors(f32_model, dir / "f32.safetensors");
  const auto exact = values(f32);

  zero_engine<stage3_bf16> b16(mesh, {.seed = 16});
  gpt<stage3_bf16> b16_model(b16, small());
  io::import_safetensors(b16_model, dir / "f32.safetensors");
  const auto rounded = values(b16);
  for (const auto& [name, v] : exact) {
    INFO(name);
    std::vector<float> want;
    for (const float x : v) want.push_back(static_cast<float>(bfloat16(x)));
    CHECK(rounded.at(name) == want);
  }
  // The fp32 masters hold the file's values exactly: this rank's block of each.
  for (const auto& r : io::weight_records(b16, true)) {
    if (r.type != dtype::f32) continue;
    const auto& whole = exact.at(r.name);
    std::vector<std::size_t> index(r.local_extents.size(), 0);
    const std::size_t count = io::detail::volume_of(r.local_extents);
    for (std::size_t i = 0; i < count; ++i) {
      std::size_t g = 0;
      for (std::size_t k = 0; k < index.size(); ++k)
        g = g * r.global_extents[k] + r.local_offsets[k] + index[k];
      float got;
      std::memcpy(&got, r.bytes.data() + 4 * i, 4);
      REQUIRE(got == whole[g]);
      for (std::size_t k = index.size(); k-- > 0;) {
        if (++index[k] < r.local_extents[k]) break;
        index[k] = 0;
      }
    }
  }
  io::export_safetensors(b16_model, dir / "b16.safetensors");
  const file_view f = view(dir / "b16.safetensors");
  for (const auto& e : f.header.tensors) CHECK(e.dtype == "BF16");
  CHECK(f.floats("transformer.wte.weight") == rounded.at("wte"));
  // BF16 into fp32: widened exactly.
  zero_engine<stage3> back(mesh, {.seed = 17});
  gpt<stage3> back_model(back, small());
  io::import_safetensors(back_model, dir / "b16.safetensors");
  check_equal(values(back), rounded);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a base model's names and a tied head are read; the rest of a file must be the model's") {
  const auto dir = shared_temp_dir("st-names");
  const mesh_t mesh = make_mesh(some_tp());
  zero_engine<stage3> engine(mesh, {.seed = 18});
  gpt<stage3> model(engine, small());
  io::export_safetensors(model, dir / "a.safetensors");
  const auto want = values(engine);

  // GPT2Model's file: no "transformer." and no head (the LM ties it to wte), plus the
  // causal-mask buffers older files carry.
  std::vector<std::pair<std::string, std::vector<float>>> masks;
  for (std::size_t l = 0; l < small().layers; ++l)
    masks.push_back({"h." + std::to_string(l) + ".attn.bias", std::vector<float>(4, 1.0F)});
  rewrite(
      dir / "a.safetensors", dir / "base.safetensors",
      [](const std::string& n) -> std::optional<std::string> {
        if (n == "lm_head.weight") return std::nullopt;
        return n.starts_with("transformer.") ? n.substr(12) : n;
      },
      masks);
  zero_engine<stage3> base(mesh, {.seed = 19});
  gpt<stage3> base_model(base, small());
  io::import_safetensors(base_model, dir / "base.safetensors");
  auto got = values(base);
  for (const auto& [name, v] : want) {
    if (name == "lm_head.weight") continue;
    INFO(name);
    CHECK(got.at(name) == v);
  }
  const std::size_t D = small().width, V = small().vocab;
  for (std::size_t j = 0; j < V; ++j)
    for (std::size_t i = 0; i < D; ++i)
      REQUIRE(got.at("lm_head.weight")[i * V + j] == want.at("wte")[j * D + i]);

  // A tensor no part reads: refused, naming it, unless allowed.
  rewrite(dir / "a.safetensors", dir / "extra.safetensors",
          [](const std::string& n) { return std::optional<std::string>(n); },
          {{"h.0.attn.rotary", std::vector<float>(3, 2.0F)}});
  zero_engine<stage3> fresh(mesh, {.seed = 20});
  gpt<stage3> fresh_model(fresh, small());
  const auto before = values(fresh);
  CHECK_THROWS_WITH_AS(io::import_safetensors(fresh_model, dir / "extra.safetensors"),
                       doctest::Contains("\"h.0.attn.rotary\""), checkpoint_error);
  check_equal(values(fresh), before);
  io::import_safetensors(fresh_model, dir / "extra.safetensors", {.allow_unused = true});
  check_equal(values(fresh), want);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("bad files are refused on every rank and change nothing") {
  const auto dir = shared_temp_dir("st-bad");
  const mesh_t mesh = make_mesh(some_tp());
  zero_engine<stage3> engine(mesh, {.seed = 21});
  gpt<stage3> model(engine, small());
  io::export_safetensors(model, dir / "a.safetensors");
  zero_engine<stage3> target(mesh, {.seed = 22});
  gpt<stage3> target_model(target, small());
  const auto before = values(target);
  const auto refused = [&](const fs::path& file, const char* says) {
    CAPTURE(file);
    CHECK_THROWS_WITH(io::import_safetensors(target_model, file), doctest::Contains(says));
    check_equal(values(target), before);
  };

  // Truncated: the last tensor's data is cut.
  const auto bytes = read_bytes(dir / "a.safetensors");
  if (world_rank() == 0) {
    std::ofstream o(dir / "cut.safetensors", std::ios::binary);
    o.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size() - 10));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  refused(dir / "cut.safetensors", "truncated");
  // A parameter's tensor missing.
  rewrite(dir / "a.safetensors", dir / "missing.safetensors",
          [](const std::string& n) -> std::optional<std::string> {
            if (n == "transformer.h.1.mlp.c_fc.weight") return std::nullopt;
            return n;
          });
  refused(dir / "missing.safetensors", "no tensor holds parameter \"h1.mlp.fc.weight\"");
  // Another model's shapes.
  {
    gpt_options wide = small();
    wide.width = 32;
    zero_engine<stage3> other(mesh, {.seed = 23});
    gpt<stage3> other_model(other, wide);
    io::export_safetensors(other_model, dir / "wide.safetensors");
  }
  refused(dir / "wide.safetensors",
          "\"transformer.wte.weight\" has shape [96, 32], the model needs [96, 16]");
  // Headers: not JSON, a length past the file, overlapping data, a dtype the format lacks,
  // data_offsets that do not match the shape.
  write_raw(dir / "json.safetensors", "{\"a\": [1,", 0);
  refused(dir / "json.safetensors", "not JSON");
  if (world_rank() == 0) {
    std::ofstream o(dir / "long.safetensors", std::ios::binary);
    const std::uint64_t n = 1000;
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << "{}";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  refused(dir / "long.safetensors", "header's length 1000 exceeds the file");
  write_raw(dir / "overlap.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  refused(dir / "overlap.safetensors", "overlaps");
  write_raw(dir / "dtype.safetensors", R"({"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})",
            8);
  refused(dir / "dtype.safetensors", "unknown dtype \"F12\"");
  write_raw(dir / "size.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
            8);
  refused(dir / "size.safetensors", "needs 12");
  refused(dir / "none.safetensors", "cannot open");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a map that does not fit the model is refused before anything is written") {
  const auto dir = shared_temp_dir("st-map");
  const mesh_t mesh = make_mesh(some_tp());
  zero_engine<stage3> engine(mesh, {.seed = 24});
  gpt<stage3> model(engine, small());
  io::weight_map map = weight_map_of(model);
  SUBCASE("a parameter with no tensor") {
    map.tensors.pop_back();  // lm_head.weight
    CHECK_THROWS_WITH_AS(io::export_safetensors(engine, map, dir / "a.safetensors"),
                         doctest::Contains("parameter \"lm_head.weight\" has no tensor"),
                         shape_error);
  }
  SUBCASE("a part past its tensor's end") {
    map.tensors[0].parts[0].offset = 1;  // wte shifted by one: its last element falls out
    CHECK_THROWS_WITH_AS(io::export_safetensors(engine, map, dir / "a.safetensors"),
                         doctest::Contains("cannot hold parameter \"wte\""), shape_error);
  }
  SUBCASE("a tensor its parts do not cover") {
    auto& qkv = map.tensors[6];  // transformer.h.0.attn.c_attn.weight
    REQUIRE(qkv.name == "transformer.h.0.attn.c_attn.weight");
    qkv.parts[1].offset = 0;  // k over q; columns [D, 2D) left empty
    CHECK_THROWS_WITH_AS(io::export_safetensors(engine, map, dir / "a.safetensors"),
                         doctest::Contains("is placed twice, the second time by parameter "
                                           "\"h0.attn.k.weight\""),
                         shape_error);
  }
  SUBCASE("experts have no GPT-2 names") {
    gpt_options moe = small();
    moe.moe = true;
    CHECK_THROWS_WITH_AS(hf_gpt2_weights(moe), doctest::Contains("own_weight_map"), shape_error);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_FALSE(fs::exists(dir / "a.safetensors"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

}  // namespace
