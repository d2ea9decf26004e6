// Checkpoints of a training run: train 10 steps on 2 ranks (ZeRO-1), save; load on all
// ranks of the job under ZeRO-3 and, separately, on one rank under stage 0, train 10 more:
// the losses equal an uninterrupted 20-step run. A truncated shard, a corrupted byte or a
// changed digit in the manifest is refused on every rank and leaves the model as it was; so
// is a checkpoint of another corpus (unless allowed).
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/streams.hpp"
#include "train/training_fixture.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/data/stream.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/io/checksum.hpp"
#include "zest/train/checkpoint.hpp"

// The suite that CTest's train_checkpoint_np<N> run (tests/train/CMakeLists.txt: this file,
// zero_stages_test.cpp and mixed_precision_test.cpp are one translation unit).
TEST_SUITE_BEGIN("train_checkpoint");

namespace {
using namespace zest;
using namespace zest::testing;

using saving_policy = training_policy<world_mesh, zero_stage<1>, float>;
using loading_policy = training_policy<world_mesh, zero_stage<3>, float>;
using single_policy = training_policy<world_mesh, zero_stage<0>, float>;

TEST_CASE("a run saved on 2 ranks resumes on N ranks and on 1 with the same losses") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = shared_temp_dir("resume");

  // The uninterrupted run, on one rank.
  const auto one = make_single_mesh();
  zero_engine<single_policy> ref_engine(one, {.seed = 21});
  gpt<single_policy> ref_model(ref_engine, small_gpt());
  const auto reference = train_steps(ref_engine, ref_model, 0, 20);

