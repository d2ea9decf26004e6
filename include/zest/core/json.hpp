// zest/core/json.hpp — a small, strict JSON value, parser and writer (RFC 8259).
//
//   auto v = zest::json::parse(R"({"step": 3, "loss": 2.5, "tags": ["a", "b"]})");
//   v["step"].as_int();                       // 3 (exact: the text was an integer)
//   v["loss"].as_number();                    // 2.5
//   v.find("lr");                             // nullptr: no such key
//   zest::json::value run;                    // null ...
//   run["mesh"] = "dp=2,tp=2";                // ... becomes an object on the first key
//   zest::json::dump(run, 2);                 // indented text; dump(run) is compact
//
//   zest::json::writer w(2);                  // streams straight into a string
//   w.begin_object(); w.key("step"); w.value(3); w.end_object();
//   w.str();                                  // "{\n  \"step\": 3\n}"
//
// Values:
// - numbers are doubles; a number whose text was an integer that fits in int64 (or that
//   was built from an integer) also keeps that integer exactly (is_integer(), as_int());
// - objects keep their members in insertion order (a std::vector of pairs), so a dumped
//   log or config reads in the order it was written;
// - the parser rejects anything RFC 8259 does not allow (trailing commas, comments, single
//   quotes, leading zeros, "+1", ".5", NaN, raw control characters in strings, bad
//   escapes, lone surrogates, invalid UTF-8, text after the value), nesting deeper than
//   256, and duplicate keys (allowed by the RFC, but in a config or a log they are a
//   mistake: find() would silently pick one). Every parse error reads
//   "zest: json::parse: line L, column C: <problem>" (columns count characters, from 1);
// - dump() and writer print doubles in their shortest form that parses back to the same
//   double (std::to_chars), with ".0" added to integral ones so that they stay doubles,
//   and integers exactly; they refuse NaN and infinities (JSON has no spelling for them).
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "zest/core/error.hpp"

namespace zest::json {

// Everything that goes wrong in this header: malformed text, a missing key, a value of
// another type than asked for, a writer used out of order.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class value;
using array = std::vector<value>;
using object = std::vector<std::pair<std::string, value>>;

enum class kind : std::uint8_t { null, boolean, number, string, array, object };

inline const char* kind_name(kind k) {
  switch (k) {
    case kind::null: return "null";
    case kind::boolean: return "a bool";
    case kind::number: return "a number";
    case kind::string: return "a string";
    case kind::array: return "an array";
    case kind::object: return "an object";
  }
  return "?";
}

class value {
 public:
  using array_type = json::array;
  using object_type = json::object;

  value() = default;
  value(std::nullptr_t) {}
  value(bool b) : data_(b) {}
  template <class I>
  requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) value(I i) {
    if constexpr (std::is_signed_v<I>) {
      data_ = static_cast<std::int64_t>(i);
    } else if (static_cast<std::uint64_t>(i) <=
               static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      data_ = static_cast<std::int64_t>(i);
    } else {
      data_ = static_cast<double>(i);  // beyond int64: kept as the nearest double
    }
  }
  template <class F>
  requires std::is_floating_point_v<F> value(F d) : data_(static_cast<double>(d)) {}
  value(const char* s) : data_(std::string(s)) {}
  value(std::string_view s) : data_(std::string(s)) {}
  value(std::string s) : data_(std::move(s)) {}
  value(array_type a) : data_(std::move(a)) {}
  value(object_type o) : data_(std::move(o)) {}

  json::kind kind() const {
    switch (data_.index()) {
      case 0: return kind::null;
      case 1: return kind::boolean;
      case 2:
      case 3: return kind::number;
      case 4: return kind::string;
      case 5: return kind::array;
      default: return kind::object;
    }
  }
  const char* type_name() const { return kind_name(kind()); }

