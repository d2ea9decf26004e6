// The transformer planner (zest/zero/transformer_plan.hpp) and the time model
// (zest/zero/cost_model.hpp): activation bytes of tiny configurations counted by hand against
// Korthikanti et al.'s closed forms, model states that are plan_zero's on the tp/ep blocks
// (GPT-2 small equal to the ZeRO planner's figures, Turing-NLG's per-GPU bytes by hand), the
// alpha-beta cost of ring collectives, and a step's time by hand.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "zest/mesh/mesh_shape.hpp"
#include "zest/zero/cost_model.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/step_inventory.hpp"
#include "zest/zero/transformer_plan.hpp"

namespace {
using namespace zest;

// s = 4, b = 2, h = 8, a = 2: s b h = 64, 5 a s / h = 5.
transformer_config tiny(std::size_t layers = 3) {
  transformer_config c = gpt_transformer("tiny", layers, 8, 2, 16, 4);
  return c;
}
parallel_layout tiny_layout(int tp, bool sp, recomputation r) {
  parallel_layout p;
  p.tp = tp;
  p.sequence_parallel = sp;
  p.recompute = r;
  p.micro_batch = 2;
  return p;
}

}  // namespace

TEST_CASE("activations: Korthikanti et al.'s per-layer bytes, counted by hand") {
  const transformer_config c = tiny();
  const double sbh = 4 * 2 * 8;
  // No parallelism: s b h (34 + 5 a s / h) = 64 * 39.
  CHECK(layer_activation_bytes(c, tiny_layout(1, false, recomputation::none), false, 2).total() ==
        sbh * 39);
  CHECK(sbh * 39 == 2496);
  // Tensor parallelism, t = 2: s b h (10 + 24 / t + 5 a s / (h t)) = 64 * 24.5.
  const auto tp = layer_activation_bytes(c, tiny_layout(2, false, recomputation::none), false, 2);
  CHECK(tp.norm_region == sbh * 10);
  CHECK(tp.tensor_region == sbh * 12);
  CHECK(tp.scores == sbh * 2.5);
  CHECK(tp.total() == 1568);
  // With sequence parallelism: all of it / t.
  CHECK(layer_activation_bytes(c, tiny_layout(2, true, recomputation::none), false, 2).total() ==
        2496.0 / 2);
  // Whole model: L layers; selective recomputation drops the scores: 34 s b h / t per layer.
  const auto sel =
      transformer_activation_bytes(c, tiny_layout(2, true, recomputation::selective), 2);
  CHECK(sel.layers == 3 * 34 * sbh / 2);
  CHECK(sel.working == 0);
  // Full recomputation: the paper's 2 s b h per layer (/t with SP), and one layer rebuilt.
  const auto full = transformer_activation_bytes(c, tiny_layout(2, true, recomputation::full), 2);
  CHECK(full.layers == 3 * 2 * sbh / 2);
  CHECK(full.working == 2496.0 / 2);
  const auto full_tp =
      transformer_activation_bytes(c, tiny_layout(2, false, recomputation::full), 2);
  CHECK(full_tp.layers == 3 * 2 * sbh);
  CHECK(full_tp.working == 1568);
  // Outside the layers: embedding dropout mask, final norm and head inputs (5 s b h, norm
  // region) and fp32 logits 4 s b V / t: 320 + 4 * 8 * 16 / 2 = 576.
  CHECK(full_tp.outside == 5 * sbh + 4 * 8 * 16 / 2.0);
  CHECK(sel.outside == 5 * sbh / 2 + 4 * 8 * 16 / 2.0);
  // Without recomputation the whole model is L layers plus the outside.
  const auto none = transformer_activation_bytes(c, tiny_layout(1, false, recomputation::none), 2);
  CHECK(none.total() == 3 * 2496 + 5 * sbh + 4 * 8 * 16);
}

