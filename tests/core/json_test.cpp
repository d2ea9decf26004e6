// zest::json: values, round-trips through dump and parse, escapes, the streaming writer,
// and the parse errors (each with its line and column).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "zest/core/json.hpp"

namespace json = zest::json;

namespace {

// The message of the json::error that parse(text) throws ("" when it does not throw).
std::string parse_error(std::string_view text) {
  try {
    json::parse(text);
  } catch (const json::error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("values: construction and accessors") {
  json::value v;
  CHECK(v.is_null());
  v["step"] = 3;
  v["loss"] = 2.5;
  v["name"] = "run";
  v["ok"] = true;
  v["big"] = std::uint64_t{18446744073709551615u};
  v["tags"] = json::array{"a", 1, nullptr};
  REQUIRE(v.is_object());
  CHECK(v.size() == 6);
  CHECK(v["step"].is_integer());
  CHECK(v["step"].as_int() == 3);
  CHECK(v["step"].as_number() == 3.0);
  CHECK(!v["loss"].is_integer());
  CHECK(v["loss"].as_number() == 2.5);
  CHECK(v["name"].as_string() == "run");
  CHECK(v["ok"].as_bool());
  CHECK(v["big"].is_number());
  CHECK(!v["big"].is_integer());
  CHECK(v["tags"].size() == 3);
  CHECK(v["tags"][std::size_t{2}].is_null());
  CHECK(v.find("missing") == nullptr);
  CHECK(v.find("loss") != nullptr);
  // insertion order is kept
  CHECK(v.as_object().front().first == "step");
  CHECK(v.as_object().back().first == "tags");

  const json::value& c = v;
  CHECK_THROWS_AS(c["lr"], json::error);
  try {
    (void)c["lr"];
  } catch (const json::error& e) {
    CHECK(contains(e.what(), "\"lr\""));
  }
  CHECK_THROWS_AS(c["loss"].as_string(), json::error);
  CHECK_THROWS_AS(c["tags"][std::size_t{3}], json::error);
  CHECK_THROWS_AS(json::value(2.5).as_int(), json::error);
  CHECK(json::value(4.0).as_int() == 4);
  CHECK_THROWS_AS(json::value(1).size(), json::error);

  json::value a;
  a.push_back(1);
  a.push_back("x");
  CHECK(a.is_array());
  CHECK(a.size() == 2);
  CHECK(json::value(1) == json::value(1.0));
  CHECK(json::parse(R"({"a":[1,2,{"b":null}]})") ==
        json::value(json::object{{"a", json::array{1, 2, json::object{{"b", nullptr}}}}}));
}

TEST_CASE("dump: compact and indented") {
  json::value v = json::object{{"a", 1},
                               {"b", json::array{true, false, nullptr}},
                               {"c", json::object{}},
                               {"d", json::array{}},
                               {"e", 0.5}};
  CHECK(json::dump(v) == R"({"a":1,"b":[true,false,null],"c":{},"d":[],"e":0.5})");
  CHECK(json::dump(v, 2) ==
        "{\n"
        "  \"a\": 1,\n"
        "  \"b\": [\n"
        "    true,\n"
        "    false,\n"
        "    null\n"
        "  ],\n"
        "  \"c\": {},\n"
        "  \"d\": [],\n"
        "  \"e\": 0.5\n"
        "}");
  CHECK(json::dump(json::value(3.0)) == "3.0");
  CHECK(json::dump(json::value(-0.0)) == "-0.0");
  CHECK(json::dump(json::value(1e300)) == "1e+300");
  CHECK(json::dump(json::value(std::numeric_limits<std::int64_t>::min())) ==
        "-9223372036854775808");
  CHECK_THROWS_AS(json::dump(json::value(std::nan(""))), json::error);
  CHECK_THROWS_AS(json::dump(json::value(HUGE_VAL)), json::error);
}

TEST_CASE("numbers round-trip exactly") {
  const std::vector<double> doubles = {0.1,   1.0 / 3.0, 2.5, -7.25e-12, 6.02214076e23, 5e-324,
                                       1e308, -0.0,      3.0, 1e15,      3.197,         123456.789};
  for (double d : doubles) {
    const json::value back = json::parse(json::dump(json::value(d)));
    CHECK(!back.is_integer());
    CHECK(back.as_number() == d);
    CHECK(std::signbit(back.as_number()) == std::signbit(d));
  }
  const std::vector<std::int64_t> ints = {0,
                                          1,
                                          -1,
                                          9007199254740993,
                                          std::numeric_limits<std::int64_t>::max(),
                                          std::numeric_limits<std::int64_t>::min()};
  for (std::int64_t i : ints) {
    const json::value back = json::parse(json::dump(json::value(i)));
    CHECK(back.is_integer());
    CHECK(back.as_int() == i);
  }
  CHECK(json::parse("9223372036854775808").is_number());  // beyond int64: a double
  CHECK(!json::parse("9223372036854775808").is_integer());
  CHECK(json::parse("1E2").as_number() == 100.0);
  CHECK(json::parse("-0").as_number() == 0.0);
  CHECK(json::parse("-7").as_int() == -7);
  CHECK(json::parse("1e-400").as_number() == 0.0);
}

TEST_CASE("strings: escapes round-trip") {
  const std::string s = std::string("quote\" backslash\\ slash/ \b\f\n\r\t ctrl\x01\x1f nul") +
                        '\0' + " del\x7f utf8 \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  const std::string text = json::dump(json::value(s));
  CHECK(contains(text, R"(\")"));
  CHECK(contains(text, R"(\\)"));
  CHECK(contains(text, R"(\n)"));
  CHECK(contains(text, R"(\u0001)"));
  CHECK(contains(text, R"(\u001f)"));
  CHECK(contains(text, R"(\u0000)"));
  for (char c : text) CHECK(static_cast<unsigned char>(c) >= 0x20);
  CHECK(json::parse(text).as_string() == s);

  CHECK(json::parse(R"("\u00e9\u20AC\ud83d\ude00\/")").as_string() ==
        "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/");
  json::value keyed = json::object{{"we\"ird\nkey", 1}};
  CHECK(json::parse(json::dump(keyed)) == keyed);
}

TEST_CASE("parse: whole documents round-trip") {
  const std::string text = R"( {
    "run": {"mesh": [2, 2], "stage": "zero-2", "lr": 3e-4},
    "steps": [{"step": 1, "loss": 4.25}, {"step": 2, "loss": 4.125, "nested": [[[]]]}],
    "empty": {}, "t": true, "f": false, "n": null
  } )";
  const json::value v = json::parse(text);
  CHECK(v["run"]["mesh"][std::size_t{1}].as_int() == 2);
  CHECK(v["run"]["lr"].as_number() == 3e-4);
  CHECK(v["steps"].size() == 2);
  for (int indent : {-1, 0, 2, 4}) CHECK(json::parse(json::dump(v, indent)) == v);
  CHECK(json::dump(json::parse(json::dump(v))) == json::dump(v));
}

TEST_CASE("parse errors name the line and column") {
  struct bad {
    std::string_view text;
    std::string_view where;
    std::string_view what;
  };
  const std::vector<bad> cases = {
      // truncated
      {"", "line 1, column 1", "end of text"},
      {"{\"a\": 1", "line 1, column 8", "end of text"},
      {"[1, 2", "line 1, column 6", "end of text"},
      {"\"abc", "line 1, column 1", "unterminated string"},
      {"{\"a\"", "line 1, column 5", "expected ':'"},
      {"tru", "line 1, column 4", "end of text"},
      {"[1,\n  2,\n", "line 3, column 1", "end of text"},
      {"\"\\u12", "line 1, column 6", "\\u escape"},
      // bad escapes and strings
      {"\"a\\x\"", "line 1, column 3", "invalid escape"},
      {"\"\\u12G4\"", "line 1, column 6", "hex digit"},
      {"\"\\ud83d\"", "line 1, column 2", "surrogate"},
      {"\"\\ude00\"", "line 1, column 2", "surrogate"},
      {"\"tab\there\"", "line 1, column 5", "control character"},
      {"\"\xff\"", "line 1, column 2", "UTF-8"},
      {"\"\xc0\xaf\"", "line 1, column 2", "UTF-8"},
      // trailing commas
      {"[1, 2,]", "line 1, column 7", "trailing comma"},
      {"{\"a\": 1,\n}", "line 2, column 1", "trailing comma"},
      // trailing garbage
      {"{} x", "line 1, column 4", "after the JSON value"},
      {"1 2", "line 1, column 3", "after the JSON value"},
      {"[1]\n\n  ]", "line 3, column 3", "after the JSON value"},
      {"truex", "line 1, column 5", "after the JSON value"},
      // not JSON
      {"[01]", "line 1, column 2", "leading zero"},
      {"[+1]", "line 1, column 2", "expected a value"},
      {"[.5]", "line 1, column 2", "expected a value"},
      {"[1.]", "line 1, column 4", "digit"},
      {"[1e]", "line 1, column 4", "exponent"},
      {"[-]", "line 1, column 3", "digit"},
      {"[NaN]", "line 1, column 2", "expected a value"},
      {"['a']", "line 1, column 2", "expected a value"},
      {"{a: 1}", "line 1, column 2", "string key"},
      {"[1 2]", "line 1, column 4", "expected ',' or ']'"},
      {"{\"a\" 1}", "line 1, column 6", "expected ':'"},
      {"{\"a\": 1 \"b\": 2}", "line 1, column 9", "expected ',' or '}'"},
      {"// c\n1", "line 1, column 1", "expected a value"},
      {"nul", "line 1, column 4", "end of text"},
      {"nulL", "line 1, column 1", "invalid literal"},
      {"{\"k\": 1, \"k\": 2}", "line 1, column 10", "duplicate key"},
      {"1e400", "line 1, column 1", "too large"},
      {"[\"\xc3\xa9\", x]", "line 1, column 7", "expected a value"},  // columns count characters
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const std::string message = parse_error(c.text);
    CAPTURE(message);
    CHECK(contains(message, "zest: json::parse: "));
    CHECK(contains(message, std::string(c.where) + ": "));
    CHECK(contains(message, c.what));
  }
}

TEST_CASE("parse: depth limit 256") {
  const auto nested = [](int depth) {
    return std::string(static_cast<std::size_t>(depth), '[') +
           std::string(static_cast<std::size_t>(depth), ']');
  };
  CHECK_NOTHROW(json::parse(nested(256)));
  const std::string message = parse_error(nested(257));
  CHECK(contains(message, "line 1, column 257"));
  CHECK(contains(message, "deeper than 256"));
  CHECK(contains(parse_error(std::string(100000, '[')), "deeper than 256"));
}

TEST_CASE("writer: streaming and validation") {
  json::writer w;
  w.begin_object();
  w.key("step");
  w.value(7);
  w.key("loss");
  w.value(1.5);
  w.key("tokens");
  w.value(std::uint64_t{1} << 40);
  w.key("name");
  w.value("a\"b");
  w.key("none");
  w.value(nullptr);
  w.key("list");
  w.begin_array();
  w.value(true);
  w.value(std::string_view("x"));
  w.end_array();
  w.end_object();
  CHECK(w.complete());
  CHECK(
      w.str() ==
      R"({"step":7,"loss":1.5,"tokens":1099511627776,"name":"a\"b","none":null,"list":[true,"x"]})");