  bool is_null() const { return data_.index() == 0; }
  bool is_bool() const { return data_.index() == 1; }
  bool is_number() const { return data_.index() == 2 || data_.index() == 3; }
  // True for a number held as an exact int64 (its text was an integer, or it was built
  // from one).
  bool is_integer() const { return data_.index() == 3; }
  bool is_string() const { return data_.index() == 4; }
  bool is_array() const { return data_.index() == 5; }
  bool is_object() const { return data_.index() == 6; }

  bool as_bool() const { return get<bool>("a bool"); }
  double as_number() const {
    if (const auto* i = std::get_if<std::int64_t>(&data_)) return static_cast<double>(*i);
    return get<double>("a number");
  }
  // The exact integer; a double is accepted when it is integral and within int64.
  std::int64_t as_int() const {
    if (const auto* i = std::get_if<std::int64_t>(&data_)) return *i;
    if (const auto* d = std::get_if<double>(&data_)) {
      // 2^63 is exactly representable; every integral double below it converts exactly.
      if (std::trunc(*d) == *d && *d >= -9223372036854775808.0 && *d < 9223372036854775808.0)
        return static_cast<std::int64_t>(*d);
      throw error(zest::detail::message("zest: json: ", number_text(*d), " is not an int64"));
    }
    throw wrong_type("an integer");
  }
  const std::string& as_string() const { return get<std::string>("a string"); }
  std::string& as_string() { return get<std::string>("a string"); }
  const array_type& as_array() const { return get<array_type>("an array"); }
  array_type& as_array() { return get<array_type>("an array"); }
  const object_type& as_object() const { return get<object_type>("an object"); }
  object_type& as_object() { return get<object_type>("an object"); }

  // The member named `key` (the first, should there be several); nullptr when there is
  // none or when this is not an object.
  const value* find(std::string_view key) const {
    const auto* o = std::get_if<object_type>(&data_);
    if (o == nullptr) return nullptr;
    for (const auto& [k, v] : *o)
      if (k == key) return &v;
    return nullptr;
  }
  value* find(std::string_view key) {
    return const_cast<value*>(static_cast<const value&>(*this).find(key));
  }
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  // The member named `key`; throws json::error naming the key when there is none.
  const value& operator[](std::string_view key) const {
    const auto& o = as_object();
    for (const auto& [k, v] : o)
      if (k == key) return v;
    throw error(zest::detail::message("zest: json: no key \"", key,
                                      "\" in the object (keys: ", key_list(o), ")"));
  }
  // The member named `key`, appended as null when there is none; a null value becomes an
  // empty object first.
  value& operator[](std::string key) {
    if (is_null()) data_ = object_type{};
    auto& o = as_object();
    for (auto& [k, v] : o)
      if (k == key) return v;
    o.emplace_back(std::move(key), value{});
    return o.back().second;
  }

  // Number of elements of an array or members of an object.
  std::size_t size() const {
    if (const auto* a = std::get_if<array_type>(&data_)) return a->size();
    if (const auto* o = std::get_if<object_type>(&data_)) return o->size();
    throw wrong_type("an array or an object");
  }
  const value& operator[](std::size_t i) const {
    const auto& a = as_array();
    if (i >= a.size())
      throw error(zest::detail::message("zest: json: index ", i, " out of range (array of ",
                                        a.size(), " elements)"));
    return a[i];
  }
  value& operator[](std::size_t i) {
    return const_cast<value&>(static_cast<const value&>(*this)[i]);
  }
  // Appends to an array; a null value becomes an empty array first.
  void push_back(value v) {
    if (is_null()) data_ = array_type{};
    as_array().push_back(std::move(v));
  }

  // Structural equality; numbers compare by value (1 == 1.0), objects member by member in
  // order.
  friend bool operator==(const value& a, const value& b) {
    if (a.is_number() && b.is_number()) {
      if (a.is_integer() && b.is_integer()) return a.as_int() == b.as_int();
      return a.as_number() == b.as_number();
    }
    return a.data_ == b.data_;
  }

