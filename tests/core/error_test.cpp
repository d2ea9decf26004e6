// zest/core/error.hpp: detail::message writes each piece as `out << piece` would, whatever
// its type (the pieces go through one type-erased writer, message_piece).
#include "zest/core/error.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include "zest/core/bfloat16.hpp"
#include "zest/core/float16.hpp"

namespace {

enum class colour : std::uint8_t { red, green };
std::ostream& operator<<(std::ostream& out, colour c) {
  return out << (c == colour::red ? "red" : "green");
}
struct point {
  int x, y;
};
std::ostream& operator<<(std::ostream& out, const point& p) {
  return out << '(' << p.x << ", " << p.y << ')';
}

// The reference: the pieces through one ostringstream, each by its own operator<<.
template <class... Parts>
std::string streamed(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace

TEST_CASE("message writes every kind of piece as operator<< does") {
  using zest::detail::message;
  const std::string s = "text";
  const std::string_view v = "view";
  const char* c = "pointer";
  CHECK(message("literal ", s, ' ', v, ' ', c) == streamed("literal ", s, ' ', v, ' ', c));

  const std::int8_t i8 = 65;  // a signed char: written as the character 'A'
  const std::uint8_t u8 = 66;
  const short sh = -7;
  const int i = std::numeric_limits<int>::min();
  const long l = -1234567890123L;
  const long long ll = std::numeric_limits<long long>::max();
  const unsigned u = 4000000000U;
  const std::size_t z = std::numeric_limits<std::size_t>::max();
  const std::uint16_t u16 = 65535;
  CHECK(message(i8, ' ', u8, ' ', sh, ' ', i, ' ', l, ' ', ll, ' ', u, ' ', z, ' ', u16) ==
        streamed(i8, ' ', u8, ' ', sh, ' ', i, ' ', l, ' ', ll, ' ', u, ' ', z, ' ', u16));

  const bool yes = true;
  const char ch = 'q';
  CHECK(message(yes, ch, false) == streamed(yes, ch, false));

  // Floats print with the stream's default precision, as the float itself would.
  for (const float f :
       {0.1F, 1.0F / 3.0F, 1e-30F, 3.4e38F, -0.0F, 123456789.0F,
        std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min()}) {
    CHECK(message(f) == streamed(f));
  }
  for (const double d : {0.1, 2.0 / 3.0, 1e300, -1e-300, 6.02214076e23}) {
    CHECK(message(d) == streamed(d));
  }
  const long double ld = 1.0L / 3.0L;
  CHECK(message(ld) == streamed(ld));

  // Types with their own operator<<, zest's 16-bit floats among them.
  const colour red = colour::red;
  const point p{3, -4};
  const zest::bfloat16 b(1.5F);
  const zest::float16 h(-2.25F);
  CHECK(message("colour ", red, " at ", p, ' ', colour::green) ==
        streamed("colour ", red, " at ", p, ' ', colour::green));
  CHECK(message(b, ' ', h) == streamed(b, ' ', h));

  CHECK(message() == "");
  CHECK(message("zest: einsum \"", std::string_view("bsm,mh->bsh"), "\": dim '", 'm',
                "' has extent ", std::size_t{64}, " in operand ", 0, " but ", std::size_t{32},
                " in operand ", 1) ==
        "zest: einsum \"bsm,mh->bsh\": dim 'm' has extent 64 in operand 0 but 32 in operand 1");
}
