// expect: zest training_policy: the mesh lacks an axis that the stage names as a data or replica axis
// Hybrid sharding over "dp_rep" on a mesh without that axis: the policy names the problem.
#include <zest/mesh/mesh.hpp>
#include <zest/zero/training_policy.hpp>

using policy = zest::training_policy<zest::local_mesh<"dp">,
                                     zest::zero_stage<3, "dp">::replicated_over<"dp_rep">>;

int main() { return static_cast<int>(policy::data_mask); }