  // Shortest text that parses back to `d` (finite only), with ".0" added to an integral
  // value so that it reads back as a double.
  static std::string number_text(double d) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
    if (ec != std::errc{}) return "?";
    std::string s(buf, end);
    if (std::isfinite(d) && s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  }

 private:
  template <class T>
  const T& get(const char* wanted) const {
    if (const auto* p = std::get_if<T>(&data_)) return *p;
    throw wrong_type(wanted);
  }
  template <class T>
  T& get(const char* wanted) {
    if (auto* p = std::get_if<T>(&data_)) return *p;
    throw wrong_type(wanted);
  }
  error wrong_type(const char* wanted) const {
    return error(zest::detail::message("zest: json: expected ", wanted, ", found ", type_name()));
  }
  static std::string key_list(const object_type& o) {
    std::string s;
    for (std::size_t i = 0; i < o.size() && i < 12; ++i)
      s += (i ? ", \"" : "\"") + o[i].first + '"';
    if (o.size() > 12) s += ", ...";
    return o.empty() ? std::string("none") : s;
  }

  // index: 0 null, 1 bool, 2 double, 3 int64, 4 string, 5 array, 6 object.
  std::variant<std::monostate, bool, double, std::int64_t, std::string, array_type, object_type>
      data_;
};

// ---------------------------------------------------------------------------------------
// writer

// Writes JSON text into a string as it goes. indent < 0: compact; indent >= 0: one element
// per line, nested `indent` spaces deeper (as dump). Throws json::error when called out of
// order: a key outside an object, a value where a key is due, an end_* that does not match,
// a second top-level value, str() before every container is closed.
class writer {
 public:
  explicit writer(int indent = -1) : indent_(indent) {}

  void begin_object() { open('{', true); }
  void end_object() { close('}', true); }
  void begin_array() { open('[', false); }
  void end_array() { close(']', false); }

  void key(std::string_view k) {
    if (stack_.empty() || !stack_.back().is_object) fail("key(\"", k, "\") outside an object");
    auto& f = stack_.back();
    if (f.key_pending) fail("key(\"", k, "\") right after another key");
    separate(f);
    ++f.count;
    f.key_pending = true;
    write_string(k);
    out_ += indent_ >= 0 ? ": " : ":";
  }