TEST_CASE("activations: grouped-query attention, SwiGLU, no dropout, fp32, by hand") {
  // h = 8, a = 2 heads, 1 kv head, f = 16; s = 4, b = 2: s b = 8.
  transformer_config c = llama_transformer("tiny llama", 2, 8, 2, 1, 16, 16, 4);
  const parallel_layout p = tiny_layout(1, false, recomputation::none);
  const auto a = layer_activation_bytes(c, p, false, 4);
  // norm region: norm 1 input, qkv input, norm 2 input, MLP input: 4 e s b h = 4 * 4 * 64.
  CHECK(a.norm_region == 1024);
  // q (s b h), k and v (s b h / 2 each), projection input (s b h): 3 s b h e = 768;
  // gate, up, product: 3 e s b f = 3 * 4 * 8 * 16 = 1536.
  CHECK(a.tensor_region == 768 + 1536);
  // softmax output only: e a s^2 b = 4 * 2 * 16 * 2.
  CHECK(a.scores == 256);
}

TEST_CASE("activations: an expert layer, by hand") {
  transformer_config c = tiny(2);
  c.experts = 4;
  c.top_k = 2;
  c.capacity_factor = 1.5;  // k c = 3
  const parallel_layout p = tiny_layout(1, false, recomputation::none);
  const auto dense = layer_activation_bytes(c, p, false, 2);
  const auto moe = layer_activation_bytes(c, p, true, 2);
  const double sbh = 64;
  // + router fp32 probabilities 4 s b E, + dispatched and combined tokens 2 e k c s b h.
  CHECK(moe.norm_region - dense.norm_region == 4 * 8 * 4 + 2 * 2 * 3 * sbh);
  // The experts' hidden activations: k c times the MLP's 2 e s b f.
  CHECK(moe.tensor_region - dense.tensor_region == (3 - 1) * 2 * 2 * 8 * 32);
  CHECK(moe.scores == dense.scores);
  CHECK(c.is_moe(1));
  CHECK(!c.is_moe(0));
  CHECK(c.moe_layers() == 1);
}

TEST_CASE("model states: GPT-2 small on dp alone is the ZeRO planner's gpt_model") {
  const transformer_config c = gpt_transformer("GPT-2 small", 12, 768, 12, 50257, 1024);
  for (int dp : {1, 3, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(dp);
      CAPTURE(stage);
      parallel_layout p;
      p.dp = dp;
      p.zero_stage = stage;
      const auto m = plan_transformer(c, p);
      CHECK(m.parameter_count == 124'439'808ULL);
      CHECK(m.local_parameters == m.parameter_count);
      const auto z = plan_zero(stage, gpt_model(gpt2_small), mesh_shape<"dp">({dp}));
      CHECK(m.states.memory == z.memory);
      CHECK(m.states.bytes_sent() == z.bytes_sent());
    }
  }
}

TEST_CASE("model states: Turing-NLG's bytes per GPU (TP 4 x DP 64, ZeRO-1), by hand") {
  const transformer_config c = gpt_transformer("Turing-NLG", 78, 4256, 28, 50257, 1024);
  parallel_layout p;
  p.dp = 64;
  p.tp = 4;
  p.zero_stage = 1;
  const auto m = plan_transformer(c, p);
  const std::uint64_t h = 4256, v = 50257, s = 1024, l = 78;
  // All weights: 12 h^2 + 13 h per layer, the tables, the final norm.
  CHECK(m.parameter_count == l * (12 * h * h + 13 * h) + v * h + s * h + 2 * h);
  // This GPU's blocks: the matrices and the column-parallel biases / 4, the norms, the
  // row-parallel biases and the position table whole, the token table's first 12565 rows.
  const std::uint64_t per_layer = 12 * h * h / 4 + (3 * h + 4 * h) / 4 + 4 * h + 2 * h;
  const std::uint64_t local = l * per_layer + 12565 * h + s * h + 2 * h;
  CHECK(m.local_parameters == local);
  // ZeRO-1: bf16/fp16 parameters and gradients whole, 12 bytes per parameter over 64.
  CHECK(m.states.memory.parameters == 2 * local);
  CHECK(m.states.memory.gradients == 2 * local);
  const double optimizer = 12.0 * static_cast<double>(local) / 64;
  // Balanced blocks of each tensor's first dim (4256 = 64 x 66.5) round rank 0 up a little.
  CHECK(static_cast<double>(m.states.memory.optimizer()) >= optimizer);
  CHECK(static_cast<double>(m.states.memory.optimizer()) <= optimizer * 1.01);
  // A width that 64 x 4 divides meets 4 Psi + 12 Psi / 64 exactly.
  transformer_config even = gpt_transformer("even", 2, 256, 4, 256 * 4, 64);
  const auto e = plan_transformer(even, p);
  CHECK(e.states.memory.total() == 4 * e.local_parameters + 12 * e.local_parameters / 64);
}

