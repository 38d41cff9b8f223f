// The input format of session_fuzz, shared with the seed generator
// (session_seeds.cc) so the two cannot drift apart.
//
//   byte 0        mode (kMode* bits)
//   then chunks   u16 little-endian length, then that many bytes; the last chunk
//                 may be shorter than its length says (it ends with the input).
//                 A zero-length chunk sends nothing: the harness lets 2 ms pass
//                 with the server running, so get/wait timeouts of 0 or 1 ms fire
//                 (longer ones never do within a run). Only the first
//                 kMaxSleeps empty chunks sleep; later ones are ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddp::fuzz {

inline constexpr std::uint8_t kModeToken = 1;       // the server requires a token
inline constexpr std::uint8_t kModeNoRead = 2;      // the client reads replies only at the end
inline constexpr std::uint8_t kModeTinyLimits = 4;  // 64 B keys, 256 B values, 1 KiB frames
// With kModeToken: once the server answered the client's hello, the harness sends
// the correct auth frame for the two nonces (the fuzzer cannot compute an HMAC).
inline constexpr std::uint8_t kModeAuthenticate = 8;
inline constexpr std::size_t kMaxChunk = 0xFFFF;
inline constexpr int kMaxSleeps = 4;

class SessionInput {
 public:
  SessionInput(const std::uint8_t* data, std::size_t size)
      : rest_(reinterpret_cast<const char*>(data), size) {
    if (!rest_.empty()) {
      mode_ = static_cast<std::uint8_t>(rest_[0]);
      rest_.remove_prefix(1);
    }
  }

  std::uint8_t mode() const { return mode_; }

  // The next chunk; false at the end of the input.
  bool next(std::string_view& chunk) {
    if (rest_.size() < 2) return false;
    std::size_t length = static_cast<std::uint8_t>(rest_[0]) |
                         (static_cast<std::size_t>(static_cast<std::uint8_t>(rest_[1])) << 8);
    rest_.remove_prefix(2);
    chunk = rest_.substr(0, length);
    rest_.remove_prefix(chunk.size());
    return true;
  }

 private:
  std::string_view rest_;
  std::uint8_t mode_ = 0;
};

// Appends one chunk (at most kMaxChunk bytes) to an input being built.
inline void append_chunk(std::string& input, std::string_view chunk) {
  input.push_back(static_cast<char>(chunk.size() & 0xFF));
  input.push_back(static_cast<char>((chunk.size() >> 8) & 0xFF));
  input.append(chunk);
}

}  // namespace ddp::fuzz