  void value(double d) {
    if (!std::isfinite(d))
      fail("cannot write the non-finite number ", d, " (JSON has no spelling for it)");
    start_value();
    out_ += json::value::number_text(d);
  }
  void value(float d) { value(static_cast<double>(d)); }
  template <class I>
  requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) void value(I i) {
    start_value();
    char buf[32];
    auto end = std::to_chars(buf, buf + sizeof buf, i).ptr;
    out_.append(buf, end);
  }
  void value(bool b) {
    start_value();
    out_ += b ? "true" : "false";
  }
  void value(std::string_view s) {
    start_value();
    write_string(s);
  }
  void value(const char* s) { value(std::string_view(s)); }
  void value(const std::string& s) { value(std::string_view(s)); }
  void value(std::nullptr_t) {
    start_value();
    out_ += "null";
  }
  // A whole json::value, laid out like the rest of the writer's text.
  void value(const json::value& v) {
    switch (v.kind()) {
      case kind::null: return value(nullptr);
      case kind::boolean: return value(v.as_bool());
      case kind::number:
        if (v.is_integer()) return value(v.as_int());
        return value(v.as_number());
      case kind::string: return value(std::string_view(v.as_string()));
      case kind::array:
        begin_array();
        for (const auto& e : v.as_array()) value(e);
        return end_array();
      case kind::object:
        begin_object();
        for (const auto& [k, e] : v.as_object()) {
          key(k);
          value(e);
        }
        return end_object();
    }
  }

  // True once one top-level value is complete.
  bool complete() const { return done_ && stack_.empty(); }
  const std::string& str() const {
    if (!complete()) {
      if (stack_.empty()) fail("str() before any value was written");
      fail("str() with ", stack_.size(), " unclosed container", stack_.size() == 1 ? "" : "s");
    }
    return out_;
  }

  // `s` as a JSON string literal: quotes, backslash and control characters escaped
  // (\n, \t, ... where JSON has a short escape, \u00XX otherwise); other bytes as they are.
  static void append_quoted(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out += '"';
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (u < 0x20 || u == 0x7f) {
            out += "\\u00";
            out += hex[u >> 4];
            out += hex[u & 15];
          } else {
            out += c;
          }
      }
    }
    out += '"';
  }

 private:
  struct frame {
    bool is_object;
    bool key_pending = false;
    std::size_t count = 0;
  };

  template <class... Parts>
  [[noreturn]] static void fail(Parts&&... parts) {
    throw error(zest::detail::message("zest: json::writer: ", std::forward<Parts>(parts)...));
  }

  void newline(std::size_t depth) {
    if (indent_ < 0) return;
    out_ += '\n';
    out_.append(depth * static_cast<std::size_t>(indent_), ' ');
  }
  void separate(frame& f) {
    if (f.count > 0) out_ += ',';
    newline(stack_.size());
  }
  void start_value() {
    if (stack_.empty()) {
      if (done_) fail("a second top-level value");
      done_ = true;
      return;
    }
    auto& f = stack_.back();
    if (f.is_object) {
      if (!f.key_pending) fail("a value in an object without a key before it");
      f.key_pending = false;
      return;
    }
    separate(f);
    ++f.count;
  }
  void open(char c, bool is_object) {
    start_value();
    out_ += c;
    stack_.push_back(frame{is_object});
  }
  void close(char c, bool is_object) {
    const char* name = is_object ? "end_object()" : "end_array()";
    if (stack_.empty()) fail(name, " without a matching begin");
    const auto& f = stack_.back();
    if (f.is_object != is_object) fail(name, " inside ", f.is_object ? "an object" : "an array");
    if (f.key_pending) fail(name, " right after a key (its value is missing)");
    const bool empty = f.count == 0;
    stack_.pop_back();
    if (!empty) newline(stack_.size());
    out_ += c;
  }
  void write_string(std::string_view s) { append_quoted(out_, s); }

  int indent_;
  bool done_ = false;
  std::vector<frame> stack_;
  std::string out_;
};

// The text of `v`: compact when indent < 0, else one element per line, `indent` spaces per
// level. Throws json::error for a non-finite number.
inline std::string dump(const value& v, int indent = -1) {
  writer w(indent);
  w.value(v);
  return w.str();
}

// ---------------------------------------------------------------------------------------
// parser

namespace detail {

class parser {
 public:
  static constexpr int max_depth = 256;

  explicit parser(std::string_view text) : text_(text) {}

  value parse_document() {
    skip_space();
    value v = parse_value(0);
    skip_space();
    if (pos_ < text_.size()) fail(pos_, "unexpected ", describe(pos_), " after the JSON value");
    return v;
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(std::size_t at, Parts&&... parts) const {
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < at && i < text_.size(); ++i) {
      const auto u = static_cast<unsigned char>(text_[i]);
      if (u == '\n') {
        ++line;
        column = 1;
      } else if ((u & 0xC0) != 0x80) {  // count characters, not UTF-8 continuation bytes
        ++column;
      }
    }
    throw error(zest::detail::message("zest: json::parse: line ", line, ", column ", column, ": ",
                                      std::forward<Parts>(parts)...));
  }

  std::string describe(std::size_t at) const {
    if (at >= text_.size()) return "end of text";
    const auto u = static_cast<unsigned char>(text_[at]);
    if (u >= 0x20 && u < 0x7f) return std::string("'") + static_cast<char>(u) + "'";
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("byte 0x") + hex[u >> 4] + hex[u & 15];
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_space() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  value parse_value(int depth) {
    if (at_end()) fail(pos_, "unexpected end of text, expected a value");
    switch (peek()) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': return value(parse_string());
      case 't': return parse_literal("true", value(true));
      case 'f': return parse_literal("false", value(false));
      case 'n': return parse_literal("null", value());
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail(pos_, "expected a value, found ", describe(pos_));
    }
  }