TEST_CASE("model states: experts split over ep, their hidden dim over tp") {
  transformer_config c = tiny(2);  // layer 1 has experts
  c.experts = 8;
  c.expert_hidden = 16;
  parallel_layout p;
  p.ep = 4;
  p.tp = 2;
  const auto m = plan_transformer(c, p);
  // Per expert: fc [8, 16] + bias [16], proj [16, 8] + bias [8]; 2 of 8 experts per GPU;
  // fc's columns and its bias and proj's rows split over tp = 2.
  CHECK(m.local_expert_parameters == 2 * (8 * 16 / 2 + 16 / 2 + 16 / 2 * 8 + 8));
  // Per token: the dense matrices and top-2 experts' fc and proj.
  const std::uint64_t dense_layer_matrices = 8 * 24 + 8 * 8 + 8 * 32 + 32 * 8;
  const std::uint64_t attention = 8 * 24 + 8 * 8;
  CHECK(m.active_expert_matmul_parameters == 2 * (8 * 16 + 16 * 8));
  CHECK(m.active_matmul_parameters ==
        dense_layer_matrices + attention + 2 * (8 * 16 + 16 * 8) + 16 * 8);
}

TEST_CASE("plan_transformer: what does not fit is named") {
  const transformer_config c = tiny();
  parallel_layout p;
  p.tp = 3;
  CHECK_THROWS_WITH_AS(plan_transformer(c, p), doctest::Contains("tp 3 does not divide the heads"),
                       shape_error);
  p.tp = 1;
  p.sequence_parallel = true;
  CHECK_THROWS_WITH_AS(plan_transformer(c, p), doctest::Contains("needs tp >= 2"), shape_error);
  p.sequence_parallel = false;
  p.ep = 2;
  CHECK_THROWS_WITH_AS(plan_transformer(c, p), doctest::Contains("needs expert layers"),
                       shape_error);
  transformer_config moe = c;
  moe.experts = 6;
  p.ep = 4;
  CHECK_THROWS_WITH_AS(plan_transformer(moe, p), doctest::Contains("does not divide the experts"),
                       shape_error);
  p.ep = 1;
  moe.top_k = 7;
  CHECK_THROWS_WITH_AS(plan_transformer(moe, p), doctest::Contains("top-k 7"), shape_error);
  transformer_config odd = c;
  odd.hidden = 9;
  CHECK_THROWS_WITH_AS(plan_transformer(odd, parallel_layout{}),
                       doctest::Contains("not a multiple of heads"), shape_error);
}

TEST_CASE("cost model: the alpha-beta time of ring collectives") {
  const axis_link l{1e9, 10e-6};  // 1 GB/s, 10 us per step
  // All-reduce of 1 MB over 4: 2 (n-1) alpha + 2 (n-1)/n S / beta = 60 us + 1.5 ms.
  CHECK(collective_seconds(collective::all_reduce, 4, 1e6, l) == doctest::Approx(1.56e-3));
  // All-gather / reduce-scatter / all-to-all: half the steps and half the bytes.
  CHECK(collective_seconds(collective::all_gather, 4, 1e6, l) == doctest::Approx(0.78e-3));
  CHECK(collective_seconds(collective::reduce_scatter, 4, 1e6, l) == doctest::Approx(0.78e-3));
  CHECK(collective_seconds(collective::all_to_all, 4, 1e6, l) == doctest::Approx(0.78e-3));
  // An all-reduce costs what a reduce-scatter plus an all-gather cost.
  CHECK(collective_seconds(collective::all_reduce, 8, 5e6, l) ==
        doctest::Approx(collective_seconds(collective::reduce_scatter, 8, 5e6, l) +
                        collective_seconds(collective::all_gather, 8, 5e6, l)));
  CHECK(collective_seconds(collective::all_reduce, 1, 1e6, l) == 0);
  CHECK(bytes_sent(collective::all_reduce, 2, 100) == 100);
}

