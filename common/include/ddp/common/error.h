// Error hierarchy of ddp. Every error thrown across a public API boundary is a
// ddp::Error carrying its kind (what went wrong) and its origin (where: a
// component and operation such as "TcpStore::get"). Catch ddp::Error for all of
// them, or a subclass for one kind.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp {

enum class ErrorKind {
  kInvalidArgument,  // the caller passed something wrong (a flag, a size, a key)
  kTimeout,          // a deadline passed before the operation completed
  kNetwork,          // a peer or server is unreachable or the connection broke
  kProtocol,         // bytes on the wire do not follow the protocol
  kAuth,             // authentication failed or was required and missing
  kBackend,          // a collective backend (Gloo, NCCL) failed
  kShutdown,         // the operation was cancelled because a server or group shut down
  kGroupChanged,     // the job's membership changed under a process group: re-form it
  kInternal,         // a bug or an unexpected system failure
};

std::string_view to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  // what() reads "<origin>: <message>" (or just the message when origin is empty).
  Error(ErrorKind kind, std::string origin, const std::string& message);

  ErrorKind kind() const noexcept { return kind_; }
  const std::string& origin() const noexcept { return origin_; }

 private:
  ErrorKind kind_;
  std::string origin_;
};

#define DDP_DEFINE_ERROR(Name, Kind)                            \
  class Name : public Error {                                   \
   public:                                                      \
    Name(std::string origin, const std::string& message)        \
        : Error(ErrorKind::Kind, std::move(origin), message) {} \
  }

DDP_DEFINE_ERROR(InvalidArgument, kInvalidArgument);
DDP_DEFINE_ERROR(TimeoutError, kTimeout);
DDP_DEFINE_ERROR(NetworkError, kNetwork);
DDP_DEFINE_ERROR(ProtocolError, kProtocol);
DDP_DEFINE_ERROR(AuthError, kAuth);
DDP_DEFINE_ERROR(BackendError, kBackend);
DDP_DEFINE_ERROR(ShutdownError, kShutdown);
// A process group's round ended (a node was lost or joined, a worker elsewhere
// was restarted) while this worker keeps running: ProcessGroup::abort() failed
// its operations. A worker that recovers in place catches it and calls
// ddp::reform() (ddp/worker/recovery.h).
DDP_DEFINE_ERROR(GroupChanged, kGroupChanged);
DDP_DEFINE_ERROR(InternalError, kInternal);

#undef DDP_DEFINE_ERROR

// Rethrows a ddp::Error of the same kind and origin with a different message.
[[noreturn]] void throw_error(ErrorKind kind, std::string origin, const std::string& message);

// The message of a captured exception: what() of a std::exception, "unknown
// error" for anything else. `error` must not be null. Does not throw.
std::string what_of(const std::exception_ptr& error);

}  // namespace ddp
