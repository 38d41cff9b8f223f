#include "ddp/common/error.h"

namespace ddp {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "InvalidArgument";
    case ErrorKind::kTimeout:
      return "TimeoutError";
    case ErrorKind::kNetwork:
      return "NetworkError";
    case ErrorKind::kProtocol:
      return "ProtocolError";
    case ErrorKind::kAuth:
      return "AuthError";
    case ErrorKind::kBackend:
      return "BackendError";
    case ErrorKind::kShutdown:
      return "ShutdownError";
    case ErrorKind::kGroupChanged:
      return "GroupChanged";
    case ErrorKind::kInternal:
      return "InternalError";
  }
  return "Error";
}

namespace {
std::string compose(const std::string& origin, const std::string& message) {
  return origin.empty() ? message : origin + ": " + message;
}
}  // namespace

Error::Error(ErrorKind kind, std::string origin, const std::string& message)
    : std::runtime_error(compose(origin, message)), kind_(kind), origin_(std::move(origin)) {}

void throw_error(ErrorKind kind, std::string origin, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      throw InvalidArgument(std::move(origin), message);
    case ErrorKind::kTimeout:
      throw TimeoutError(std::move(origin), message);
    case ErrorKind::kNetwork:
      throw NetworkError(std::move(origin), message);
    case ErrorKind::kProtocol:
      throw ProtocolError(std::move(origin), message);
    case ErrorKind::kAuth:
      throw AuthError(std::move(origin), message);
    case ErrorKind::kBackend:
      throw BackendError(std::move(origin), message);
    case ErrorKind::kShutdown:
      throw ShutdownError(std::move(origin), message);
    case ErrorKind::kGroupChanged:
      throw GroupChanged(std::move(origin), message);
    case ErrorKind::kInternal:
      break;
  }
  throw InternalError(std::move(origin), message);
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace ddp