TEST_CASE("cost model: a data-parallel step by hand") {
  // 2 layers, h = 8, s = 4, vocab 16 (tied), 2 sequences per rank, fp32, ZeRO-0 on 2 ranks.
  const transformer_config c = tiny(2);
  parallel_layout p;
  p.dp = 2;
  p.micro_batch = 2;
  cluster cl;
  cl.peak_flops = 1e9;
  cl.efficiency = 0.5;
  cl.data = {1e8, 1e-5};
  const auto t = estimate_step(c, p, cl, fp32_adam);
  const double tokens = 8;
  const double matrices = 2 * (8 * 24 + 8 * 8 + 8 * 32 + 32 * 8) + 16 * 8;  // + the tied head
  const double flops = 6 * matrices * tokens + 12 * 2 * tokens * 4 * 8;
  CHECK(t.flops == flops);
  CHECK(t.compute_seconds == doctest::Approx(flops / 0.5e9));
  // One all-reduce of the fp32 gradients per group (the embeddings, 2 layers, the head):
  // 2 (n-1)/n x 4 Psi bytes.
  const auto psi = static_cast<double>(plan_transformer(c, p).parameter_count);
  CHECK(t.data.bytes_sent == doctest::Approx(4 * psi));
  CHECK(t.data.calls == 4);
  CHECK(t.data.seconds == doctest::Approx(4 * 2 * 1e-5 + 4 * psi / 1e8));
  CHECK(t.tensor.calls == 0);
  CHECK(t.total_seconds() == doctest::Approx(t.compute_seconds + t.data.seconds));
  CHECK(t.achieved_flops() == doctest::Approx(flops / t.total_seconds()));
  // ZeRO-3: forward and backward gathers and the reduce-scatter, each (n-1)/n of 4 Psi (up to
  // the first dims' rounding); full recomputation adds a forward of the layers.
  p.zero_stage = 3;
  p.recompute = recomputation::full;
  const auto t3 = estimate_step(c, p, cl, fp32_adam);
  CHECK(t3.data.bytes_sent == doctest::Approx(3 * 2 * psi).epsilon(0.05));
  CHECK(t3.flops - t3.model_flops == 2 * (matrices - 16 * 8) * tokens + 4 * 2 * tokens * 4 * 8);
  CHECK(t3.memory_seconds == 0);
  // With a memory bandwidth: the activations forward produces (2 layers counted with e = 4
  // and m = 1: norm region 18 s b h, q k v and projection input 16 s b h, MLP 2 e s b f =
  // 32 s b h, scores 9 a s^2 b; the outside 9 s b h + 4 s b V), 3 passes, one more under full
  // recomputation.
  cl.memory_bandwidth = 1e6;
  parallel_layout kept = p;
  kept.recompute = recomputation::none;
  const double produced = transformer_activation_bytes(c, kept, 4).total();
  CHECK(produced == 2 * (64 * (18 + 16 + 32) + 9 * 2 * 4 * 4 * 2) + 9 * 64 + 4 * 8 * 16);
  CHECK(produced == 10688);
  CHECK(estimate_step(c, p, cl, fp32_adam).memory_seconds == doctest::Approx(produced * 4 / 1e6));
  p.recompute = recomputation::none;
  const auto tm = estimate_step(c, p, cl, fp32_adam);
  CHECK(tm.memory_seconds == doctest::Approx(produced * 3 / 1e6));
  CHECK(tm.total_seconds() ==
        doctest::Approx(tm.compute_seconds + tm.memory_seconds + tm.data.seconds));
}

