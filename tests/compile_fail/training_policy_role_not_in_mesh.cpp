// expect: zest training_policy: axis_roles names an axis that the mesh lacks
// A tensor-parallel axis named "model" on a mesh without it: the policy names the problem.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/training_policy.hpp>

using policy = zest::training_policy<zest::local_mesh<"dp", "tp">, zest::zero_stage<3>, float,
                                     zest::axis_roles<"model">>;

int main() { return static_cast<int>(policy::tensor_axis); }
