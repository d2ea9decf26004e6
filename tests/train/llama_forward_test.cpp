// examples/llama.hpp's decoder against plain loops in double: the logits of a whole model
// (token embedding, RMSNorm, RoPE with the rotate-half convention at global positions,
// grouped-query causal attention, SwiGLU, tied and untied heads) from its own parameters,
// under ZeRO-3 on 1 and 2 ranks (the batch split over "dp"). Also: the parameter list equals
// llama_shape's (what train_gpt plans with), and bad options are refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llama.hpp"
#include "train/training_fixture.hpp"
#include "zest/tensor/redistribute.hpp"

TEST_SUITE_BEGIN("train_llama_forward");
// One namespace per file: the files of this folder share one unity translation unit.
namespace llama_forward_tests {

namespace {
using namespace zest;
using namespace zest::testing;
using llama_example::llama;
using llama_example::llama_options;

using policy = training_policy<world_mesh, zero_stage<3>, float>;
using params_t = std::map<std::string, std::vector<float>>;
using matrix = std::vector<std::vector<double>>;  // [t][features]

// Row-major reads of a parameter's whole value.
struct reader {
  const params_t& p;
  double at(const std::string& name, std::size_t i) const {
    return static_cast<double>(p.at(name).at(i));
  }
};

matrix rms_norm(const matrix& x, const reader& r, const std::string& gain, double eps) {
  matrix y = x;
  for (std::size_t t = 0; t < x.size(); ++t) {
    double ms = 0;
    for (double v : x[t]) ms += v * v;
    ms /= static_cast<double>(x[t].size());
    for (std::size_t m = 0; m < x[t].size(); ++m)
      y[t][m] = x[t][m] / std::sqrt(ms + eps) * r.at(gain, m);
  }
  return y;
}

// y[t][o] = sum_m x[t][m] W[m][o], W [in, out] row-major.
matrix project(const matrix& x, const reader& r, const std::string& weight, std::size_t out) {
  matrix y(x.size(), std::vector<double>(out, 0.0));
  for (std::size_t t = 0; t < x.size(); ++t)
    for (std::size_t m = 0; m < x[t].size(); ++m)
      for (std::size_t o = 0; o < out; ++o) y[t][o] += x[t][m] * r.at(weight, m * out + o);
  return y;
}

// Rotates each head's d dims of a row at position t (rotate-half: pairs j and j + d/2).
void rope(std::vector<double>& row, std::size_t heads, std::size_t d, std::size_t t, double base) {
  const std::size_t h = d / 2;
  for (std::size_t n = 0; n < heads; ++n) {
    double* u = row.data() + n * d;
    for (std::size_t j = 0; j < h; ++j) {
      const double a = static_cast<double>(t) *
                       std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(d));
      const double x1 = u[j], x2 = u[j + h];
      u[j] = x1 * std::cos(a) - x2 * std::sin(a);
      u[j + h] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
}

// Logits [t][vocab] of one sequence.
matrix reference_logits(const llama_options& o, const params_t& p,
                        const std::vector<std::int32_t>& ids) {
  const reader r{p};
  const std::size_t T = ids.size(), w = o.width, H = o.heads, K = o.kv_heads, G = H / K;
  const std::size_t d = w / H;
  matrix x(T, std::vector<double>(w));
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t m = 0; m < w; ++m)
      x[t][m] = r.at("wte", static_cast<std::size_t>(ids[t]) * w + m);
  for (std::size_t l = 0; l < o.layers; ++l) {
    const std::string b = "h" + std::to_string(l);
    const matrix n = rms_norm(x, r, b + ".attn_norm.weight", o.norm_eps);
    matrix q = project(n, r, b + ".attn.q.weight", K * G * d);  // [t][k][g][d]
    matrix k = project(n, r, b + ".attn.k.weight", K * d);      // [t][k][d]
    const matrix v = project(n, r, b + ".attn.v.weight", K * d);
    for (std::size_t t = 0; t < T; ++t) {
      rope(q[t], K * G, d, t, o.rope_base);
      rope(k[t], K, d, t, o.rope_base);
    }
    matrix ctx(T, std::vector<double>(K * G * d, 0.0));  // [t][k][g][e]
    for (std::size_t kh = 0; kh < K; ++kh) {
      for (std::size_t g = 0; g < G; ++g) {
        const std::size_t qh = kh * G + g;
        for (std::size_t t = 0; t < T; ++t) {
          std::vector<double> s(t + 1);
          double top = -1e300;
          for (std::size_t u = 0; u <= t; ++u) {
            double dot = 0;
            for (std::size_t j = 0; j < d; ++j) dot += q[t][qh * d + j] * k[u][kh * d + j];
            s[u] = dot / std::sqrt(static_cast<double>(d));
            top = std::max(top, s[u]);
          }
          double z = 0;
          for (double& e : s) z += (e = std::exp(e - top));
          for (std::size_t u = 0; u <= t; ++u)
            for (std::size_t j = 0; j < d; ++j) ctx[t][qh * d + j] += s[u] / z * v[u][kh * d + j];
        }
      }
    }
    const matrix a = project(ctx, r, b + ".attn.o.weight", w);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t m = 0; m < w; ++m) x[t][m] += a[t][m];
    const matrix n2 = rms_norm(x, r, b + ".mlp_norm.weight", o.norm_eps);
    matrix gate = project(n2, r, b + ".mlp.gate.weight", o.hidden);
    const matrix up = project(n2, r, b + ".mlp.up.weight", o.hidden);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t j = 0; j < o.hidden; ++j)
        gate[t][j] = gate[t][j] / (1 + std::exp(-gate[t][j])) * up[t][j];
    const matrix f = project(gate, r, b + ".mlp.down.weight", w);
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t m = 0; m < w; ++m) x[t][m] += f[t][m];
  }
  const matrix n = rms_norm(x, r, "norm_f.weight", o.norm_eps);
  if (!o.tied_head) return project(n, r, "lm_head.weight", o.vocab);
  matrix y(T, std::vector<double>(o.vocab, 0.0));
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t c = 0; c < o.vocab; ++c)
      for (std::size_t m = 0; m < w; ++m) y[t][c] += n[t][m] * r.at("wte", c * w + m);
  return y;
}