TEST_CASE("cost model: hybrid sharding prices dp and dp_rep on their own links") {
  // ZeRO-3 within dp = 2, 2 replica groups (dp_rep), fp32, one micro-batch: dp carries
  // ZeRO-3's 3 Psi (n-1)/n elements, dp_rep the all-reduce of each rank's reduced gradient
  // shard, 2 (Psi/n) (r-1)/r (hsdp_formula), each priced on its own link.
  const transformer_config c = tiny(2);
  parallel_layout p;
  p.dp = 2;
  p.dp_replicas = 2;
  p.zero_stage = 3;
  p.micro_batch = 2;
  CHECK(p.world() == 4);
  cluster cl;
  cl.data = {1e10, 1e-6};         // inside a node
  cl.data_replica = {1e8, 1e-5};  // across nodes
  const auto t = estimate_step(c, p, cl, fp32_adam);
  const auto psi = static_cast<double>(plan_transformer(c, p).parameter_count);
  const hsdp_formula_values f = hsdp_formula(3, psi, 2, 2, fp32_adam);
  CHECK(t.data.bytes_sent == doctest::Approx(4 * f.elements_sent_shard).epsilon(0.05));
  CHECK(t.replica.bytes_sent == doctest::Approx(4 * f.elements_sent_replica).epsilon(0.05));
  CHECK(f.elements_sent_replica == doctest::Approx(psi / 2));
  // One all-reduce per group (the embeddings, 2 layers, the head) over 2 replicas on the
  // slow link.
  CHECK(t.replica.calls == 4);
  CHECK(t.replica.seconds == doctest::Approx(4 * 2 * 1e-5 + t.replica.bytes_sent / 1e8));
  CHECK(t.global_tokens == 2 * 4 * 4);  // 2 sequences of 4 on each of the 4 data ranks
  CHECK(t.communication_seconds() == doctest::Approx(t.data.seconds + t.replica.seconds));
  // The same world as plain ZeRO-3 over dp = 4: all its bytes on the slow link.
  parallel_layout flat = p;
  flat.dp = 4;
  flat.dp_replicas = 1;
  cluster slow = cl;
  slow.data = cl.data_replica;
  const auto t_flat = estimate_step(c, flat, slow, fp32_adam);
  CHECK(t_flat.replica.calls == 0);
  CHECK(t_flat.data.bytes_sent > 4 * t.replica.bytes_sent);
  CHECK(t.communication_seconds() < t_flat.communication_seconds());
}

TEST_CASE("cost model: Megatron's tensor-parallel collectives, with and without SP") {
  const transformer_config c = tiny(2);
  parallel_layout p;
  p.tp = 2;
  p.micro_batch = 2;
  cluster cl;
  cl.tensor = {1e9, 1e-6};
  const auto t = estimate_step(c, p, cl);
  const auto replicated = static_cast<double>(plan_transformer(c, p).tensor_replicated_parameters);
  CHECK(replicated == 2 * (4 * 8 + 2 * 8) + 4 * 8 + 2 * 8);
  // 4 all-reduces per layer + the embedding's and the head's, of b s h bf16 elements (128 B):
  // each sends 2 (n-1)/n x 128 = 128 B; the cross entropy's three of b s bf16 (16 B) send
  // 16 B; the loss's gradient (one value, on rank 0: nothing sent); the replicated
  // weights' gradients (6 per layer: norms, row-parallel biases; the positions and the final
  // norm's 2: bf16) one all-reduce each, once per step.
  CHECK(t.tensor.calls == 4 * 2 + 2 + 3 + 1 + (6 * 2 + 1 + 2));
  CHECK(t.tensor.bytes_sent == 10 * 128 + 3 * 16 + replicated * 2);
  // Sequence parallelism: all-gathers + reduce-scatters of the same bytes, plus all-gathers
  // of the ids and targets (b s int32, 32 B: 16 B sent each) and of the position table's
  // gradient (s h bf16, 64 B: 32 B sent).
  p.sequence_parallel = true;
  const auto sp = estimate_step(c, p, cl);
  CHECK(sp.tensor.bytes_sent == doctest::Approx(t.tensor.bytes_sent + 2 * 16 + 32));
  // Full recomputation repeats the forward's two per layer.
  p.sequence_parallel = false;
  p.recompute = recomputation::full;
  CHECK(estimate_step(c, p, cl).tensor.calls == 6 * 2 + 2 + 3 + 1 + (6 * 2 + 1 + 2));
}

