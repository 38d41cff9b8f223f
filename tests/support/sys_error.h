// The error that test and benchmark helpers throw when a system call fails.
//
// Ownership and blocking: none. Thread-safety: reads errno, which is per
// thread; call it right after the failed call.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddp::test {

// std::runtime_error("<what>: <strerror(errno)>").
inline std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

}  // namespace ddp::test