  // 10 steps on the first two ranks (or one, in a 1-rank job), then save.
  const int savers = std::min(world, 2);
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < savers ? 0 : MPI_UNDEFINED, rank, &sub);
  if (sub != MPI_COMM_NULL) {
    {
      const world_mesh two(sub, {savers});
      zero_engine<saving_policy> engine(two, {.seed = 21});
      gpt<saving_policy> model(engine, small_gpt());
      const auto first = train_steps(engine, model, 0, 10);
      check_same_losses(first, std::vector<double>(reference.begin(), reference.begin() + 10));
      save_training_state(dir / "ckpt", engine, 10);
    }
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const std::vector<double> rest(reference.begin() + 10, reference.end());
  SUBCASE("on all ranks, ZeRO-3") {
    const auto mesh = make_world_mesh();
    zero_engine<loading_policy> engine(mesh, {.seed = 999});  // the checkpoint overrides
    gpt<loading_policy> model(engine, small_gpt());
    const auto info = load_training_state(dir / "ckpt", engine);
    CHECK(info.step == 10);
    CHECK(engine.steps_taken() == 10);
    check_same_losses(train_steps(engine, model, 10, 10), rest);
  }
  SUBCASE("on one rank, stage 0") {
    zero_engine<single_policy> engine(one, {.seed = 999});
    gpt<single_policy> model(engine, small_gpt());
    CHECK(load_training_state(dir / "ckpt", engine).step == 10);
    check_same_losses(train_steps(engine, model, 10, 10), rest);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("an asynchronous save while training goes on resumes exactly") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = shared_temp_dir("async");
  const auto mesh = make_world_mesh();
  zero_engine<loading_policy> ref_engine(mesh, {.seed = 31});
  gpt<loading_policy> ref_model(ref_engine, small_gpt());
  const auto reference = train_steps(ref_engine, ref_model, 0, 8);

  zero_engine<loading_policy> engine(mesh, {.seed = 31});
  gpt<loading_policy> model(engine, small_gpt());
  check_same_losses(train_steps(engine, model, 0, 3), {reference.begin(), reference.begin() + 3});
  // Slow file operations: the shards are still being written when the next steps begin,
  // whose updates must wait for them (zero_engine::hold_states).
  detail::file_fault() = [](detail::file_op, const std::filesystem::path&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 0;
  };
  io::pending_save pending = save_training_state_async(dir / "ckpt", engine, 3);
  check_same_losses(train_steps(engine, model, 3, 2),
                    {reference.begin() + 3, reference.begin() + 5});
  pending.wait();
  detail::file_fault() = nullptr;
  CHECK(io::read_checkpoint_info(dir / "ckpt").step == 3);

  zero_engine<saving_policy> resumed(mesh, {.seed = 999});
  gpt<saving_policy> resumed_model(resumed, small_gpt());
  CHECK(load_training_state(dir / "ckpt", resumed).step == 3);
  check_same_losses(train_steps(resumed, resumed_model, 3, 5),
                    {reference.begin() + 3, reference.end()});
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE(
    "a loader's position in the checkpoint: resumed on other ranks and layouts, the same ids") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = shared_temp_dir("stream");
  // A user's loader (tests/support/streams.hpp), ids within the model's vocabulary.
  const zest::testing::shuffled_windows loader(3000, small_batch, small_gpt().context, 5, 96);

  // 4 steps on the first two ranks (or one), each on the cursor's next batch; then save.
  const int savers = std::min(world, 2);
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < savers ? 0 : MPI_UNDEFINED, rank, &sub);
  if (sub != MPI_COMM_NULL) {
    {
      const world_mesh two(sub, {savers});
      zero_engine<saving_policy> engine(two, {.seed = 41});
      gpt<saving_policy> model(engine, small_gpt());
      stream_cursor cursor(loader);
      for (std::int64_t k = 0; k < 4; ++k) {
        const auto [in, tg] = cursor.next<layout<split<'b', "dp">>>(two);
        (void)train_step(engine, model, in, tg, learning_rate(k), static_cast<std::uint64_t>(k));
      }
      save_training_state(dir / "ckpt", engine, 4, {}, {}, cursor.state());
    }
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  // Resumed on every rank of the job, the batch split over dp and ep and the sequence over
  // sp and tp in each shape the job allows: batches 4, 5, ... whole, as the uninterrupted
  // loader gives them.
  const auto mesh = make_world_mesh();
  zero_engine<loading_policy> engine(mesh, {.seed = 999});
  gpt<loading_policy> model(engine, small_gpt());
  stream_cursor cursor(loader);
  const auto info = load_training_state(dir / "ckpt", engine, {.data = cursor.state()});
  REQUIRE(stream_state_of(info).has_value());
  CHECK(cursor.restore(*stream_state_of(info)).empty());
  CHECK(cursor.position() == 4);
  using grid = zest::mesh<"dp", "ep", "tp", "sp">;
  std::vector<std::array<int, 4>> shapes{{world, 1, 1, 1}};
  if (world == 4) shapes.insert(shapes.end(), {{1, 2, 1, 2}, {2, 1, 2, 1}, {1, 1, 2, 2}});
  if (world == 2) shapes.insert(shapes.end(), {{1, 2, 1, 1}, {1, 1, 1, 2}});
  for (const auto& shape : shapes) {
    CAPTURE(shape);
    const grid g(MPI_COMM_WORLD, shape);
    const auto [in, tg] = cursor.next<layout<split<'b', "dp", "ep">, split<'t', "sp", "tp">>>(g);
    const auto want = stream_global_batch(loader, cursor.position() - 1);
    CHECK(to_global(in) == want.inputs);
    CHECK(to_global(tg) == want.targets);
  }

  // Another stream (another global batch) is refused, naming it, unless allowed.
  const zest::testing::shuffled_windows wider(3000, 2 * small_batch, small_gpt().context, 5, 96);
  stream_cursor other(wider);
  CHECK_THROWS_WITH_AS(load_training_state(dir / "ckpt", engine, {.data = other.state()}),
                       doctest::Contains("global batch: saved 8 rows, this run 16"),
                       checkpoint_error);
  const auto taken =
      load_training_state(dir / "ckpt", engine, {.data = other.state(), .allow_other_data = true});
  CHECK(other.restore(*stream_state_of(taken), {.allow_other = true}) ==
        "global batch: saved 8 rows, this run 16");
  CHECK(other.position() == 4);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("a damaged checkpoint is refused and nothing is loaded") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = shared_temp_dir("damaged");
  const auto mesh = make_world_mesh();
  {
    zero_engine<loading_policy> engine(mesh, {.seed = 1});
    gpt<loading_policy> model(engine, small_gpt());
    (void)train_steps(engine, model, 0, 2);
    save_training_state(dir / "ckpt", engine, 2);
  }
  zero_engine<loading_policy> engine(mesh, {.seed = 2});
  gpt<loading_policy> model(engine, small_gpt());
  const auto before = parameter_values(engine);

  auto first_shard = [&] {
    for (const auto& e : std::filesystem::directory_iterator(dir / "ckpt"))
      if (e.path().extension() == ".bin") return e.path();
    return std::filesystem::path{};
  };
  SUBCASE("a corrupted byte") {
    if (rank == 0) {
      std::fstream f(first_shard(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      char c = 0;
      f.read(&c, 1);
      f.seekp(100);
      c = static_cast<char>(c ^ 0x20);
      f.write(&c, 1);
    }
  }
  SUBCASE("a truncated shard") {
    if (rank == 0) {
      const auto p = first_shard();
      std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);
    }
  }
  // One changed digit in the manifest's metadata or header: caught by its own checksum.
  const auto manifest = dir / "ckpt" / "manifest.json";
  auto change = [&](const std::string& before, const std::string& after) {
    if (rank != 0) return;
    std::string text = read_text_file(manifest);
    const auto at = text.find(before);
    REQUIRE(at != std::string::npos);
    text.replace(at, before.size(), after);
    write_text_file_atomically(manifest, text);
  };
  SUBCASE("a changed digit in optimizer_steps") {
    change("\"optimizer_steps\": 2", "\"optimizer_steps\": 7");
  }
  SUBCASE("a changed digit in loss_scaler.scale") {
    change("\"scale\": 65536.0", "\"scale\": 65586.0");
  }
  SUBCASE("a changed digit in step") { change("\"step\": 2", "\"step\": 3"); }
  SUBCASE("a changed digit in world_size") { change("\"world_size\": ", "\"world_size\": 1"); }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_THROWS_AS(load_training_state(dir / "ckpt", engine), checkpoint_error);
  CHECK(parameter_values(engine) == before);
  CHECK(engine.steps_taken() == 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

// The case: vocabularies of 86 and 76 bytes, both padded to 96, so the tensors fit.
TEST_CASE("a checkpoint of another corpus is refused, naming both identities") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = shared_temp_dir("corpus");
  const text_dataset& trained_on = corpus();
  REQUIRE(trained_on.vocab_size() == 86);
  const std::string fewer = trained_on.vocabulary().substr(10);  // 76 distinct bytes
  const text_dataset other = text_dataset::from_text(fewer + fewer, "other");
  REQUIRE(other.vocab_size() == 76);

  // The identity is the byte-to-id mapping: the same bytes in another text give the same.
  const std::string reversed(fewer.rbegin(), fewer.rend());
  CHECK(text_dataset::from_text(reversed, "reversed").identity() == other.identity());
  CHECK(other.identity() != trained_on.identity());
  CHECK(other.identity() == io::format_checksum(io::xxh64(std::as_bytes(std::span(fewer)))));
  CHECK(trained_on.identity().rfind("xxh64:", 0) == 0);
  CHECK(trained_on.identity().size() == 6 + 16);

  const auto mesh = make_world_mesh();
  {
    zero_engine<loading_policy> engine(mesh, {.seed = 1});
    gpt<loading_policy> model(engine, small_gpt());
    (void)train_steps(engine, model, 0, 2);
    save_training_state(dir / "ckpt", engine, 2, {}, trained_on.identity());
    save_training_state(dir / "unmarked", engine, 2);  // no corpus recorded
  }
  zero_engine<loading_policy> engine(mesh, {.seed = 2});
  gpt<loading_policy> model(engine, small_gpt());
  const auto before = parameter_values(engine);

  resume_options other_corpus;
  other_corpus.corpus = other.identity();
  std::string what;
  try {
    (void)load_training_state(dir / "ckpt", engine, other_corpus);
  } catch (const checkpoint_error& e) {
    what = e.what();
  }
  CHECK(what.find("trained on corpus " + trained_on.identity()) != std::string::npos);
  CHECK(what.find("this run's corpus is " + other.identity()) != std::string::npos);
  CHECK(what.find("allow_other_corpus") != std::string::npos);
  CHECK(parameter_values(engine) == before);
  CHECK(engine.steps_taken() == 0);

  resume_options same;
  same.corpus = trained_on.identity();
  try {
    (void)load_training_state(dir / "unmarked", engine, same);
    FAIL("a checkpoint without a corpus identity loaded though this run asks for one");
  } catch (const checkpoint_error& e) {
    CHECK(std::string(e.what()).find("metadata \"corpus\" is missing") != std::string::npos);
  }
  CHECK(parameter_values(engine) == before);

  CHECK(load_training_state(dir / "ckpt", engine, same).step == 2);
  CHECK(engine.steps_taken() == 2);
  const auto loaded = parameter_values(engine);
  CHECK(loaded != before);

  // Deliberately: the other corpus, allowed.
  zero_engine<loading_policy> again(mesh, {.seed = 3});
  gpt<loading_policy> model_again(again, small_gpt());
  other_corpus.allow_other_corpus = true;
  CHECK(load_training_state(dir / "ckpt", again, other_corpus).step == 2);
  CHECK(parameter_values(again) == loaded);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

// A model's hyperparameters that no tensor shows (a RoPE base, an eps) travel in the config:
// given this run's, a load refuses a checkpoint whose config differs, naming the first
// differing field and both values, and changes nothing; allow_other_config takes it.
TEST_CASE("a checkpoint of another config is refused, naming the field") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = shared_temp_dir("config");
  json::value config = json::object{};
  config["width"] = static_cast<std::int64_t>(small_gpt().width);
  config["rope_base"] = 10000.0;
  config["norm"] = json::object{};
  config["norm"]["eps"] = 1e-5;
  const auto mesh = make_world_mesh();
  {
    zero_engine<loading_policy> engine(mesh, {.seed = 1});
    gpt<loading_policy> model(engine, small_gpt());
    (void)train_steps(engine, model, 0, 2);
    save_training_state(dir / "ckpt", engine, 2, config);
    save_training_state(dir / "bare", engine, 2);
  }
  zero_engine<loading_policy> engine(mesh, {.seed = 2});
  gpt<loading_policy> model(engine, small_gpt());
  const auto before = parameter_values(engine);
  const auto refused = [&](const json::value& now) {
    resume_options o;
    o.config = now;
    try {
      (void)load_training_state(dir / "ckpt", engine, o);
    } catch (const checkpoint_error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  json::value other = config;
  other["rope_base"] = 500000.0;
  std::string what = refused(other);
  CHECK(what.find("field \"rope_base\": saved 10000.0, this run 5e+05") != std::string::npos);
  CHECK(what.find("allow_other_config") != std::string::npos);
  other = config;
  other["norm"]["eps"] = 1e-6;
  CHECK(refused(other).find("field \"norm.eps\": saved 1e-05, this run 1e-06") !=
        std::string::npos);
  // A config that also changes the tensors (a wider model) is named by its field, not by
  // the tensors' extents; a checkpoint saved without a config says so.
  {
    gpt_options wider = small_gpt();
    wider.width *= 2;
    zero_engine<loading_policy> wide_engine(mesh, {.seed = 4});
    gpt<loading_policy> wide_model(wide_engine, wider);
    resume_options o;
    o.config = config;
    o.config["width"] = static_cast<std::int64_t>(wider.width);
    std::string why;
    try {
      (void)load_training_state(dir / "ckpt", wide_engine, o);
    } catch (const checkpoint_error& e) {
      why = e.what();
    }
    CHECK(why.find("field \"width\": saved 32, this run 64") != std::string::npos);
  }
  other = config;
  other["dropout"] = 0.1;
  CHECK(refused(other).find("field \"dropout\": not in the saved config, this run 0.1") !=
        std::string::npos);
  resume_options bare;
  bare.config = config;
  try {
    (void)load_training_state(dir / "bare", engine, bare);
    FAIL("a checkpoint without a config loaded though this run gives one");
  } catch (const checkpoint_error& e) {
    CHECK(std::string(e.what()).find("records no config") != std::string::npos);
  }
  CHECK(parameter_values(engine) == before);
  CHECK(engine.steps_taken() == 0);

  resume_options same;
  same.config = config;
  CHECK(load_training_state(dir / "ckpt", engine, same).step == 2);
  const auto loaded = parameter_values(engine);
  CHECK(loaded != before);
  zero_engine<loading_policy> again(mesh, {.seed = 3});
  gpt<loading_policy> model_again(again, small_gpt());
  resume_options allowed;
  allowed.config = other;
  allowed.allow_other_config = true;
  CHECK(load_training_state(dir / "ckpt", again, allowed).step == 2);
  CHECK(parameter_values(again) == loaded);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST_SUITE_END();
