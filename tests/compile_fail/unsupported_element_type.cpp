// expect: zest: unsupported element type
// A tensor of char: dtype_of names the element types zest supports.
#include <zest/zest.hpp>

int main() { return static_cast<int>(zest::dtype_of<char>()); }