TEST_CASE("cost model: the experts' all-to-alls") {
  transformer_config c = tiny(2);
  c.experts = 4;
  c.capacity_factor = 1.0;
  parallel_layout p;
  p.ep = 4;
  p.micro_batch = 2;
  cluster cl;
  const auto t = estimate_step(c, p, cl);
  // One expert layer: 4 all-to-alls of k c b s h bf16 = 2 x 64 x 2 B, (n-1)/n of it sent;
  // then the dense weights' gradients all-reduced over ep, 2 (n-1)/n of them.
  const auto m = plan_transformer(c, p);
  const double dense = static_cast<double>(m.local_parameters - m.local_expert_parameters);
  CHECK(t.expert.bytes_sent == doctest::Approx(4 * 0.75 * 256 + 1.5 * dense * 2));
}

// The inventory the cost model prices: its lines by hand for Ulysses and for two axes that
// both make a weight's gradient partial, an axis of one rank without lines, and explain
// naming every axis, kind and line.
TEST_CASE("step inventory: Ulysses, two partial axes, and what explain prints") {
  transformer_config c = tiny(2);  // h = 8, s = 4, 2 heads, vocab 16 (tied)
  parallel_layout p;
  p.sp = 2;
  p.micro_batch = 2;
  const transformer_memory m = plan_transformer(c, p, fp32_adam);
  const step_inventory inv = inventory_step(c, p, m.states, fp32_adam);
  using enum collective;
  // 8 all-to-alls per layer of this rank's b s h / sp = 32 fp32 values, half of them sent.
  CHECK(inv.total("sp", all_to_all) == collective_tally{16, 16 * 16 * 4, false});
  // Every weight's gradient all-reduced over sp (2 (n-1)/n of it: all of it, fp32), and the
  // position table's gradient gathered whole (s h = 32 values, half sent).
  std::uint64_t weights = 0;
  for (const auto& w : place_weights(c, transformer_plan_mesh({1, 1, 1}))) {
    (void)w;
    ++weights;
  }
  CHECK(inv.total("sp", all_reduce) == collective_tally{weights, m.local_parameters * 4, false});
  CHECK(inv.total("sp", all_gather) == collective_tally{1, 16 * 4, false});
  CHECK(inv.total("tp", all_reduce).calls == 0);  // tp has one rank: no line
  CHECK(inv.bytes() == estimate_step(c, p, cluster{}, fp32_adam).sequence.bytes_sent);

  // tp 2 x sp 2: a weight replicated over both is reduce-scattered over tp (the first axis
  // after ep), all-reduced as a half over sp, gathered back over tp.
  c.heads = 4;  // Ulysses needs the heads to divide over sp x tp
  p.tp = 2;
  p.sequence_parallel = true;
  const step_inventory both =
      inventory_step(c, p, plan_transformer(c, p, fp32_adam).states, fp32_adam);
  std::uint64_t replicated = 0, pieces = 0, split = 0;
  for (const auto& w : place_weights(c, transformer_plan_mesh({1, 2, 1}))) {
    if (w.replicated_over_tp) {
      ++replicated;
      pieces += (w.local.elements() + 1) / 2;
    } else {
      split += w.local.elements();
    }
  }
  CHECK(replicated == 2 * 6 + 1 + 2);  // norms, row-parallel biases, positions, final norm
  CHECK(both.total("sp", all_reduce) == collective_tally{weights, (pieces + split) * 4, false});
  const collective_tally rs = both.total("tp", reduce_scatter);
  CHECK(rs.calls == 10 + replicated);  // the activations' 4 L + 2, then the weights'
  const std::string text = both.str();
  for (const auto& line : both.lines()) CHECK(text.find(line.what) != std::string::npos);
  CHECK(text.find("  sp\n") != std::string::npos);
  CHECK(text.find("  tp\n") != std::string::npos);
  CHECK(text.find("  dp\n") == std::string::npos);
}