void check_against_loops(const llama_options& o) {
  const auto mesh = make_world_mesh();
  zero_engine<policy> engine(mesh, {.seed = 21});
  const llama<policy> model(engine, o);
  const llama_options& resolved = model.options();

  const std::size_t batch = 2, time = 7;  // time < context: positions from 0 all the same
  using ids_t = tensor<std::int32_t, world_mesh, "bt", layout<split<'b', "dp">>>;
  const auto id_of = [&](std::size_t b, std::size_t t) {
    return static_cast<std::int32_t>((b * 37 + t * t * 11 + 5) % o.vocab);
  };
  const auto ids =
      ids_t::generate(mesh, {batch, time}, [&](const auto& i) { return id_of(i[0], i[1]); });
  autodiff::tape t;
  const auto logits = model.logits(t, ids);
  engine.discard_forward();
  const auto got = to_global(logits.value());  // [b, t, v]
  REQUIRE(got.size() == batch * time * o.vocab);

  const auto params = parameter_values(engine);
  double worst = 0, largest = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    std::vector<std::int32_t> seq(time);
    for (std::size_t k = 0; k < time; ++k) seq[k] = id_of(b, k);
    const matrix want = reference_logits(resolved, params, seq);
    for (std::size_t k = 0; k < time; ++k) {
      for (std::size_t c = 0; c < o.vocab; ++c) {
        const double g = static_cast<double>(got[(b * time + k) * o.vocab + c]);
        worst = std::max(worst, std::abs(g - want[k][c]));
        largest = std::max(largest, std::abs(want[k][c]));
      }
    }
  }
  INFO("largest logit " << largest << ", largest difference " << worst);
  CHECK(largest > 1e-2);  // the logits are not all near zero: the comparison means something
  CHECK(worst <= 1e-5 * std::max(1.0, largest));

  // The planner's list (train_gpt's memory estimate) is the model's.
  const auto listed = llama_example::llama_shape(o).parameters;
  const auto registered = model.shape().parameters;
  REQUIRE(listed.size() == registered.size());
  for (std::size_t i = 0; i < listed.size(); ++i) {
    CHECK(listed[i].name == registered[i].name);
    CHECK(listed[i].extents == registered[i].extents);
  }
}

TEST_CASE("llama: the logits equal plain loops (grouped-query attention, untied head)") {
  llama_options o;
  o.vocab = 40;
  o.context = 8;
  o.width = 16;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.hidden = 24;
  o.rope_base = 500;  // faster rotations than 10000's at these few positions
  check_against_loops(o);
}

TEST_CASE("llama: the logits equal plain loops (multi-query attention, tied head)") {
  llama_options o;
  o.vocab = 40;
  o.context = 8;
  o.width = 16;
  o.layers = 2;
  o.heads = 2;
  o.kv_heads = 1;
  o.tied_head = true;  // hidden: default_hidden(16) = 64
  check_against_loops(o);
}

TEST_CASE("llama: options refused with a message naming them") {
  llama_options o;
  o.width = 32;
  o.heads = 4;
  o.kv_heads = 3;
  CHECK_THROWS_WITH_AS(llama_example::checked(o),
                       doctest::Contains("3 key/value heads do not divide 4"), shape_error);
  o.kv_heads = 2;
  o.heads = 32;  // head dim 1
  CHECK_THROWS_WITH_AS(llama_example::checked(o), doctest::Contains("is odd"), shape_error);
  o.heads = 4;
  CHECK(llama_example::checked(o).hidden == 96);  // 8/3 x 32 = 85.3, rounded up to 96
  CHECK(llama_example::default_hidden(128) == 352);
}

}  // namespace

}  // namespace llama_forward_tests

TEST_SUITE_END();