  value parse_literal(std::string_view word, value v) {
    for (std::size_t i = 0; i < word.size(); ++i) {
      if (pos_ + i >= text_.size()) fail(pos_ + i, "unexpected end of text in '", word, "'");
      if (text_[pos_ + i] != word[i]) fail(pos_, "invalid literal (expected '", word, "')");
    }
    pos_ += word.size();
    return v;
  }

  void check_depth(int depth, std::size_t at) const {
    if (depth > max_depth) fail(at, "nesting deeper than ", max_depth, " levels");
  }

  value parse_array(int depth) {
    check_depth(depth, pos_);
    ++pos_;  // '['
    array a;
    skip_space();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return value(std::move(a));
    }
    while (true) {
      skip_space();
      if (!at_end() && peek() == ']') fail(pos_, "trailing comma before ']'");
      a.push_back(parse_value(depth));
      skip_space();
      if (at_end()) fail(pos_, "unexpected end of text in an array, expected ',' or ']'");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return value(std::move(a));
      }
      fail(pos_, "expected ',' or ']' in an array, found ", describe(pos_));
    }
  }

  value parse_object(int depth) {
    check_depth(depth, pos_);
    ++pos_;  // '{'
    object o;
    skip_space();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return value(std::move(o));
    }
    while (true) {
      skip_space();
      if (at_end()) fail(pos_, "unexpected end of text in an object, expected a key");
      if (peek() == '}') fail(pos_, "trailing comma before '}'");
      if (peek() != '"') fail(pos_, "expected a string key, found ", describe(pos_));
      const std::size_t key_at = pos_;
      std::string k = parse_string();
      for (const auto& member : o)
        if (member.first == k) fail(key_at, "duplicate key \"", k, "\"");
      skip_space();
      if (at_end()) fail(pos_, "unexpected end of text in an object, expected ':'");
      if (peek() != ':') fail(pos_, "expected ':' after a key, found ", describe(pos_));
      ++pos_;
      skip_space();
      value v = parse_value(depth);
      o.emplace_back(std::move(k), std::move(v));
      skip_space();
      if (at_end()) fail(pos_, "unexpected end of text in an object, expected ',' or '}'");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return value(std::move(o));
      }
      fail(pos_, "expected ',' or '}' in an object, found ", describe(pos_));
    }
  }

  unsigned hex4(std::size_t at) const {
    unsigned cp = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      if (at + i >= text_.size()) fail(at + i, "unexpected end of text in a \\u escape");
      const char c = text_[at + i];
      cp <<= 4;
      if (c >= '0' && c <= '9') {
        cp |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        cp |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        cp |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail(at + i, "invalid hex digit ", describe(at + i), " in a \\u escape");
      }
    }
    return cp;
  }

  static void append_utf8(std::string& s, unsigned cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Length of the well-formed UTF-8 sequence at `at` (1 to 4 bytes), or 0.
  std::size_t utf8_length(std::size_t at) const {
    const auto byte = [&](std::size_t i) -> unsigned {
      return at + i < text_.size() ? static_cast<unsigned char>(text_[at + i]) : 0u;
    };
    const unsigned b0 = byte(0);
    const auto cont = [&](std::size_t i) { return (byte(i) & 0xC0) == 0x80; };
    if (b0 < 0x80) return 1;
    if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
    if (b0 >= 0xE0 && b0 <= 0xEF) {
      const unsigned b1 = byte(1);
      if (b0 == 0xE0 && b1 < 0xA0) return 0;   // overlong
      if (b0 == 0xED && b1 >= 0xA0) return 0;  // surrogate
      return cont(1) && cont(2) ? 3 : 0;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
      const unsigned b1 = byte(1);
      if (b0 == 0xF0 && b1 < 0x90) return 0;   // overlong
      if (b0 == 0xF4 && b1 >= 0x90) return 0;  // beyond U+10FFFF
      return cont(1) && cont(2) && cont(3) ? 4 : 0;
    }
    return 0;
  }

  std::string parse_string() {
    const std::size_t open = pos_;
    ++pos_;  // '"'
    std::string s;
    while (true) {
      if (at_end()) fail(open, "unterminated string (end of text before its closing '\"')");
      const char c = peek();
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return s;
      }
      if (u < 0x20)
        fail(pos_, "raw control character ", describe(pos_), " in a string (escape it)");
      if (c == '\\') {
        const std::size_t esc = pos_;
        ++pos_;
        if (at_end()) fail(pos_, "unexpected end of text in an escape");
        const char e = peek();
        ++pos_;
        switch (e) {
          case '"': s += '"'; break;
          case '\\': s += '\\'; break;
          case '/': s += '/'; break;
          case 'b': s += '\b'; break;
          case 'f': s += '\f'; break;
          case 'n': s += '\n'; break;
          case 'r': s += '\r'; break;
          case 't': s += '\t'; break;
          case 'u': {
            unsigned cp = hex4(pos_);
            pos_ += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail(esc, "lone low surrogate in a \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (pos_ + 1 >= text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
                fail(esc, "high surrogate not followed by a \\u low surrogate");
              const unsigned lo = hex4(pos_ + 2);
              if (lo < 0xDC00 || lo > 0xDFFF)
                fail(pos_, "high surrogate not followed by a low surrogate");
              pos_ += 6;
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(s, cp);
            break;
          }
          default: fail(esc, "invalid escape: ", describe(esc + 1), " after '\\' in a string");
        }
        continue;
      }
      const std::size_t n = utf8_length(pos_);
      if (n == 0) fail(pos_, "invalid UTF-8 ", describe(pos_), " in a string");
      s.append(text_.substr(pos_, n));
      pos_ += n;
    }
  }

  value parse_number() {
    const std::size_t start = pos_;
    const auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (!digit()) fail(pos_, "expected a digit in a number, found ", describe(pos_));
    if (peek() == '0') {
      ++pos_;
      if (digit()) fail(pos_ - 1, "leading zero in a number");
    } else {
      while (digit()) ++pos_;
    }
    if (!at_end() && peek() == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail(pos_, "expected a digit after '.', found ", describe(pos_));
      while (digit()) ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (!digit()) fail(pos_, "expected a digit in an exponent, found ", describe(pos_));
      while (digit()) ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    // "-0" is kept as the double -0.0: int64 has no negative zero.
    if (integral && !(last - first == 2 && first[0] == '-' && first[1] == '0')) {
      std::int64_t i = 0;
      const auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc{} && r.ptr == last) return value(i);
      // beyond int64: falls through to a double
    }
    double d = 0;
    const auto r = std::from_chars(first, last, d);
    if (r.ec == std::errc::result_out_of_range) {
      // Underflow reads as zero (as strtod does); overflow has no double.
      bool underflow = false;
      for (const char* p = first; p != last; ++p)
        if (*p == 'e' || *p == 'E') underflow = p + 1 != last && p[1] == '-';
      if (!underflow)
        fail(start, "number ", std::string_view(first, last - first), " is too large for a double");
      return value(std::signbit(d) || first[0] == '-' ? -0.0 : 0.0);
    }
    if (r.ec != std::errc{} || r.ptr != last)
      fail(start, "invalid number ", std::string_view(first, last - first));
    return value(d);
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace detail

// Parses one JSON text (RFC 8259, see the top of this header). Throws json::error
// "zest: json::parse: line L, column C: <problem>" for malformed, truncated or trailing text.
inline value parse(std::string_view text) { return detail::parser(text).parse_document(); }

}  // namespace zest::json
