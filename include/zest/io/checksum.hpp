// zest/io/checksum.hpp — the 64-bit checksum of checkpoint blocks (XXH64).
//
//   std::uint64_t h = zest::io::xxh64(std::as_bytes(std::span(data)));
//
//   zest::io::xxh64_state s;           // the same value, fed in pieces of any size
//   s.update(first); s.update(second);
//   std::uint64_t h2 = s.digest();
//
// XXH64 (Yann Collet's public algorithm, written here from its specification): four
// independent multiply-rotate lanes over 32-byte stripes, then a merge and an avalanche.
// It runs at memory speed (several GB/s on one core), so checksumming a 100 MB block costs
// about as much as copying it, and every input bit affects every output bit. Values match
// the reference implementation (the tests check published and generated vectors), so a
// file can be verified with any xxh64 tool. Input is read as little-endian words on every
// host.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace zest::io {

namespace detail {

inline constexpr std::uint64_t xxh_p1 = 0x9E3779B185EBCA87ULL;
inline constexpr std::uint64_t xxh_p2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr std::uint64_t xxh_p3 = 0x165667B19E3779F9ULL;
inline constexpr std::uint64_t xxh_p4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr std::uint64_t xxh_p5 = 0x27D4EB2F165667C5ULL;

inline std::uint64_t byte_swap64(std::uint64_t x) {
  x = ((x & 0x00FF00FF00FF00FFULL) << 8U) | ((x >> 8U) & 0x00FF00FF00FF00FFULL);
  x = ((x & 0x0000FFFF0000FFFFULL) << 16U) | ((x >> 16U) & 0x0000FFFF0000FFFFULL);
  return (x << 32U) | (x >> 32U);
}

inline std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = byte_swap64(v);
  return v;
}
inline std::uint32_t read_le32(const std::byte* p) {
  std::uint32_t v = 0;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) {
    v = (v >> 24U) | ((v >> 8U) & 0xFF00U) | ((v << 8U) & 0xFF0000U) | (v << 24U);
  }
  return v;
}

inline std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t input) {
  acc += input * xxh_p2;
  acc = std::rotl(acc, 31);
  return acc * xxh_p1;
}
inline std::uint64_t xxh_merge(std::uint64_t acc, std::uint64_t lane) {
  acc ^= xxh_round(0, lane);
  return acc * xxh_p1 + xxh_p4;
}

}  // namespace detail

// Incremental XXH64: update() with consecutive pieces, then digest() (which does not change
// the state, so a running value can be read at any point).
class xxh64_state {
 public:
  explicit xxh64_state(std::uint64_t seed = 0)
      : seed_(seed),
        lanes_{seed + detail::xxh_p1 + detail::xxh_p2, seed + detail::xxh_p2, seed,
               seed - detail::xxh_p1} {}

  void update(std::span<const std::byte> data) {
    const std::byte* p = data.data();
    std::size_t n = data.size();
    total_ += n;
    if (held_ > 0) {  // complete the stripe left over from the last call first
      const std::size_t take = std::min(n, stripe - held_);
      std::memcpy(pending_.data() + held_, p, take);
      held_ += take;
      p += take;
      n -= take;
      if (held_ < stripe) return;
      consume(pending_.data());
      held_ = 0;
    }
    // The hot loop: four lanes, one 8-byte word each per stripe, kept in registers.
    std::uint64_t a = lanes_[0], b = lanes_[1], c = lanes_[2], d = lanes_[3];
    while (n >= stripe) {
      a = detail::xxh_round(a, detail::read_le64(p));
      b = detail::xxh_round(b, detail::read_le64(p + 8));
      c = detail::xxh_round(c, detail::read_le64(p + 16));
      d = detail::xxh_round(d, detail::read_le64(p + 24));
      p += stripe;
      n -= stripe;
    }
    lanes_ = {a, b, c, d};
    if (n > 0) {
      std::memcpy(pending_.data(), p, n);
      held_ = n;
    }
  }
  void update(std::string_view text) { update(std::as_bytes(std::span(text.data(), text.size()))); }

  std::uint64_t digest() const {
    std::uint64_t h = 0;
    if (total_ >= stripe) {
      h = std::rotl(lanes_[0], 1) + std::rotl(lanes_[1], 7) + std::rotl(lanes_[2], 12) +
          std::rotl(lanes_[3], 18);
      for (const std::uint64_t lane : lanes_) h = detail::xxh_merge(h, lane);
    } else {
      h = seed_ + detail::xxh_p5;
    }
    h += total_;
    const std::byte* p = pending_.data();
    std::size_t n = held_;
    for (; n >= 8; n -= 8, p += 8) {
      h ^= detail::xxh_round(0, detail::read_le64(p));
      h = std::rotl(h, 27) * detail::xxh_p1 + detail::xxh_p4;
    }
    if (n >= 4) {
      h ^= static_cast<std::uint64_t>(detail::read_le32(p)) * detail::xxh_p1;
      h = std::rotl(h, 23) * detail::xxh_p2 + detail::xxh_p3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; --n, ++p) {
      h ^= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(*p)) * detail::xxh_p5;
      h = std::rotl(h, 11) * detail::xxh_p1;
    }
    h ^= h >> 33U;
    h *= detail::xxh_p2;
    h ^= h >> 29U;
    h *= detail::xxh_p3;
    h ^= h >> 32U;
    return h;
  }

  std::uint64_t bytes_seen() const { return total_; }

 private:
  static constexpr std::size_t stripe = 32;

  void consume(const std::byte* p) {
    for (std::size_t i = 0; i < 4; ++i)
      lanes_[i] = detail::xxh_round(lanes_[i], detail::read_le64(p + 8 * i));
  }

  std::uint64_t seed_;
  std::array<std::uint64_t, 4> lanes_;
  std::array<std::byte, stripe> pending_{};
  std::size_t held_ = 0;
  std::uint64_t total_ = 0;
};

// XXH64 of a whole buffer.
inline std::uint64_t xxh64(std::span<const std::byte> data, std::uint64_t seed = 0) {
  xxh64_state s(seed);
  s.update(data);
  return s.digest();
}

// "xxh64:" and 16 lowercase hex digits: how checkpoint manifests spell a checksum.
inline std::string format_checksum(std::uint64_t h) {
  std::string out = "xxh64:0000000000000000";
  constexpr std::string_view digits = "0123456789abcdef";
  for (std::size_t i = 0; i < 16; ++i) out[out.size() - 1 - i] = digits[(h >> (4 * i)) & 0xFU];
  return out;
}

// The inverse of format_checksum; false when `text` is not in that form.
inline bool parse_checksum(std::string_view text, std::uint64_t& out) {
  constexpr std::string_view prefix = "xxh64:";
  if (text.size() != prefix.size() + 16 || text.substr(0, prefix.size()) != prefix) return false;
  std::uint64_t h = 0;
  for (const char c : text.substr(prefix.size())) {
    std::uint64_t digit = 0;
    if (c >= '0' && c <= '9') digit = static_cast<std::uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') digit = static_cast<std::uint64_t>(c - 'a' + 10);
    else return false;
    h = (h << 4U) | digit;
  }
  out = h;
  return true;
}

}  // namespace zest::io
