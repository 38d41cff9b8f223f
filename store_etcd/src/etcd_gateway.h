// etcd's v3 JSON gateway as EtcdStore reads it: the JSON of a reply and of a
// watch message checked before use (bounded nesting, every bytes field valid
// padded base64), base64, the fields of etcd's JSON, and etcd's error replies
// mapped to ddp errors. Pure functions; thread-safe. The HTTP under it is
// etcd_connection.h, the calls themselves (retries, endpoints, tokens) are
// etcd_http.h's Transport.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "ddp/common/error.h"
#include "etcd_connection.h"

namespace ddp::etcd {

using Json = nlohmann::json;

std::string base64_encode(std::string_view bytes);
// Whether `text` is base64 with its padding (length a multiple of 4, "=" only
// as the last one or two characters), as etcd writes it.
bool is_padded_base64(std::string_view text);
// Throws ProtocolError when `text` is not valid padded base64; never reads or
// writes past either string.
std::string base64_decode(std::string_view text);
// An int64 field of etcd's JSON ("123" or 123); 0 when missing.
std::int64_t json_int(const Json& object, const char* field);
// A bytes field (base64) decoded; "" when missing.
std::string json_bytes(const Json& object, const char* field);
// A boolean field; false when missing or not a boolean (never throws).
bool json_flag(const Json& object, const char* field);
// A string field; `otherwise` when missing or not a string (never throws).
std::string json_string(const Json& object, const char* field, const std::string& otherwise = "");
// etcd's GetPrefixRangeEnd: the prefix with its last byte below 0xff
// incremented ("\0" for an empty prefix or all 0xff: every key).
std::string prefix_range_end(const std::string& prefix);

// What etcd said in an error reply ({"error","message","code"}) that is not
// "try again". Errors thrown for such replies are ReplyError<Base>: catch
// the ddp error (InvalidArgument, AuthError, ProtocolError) and
// dynamic_cast to ReplyInfo for the details.
class ReplyInfo {
 public:
  ReplyInfo(int code, std::string etcd_message)
      : code_(code), etcd_message_(std::move(etcd_message)) {}
  virtual ~ReplyInfo() = default;
  // The gRPC status code.
  int code() const { return code_; }
  const std::string& etcd_message() const { return etcd_message_; }

 private:
  int code_;
  std::string etcd_message_;
};

template <typename Base>
class ReplyError : public Base, public ReplyInfo {
 public:
  ReplyError(std::string origin, const std::string& message, int code, std::string etcd_message)
      : Base(std::move(origin), message), ReplyInfo(code, std::move(etcd_message)) {}
};

// The ReplyInfo of `error`, if it came from an etcd error reply.
inline const ReplyInfo* reply_info(const Error& error) {
  return dynamic_cast<const ReplyInfo*>(&error);
}

// The gRPC code and the message of an error reply:
// {"error":"...","message":"...","code":N} (unary) or
// {"error":{"grpc_code":N,"message":"..."}} (a message of a stream).
// Fields of any type are read without throwing (a reply is not trusted).
std::pair<int, std::string> error_fields(const Json& reply);

// The token was refused as expired or invalid: authenticate again and retry.
class TokenExpired : public std::exception {};

// The JSON of a unary reply from `where` to POST `path`: a parsed object whose
// bytes fields are valid base64. Throws BadReply for a reply that is not
// etcd's, ReplyError<...> for etcd's final errors, and (internal) classes
// that make Transport retry or re-authenticate.
Json decode_reply(const std::string& origin, const std::string& where, const std::string& path,
                  const HttpReply& reply);
// One message of a watch stream, checked as decode_reply checks a reply.
// Throws BadReply.
Json decode_stream_message(const std::string& where, const std::string& line);

// Maps etcd's error reply (gRPC `code`, `message`) from `where` to a ddp
// error; `retry` is set instead when the call should be retried elsewhere,
// `reauth` when the token expired.
struct ErrorClass {
  bool retry = false;
  bool reauth = false;
};
ErrorClass classify(int code, const std::string& message);
[[noreturn]] void throw_reply_error(const std::string& origin, const std::string& where, int code,
                                    const std::string& message);

}  // namespace ddp::etcd
