// expect: zest training_policy: the tensor- or sequence-parallel axis is also a data axis
// ZeRO over "dp" with "dp" also named the tensor-parallel axis: each axis has one role.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/training_policy.hpp>

using policy = zest::training_policy<zest::local_mesh<"dp", "tp">, zest::zero_stage<3>, float,
                                     zest::axis_roles<"dp">>;

int main() { return static_cast<int>(policy::tensor_axis); }
