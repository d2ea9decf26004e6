// expect: zest mesh: axis names must be non-empty and distinct
// The user gives two mesh axes the same name "dp".
#include <zest/mesh/mesh.hpp>

int main() {
  zest::local_mesh<"dp", "dp"> m;
  return m.size(0);
}