  json::writer indented(2);
  indented.begin_array();
  indented.value(1);
  indented.begin_object();
  indented.end_object();
  indented.end_array();
  CHECK(indented.str() == "[\n  1,\n  {}\n]");

  {
    json::writer m;
    CHECK_THROWS_AS(m.key("k"), json::error);  // key outside an object
    CHECK_THROWS_AS(m.str(), json::error);     // nothing written
    CHECK_THROWS_AS(m.end_array(), json::error);
  }
  {
    json::writer m;
    m.begin_object();
    CHECK_THROWS_AS(m.value(1), json::error);  // value without a key
    CHECK_THROWS_AS(m.end_array(), json::error);
    m.key("a");
    CHECK_THROWS_AS(m.key("b"), json::error);
    CHECK_THROWS_AS(m.end_object(), json::error);
    m.value(1);
    CHECK_THROWS_AS(m.str(), json::error);  // unclosed
    m.end_object();
    CHECK_THROWS_AS(m.value(2), json::error);  // a second top-level value
    CHECK(m.str() == R"({"a":1})");
  }
  {
    json::writer m;
    m.begin_array();
    CHECK_THROWS_AS(m.value(std::numeric_limits<double>::infinity()), json::error);
    CHECK_THROWS_AS(m.key("k"), json::error);
  }
}
