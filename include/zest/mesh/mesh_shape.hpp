// zest/mesh/mesh_shape.hpp — a mesh without communicators: axis names, sizes, one coordinate.
//
//   zest::mesh_shape<"dp"> m({4096});          // rank 0 of a 4096-way data-parallel mesh
//   zest::mesh_shape<"dp", "tp"> m2({64, 8}, {3, 5});
//
// Planning needs only what a mesh says about its shape (sizes(), coords(), axis_names), not
// its communicators, so a planner can reason about meshes far larger than the machine it
// runs on, with no MPI. It offers the shape half of basic_mesh's interface, so the layout
// and byte-model functions written against a mesh take it unchanged.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/mesh/mesh.hpp"

namespace zest {

template <fixed_string... Axes>
class mesh_shape {
  static_assert(sizeof...(Axes) >= 1 && sizeof...(Axes) <= max_axes,
                "zest mesh_shape: a mesh has 1 to zest::max_axes axes");
  static_assert(detail::axis_names_valid<Axes...>(),
                "zest mesh_shape: axis names must be non-empty and distinct, e.g. "
                "mesh_shape<\"dp\", \"tp\">");

 public:
  static constexpr std::size_t axis_count = sizeof...(Axes);
  static constexpr std::array<std::string_view, axis_count> axis_names{view_of<Axes>...};

  // The rank at `coords` (all zeros by default) of a mesh with these sizes.
  constexpr explicit mesh_shape(std::array<int, axis_count> sizes,
                                std::array<int, axis_count> coords = {})
      : sizes_(sizes), coords_(coords) {
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (sizes_[a] <= 0) {
        throw shape_error(detail::message("zest: mesh_shape: axis '", axis_names[a], "' has size ",
                                          sizes_[a], "; sizes must be positive"));
      }
      if (coords_[a] < 0 || coords_[a] >= sizes_[a]) {
        throw shape_error(detail::message("zest: mesh_shape: coordinate ", coords_[a], " on axis '",
                                          axis_names[a], "' is outside [0, ", sizes_[a], ")"));
      }
    }
  }

  // The same mesh seen from another rank.
  constexpr mesh_shape at(std::array<int, axis_count> coords) const {
    return mesh_shape(sizes_, coords);
  }

  constexpr int size(std::size_t axis) const { return sizes_[axis]; }
  constexpr int coord(std::size_t axis) const { return coords_[axis]; }
  constexpr const std::array<int, axis_count>& sizes() const { return sizes_; }
  constexpr const std::array<int, axis_count>& coords() const { return coords_; }
  // Row-major, the first axis major, as basic_mesh numbers its ranks.
  constexpr int rank() const { return detail::row_major_rank(sizes_, coords_); }
  constexpr int world_size() const {
    int n = 1;
    for (int s : sizes_) n *= s;
    return n;
  }

  // "mesh<dp=64>", as basic_mesh::describe() prints it.
  std::string describe() const {
    std::string s = "mesh<";
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (a) s += ", ";
      s += axis_names[a];
      s += '=';
      s += std::to_string(sizes_[a]);
    }
    return s + '>';
  }

 private:
  std::array<int, axis_count> sizes_{};
  std::array<int, axis_count> coords_{};
};

}  // namespace zest
