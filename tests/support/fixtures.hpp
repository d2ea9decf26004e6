// Shared helpers of zest's tests: meshes for the current world size, deterministic data
// with genuine partial summands, and a naive einsum used as the single-rank reference.
#pragma once

#include <mpi.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "zest/einsum/spec.hpp"
#include "zest/layout/shard.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::testing {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The 2-D mesh shapes worth testing at this world size: 1 -> 1x1; 2 -> 2x1, 1x2; 4 -> 2x2, 4x1, 1x4.
inline std::vector<std::array<int, 2>> mesh_shapes() {
  const int n = world_size();
  if (n == 1) return {{1, 1}};
  if (n == 4) return {{2, 2}, {4, 1}, {1, 4}};
  return {{n, 1}, {1, n}};
}

// Every valid layout of a tensor with the given dims on a 2-axis mesh: each axis replicated,
// partial or splitting one dim, a dim split by both axes in either order (28 for "abc").
inline std::vector<layout_value> layouts_on_two_axes(std::string_view dims) {
  std::vector<axis_placement> options{{placement_kind::replicate, 0, 0},
                                      {placement_kind::partial, 0, 0}};
  for (char d : dims) options.push_back({placement_kind::split, d, 0});
  std::vector<layout_value> out;
  for (const auto& p0 : options) {
    for (const auto& p1 : options) {
      layout_value v = replicated_layout(2);
      v.axes[0] = p0;
      v.axes[1] = p1;
      if (p0.kind == placement_kind::split && p1.kind == placement_kind::split &&
          p0.dim == p1.dim) {
        v.axes[1].order = 1;  // the first axis major
        out.push_back(v);
        v.axes[0].order = 1;  // the second axis major
        v.axes[1].order = 0;
      }
      out.push_back(v);
    }
  }
  return out;
}

// A deterministic value for a global index, distinct enough to catch misplaced blocks.
template <std::size_t Rank>
double value_at(const std::array<std::size_t, Rank>& i, std::uint32_t salt = 0) {
  double v = 0.1 * salt;
  for (std::size_t k = 0; k < Rank; ++k)
    v = v * 1.37 + static_cast<double>((i[k] * (7 + 3 * k) + salt) % 11) - 5.0;
  return v / 8.0;
}
// A second pattern: the spread between summands on partial axes.
template <std::size_t Rank>
double spread_at(const std::array<std::size_t, Rank>& i) {
  double v = 0;
  for (std::size_t k = 0; k < Rank; ++k) v += static_cast<double>((i[k] + k) % 5);
  return v / 4.0;
}

// Fills a shard for layout v so that the global value is value_at(index): on partial axes
// each rank holds a different summand (value / n_partial + (c - mid) * spread), which sum to it.
template <class T, fixed_string Dims, class Mesh, std::size_t Rank>
std::vector<T> make_shard(layout_value v, const std::array<std::size_t, Rank>& global,
                          const Mesh& mesh, std::uint32_t salt,
                          std::array<std::size_t, Rank>* local_out = nullptr) {
  std::array<std::size_t, Rank> local{}, offset{};
  for (std::size_t k = 0; k < Rank; ++k) {
    const auto r = dim_range(v, Dims[k], global[k], mesh.sizes(), mesh.coords());
    local[k] = r.size;
    offset[k] = r.offset;
  }
  if (local_out) *local_out = local;
  double parts = 1;
  for (std::size_t a = 0; a < Mesh::axis_count; ++a) {
    if (v.is_partial(a)) parts *= mesh.size(a);
  }
  std::size_t count = 1;
  for (auto e : local) count *= e;
  std::vector<T> out(count);
  std::array<std::size_t, Rank> idx{};
  for (std::size_t flat = 0; flat < count; ++flat) {
    std::size_t rest = flat;
    for (std::size_t k = Rank; k-- > 0;) {
      idx[k] = offset[k] + rest % local[k];
      rest /= local[k];
    }
    double x = value_at(idx, salt) / parts;
    for (std::size_t a = 0; a < Mesh::axis_count; ++a) {
      if (v.is_partial(a)) x += (mesh.coord(a) - 0.5 * (mesh.size(a) - 1)) * spread_at(idx);
    }
    out[flat] = static_cast<T>(x);
  }
  return out;
}

template <class X>
X make_tensor(const typename X::mesh_type& mesh, const typename X::extents_type& extents,
              std::uint32_t salt) {
  auto data = make_shard<typename X::value_type, X::dims>(X::layout, extents, mesh, salt);
  return X(mesh, extents, host_vector<typename X::value_type>(data.begin(), data.end()));
}

// The global array of value_at over the extents, row-major.
template <std::size_t Rank>
std::vector<double> global_values(const std::array<std::size_t, Rank>& extents,
                                  std::uint32_t salt) {
  std::size_t count = 1;
  for (auto e : extents) count *= e;
  std::vector<double> out(count);
  std::array<std::size_t, Rank> idx{};
  for (std::size_t flat = 0; flat < count; ++flat) {
    std::size_t rest = flat;
    for (std::size_t k = Rank; k-- > 0;) {
      idx[k] = rest % extents[k];
      rest /= extents[k];
    }
    out[flat] = value_at(idx, salt);
  }
  return out;
}

// Naive einsum over global row-major arrays: loops over every letter's values. Independent
// of zest's kernels on purpose.
struct dense {
  std::string_view labels;
  std::vector<std::size_t> extents;
  std::vector<double> data;
};
inline std::vector<double> reference_einsum(const einsum_spec& spec, const std::vector<dense>& in,
                                            std::vector<std::size_t>& out_extents) {
  std::array<std::size_t, 128> extent{};
  std::string letters;
  for (const auto& t : in) {
    for (std::size_t k = 0; k < t.labels.size(); ++k) {
      if (letters.find(t.labels[k]) == std::string::npos) letters += t.labels[k];
      extent[static_cast<unsigned char>(t.labels[k])] = t.extents[k];
    }
  }
  out_extents.clear();
  std::size_t out_count = 1;
  for (char c : spec.output.view()) {
    out_extents.push_back(extent[static_cast<unsigned char>(c)]);
    out_count *= extent[static_cast<unsigned char>(c)];
  }
  std::vector<double> out(out_count, 0.0);
  std::size_t total = 1;
  for (char c : letters) total *= extent[static_cast<unsigned char>(c)];
  std::array<std::size_t, 128> at{};
  for (std::size_t flat = 0; flat < total; ++flat) {
    std::size_t rest = flat;
    for (std::size_t k = letters.size(); k-- > 0;) {
      const auto u = static_cast<unsigned char>(letters[k]);
      at[u] = rest % extent[u];
      rest /= extent[u];
    }
    double prod = 1;
    for (const auto& t : in) {
      std::size_t off = 0;
      for (std::size_t k = 0; k < t.labels.size(); ++k)
        off = off * t.extents[k] + at[static_cast<unsigned char>(t.labels[k])];
      prod *= t.data[off];
    }
    std::size_t o = 0;
    for (char c : spec.output.view())
      o = o * extent[static_cast<unsigned char>(c)] + at[static_cast<unsigned char>(c)];
    out[o] += prod;
  }
  return out;
}

// Largest |a - b| relative to the largest |b| (or 1).
template <class A>
double relative_error(const std::vector<A>& got, const std::vector<double>& want) {
  double scale = 1, worst = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  if (got.size() != want.size()) return 1e30;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  return worst / scale;
}

}  // namespace zest::testing
