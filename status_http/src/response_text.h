// Responses on the wire: checking what a handler returned, writing a response
// as HTTP/1.1 text with the headers every response carries, and the server's
// own error responses.
//
// Ownership: plain values. Blocking: none. Thread-safety: pure functions.
// Errors: none thrown; problem_with() says what is wrong with a response.
#pragma once

#include <string>
#include <string_view>

#include "ddp/status_http/server.h"

namespace ddp::status_http {

// Why `response` cannot be sent as it is (server.h's rules for Response), or
// an empty string when it can.
std::string problem_with(const Response& response);

// The status line, Content-Type, Content-Length, Cache-Control: no-store,
// X-Content-Type-Options: nosniff, Connection: close when `close`, the extra
// headers, and the body unless `head` (Content-Length is the body's length
// either way). `response` must have passed problem_with().
std::string response_text(const Response& response, bool head, bool close);

// A response of the server's own: `status` with the one-line JSON body
// {"error":"<message>"}.
Response error_response(int status, std::string_view message);

// 401 with WWW-Authenticate: Bearer realm="ddprun".
Response unauthorized_response(std::string_view message);

// 405 with Allow: GET, HEAD.
Response method_not_allowed_response(std::string_view method);

}  // namespace ddp::status_http
