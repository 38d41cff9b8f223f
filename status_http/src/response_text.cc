#include "response_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <iterator>

namespace ddp::status_http {

namespace {

// The headers the server writes itself, lower case.
constexpr std::array<std::string_view, 6> kServerHeaders = {
    "content-type", "content-length", "transfer-encoding",
    "connection",   "cache-control",  "x-content-type-options"};

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), is_token_char);
}

// A header value may hold anything but the bytes that would end it.
bool is_header_value(std::string_view text) {
  return text.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool is_server_header(std::string_view name) {
  return std::any_of(kServerHeaders.begin(), kServerHeaders.end(),
                     [&](std::string_view own) { return equals_ignoring_case(name, own); });
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      break;
  }
  // Clients read the code; the phrase is a courtesy.
  if (status < 300) return "Success";
  if (status < 400) return "Redirection";
  if (status < 500) return "Client Error";
  return "Server Error";
}

// `text` as the inside of a JSON string (quotes, backslashes and control
// characters escaped).
std::string json_string_body(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string problem_with(const Response& response) {
  if (response.status < 200 || response.status > 599 || response.status == 204 ||
      response.status == 304) {
    return fmt::format("status {} is not one the server sends (200 to 599, not 204 or 304)",
                       response.status);
  }
  if (!is_header_value(response.content_type)) {
    return "the content type holds a line break or a NUL byte";
  }
  for (const auto& [name, value] : response.headers) {
    if (!is_token(name)) return fmt::format("the header name '{}' is not an HTTP token", name);
    if (is_server_header(name)) {
      return fmt::format("the header {} is the server's to write", name);
    }
    if (!is_header_value(value)) {
      return fmt::format("the value of header {} holds a line break or a NUL byte", name);
    }
  }
  return {};
}

std::string response_text(const Response& response, bool head, bool close) {
  std::string out;
  out.reserve(256 + (head ? 0 : response.body.size()));
  auto to = std::back_inserter(out);
  fmt::format_to(to, "HTTP/1.1 {} {}\r\n", response.status, reason_phrase(response.status));
  fmt::format_to(to, "Content-Type: {}\r\n", response.content_type);
  fmt::format_to(to, "Content-Length: {}\r\n", response.body.size());
  out += "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n";
  if (close) out += "Connection: close\r\n";
  for (const auto& [name, value] : response.headers) fmt::format_to(to, "{}: {}\r\n", name, value);
  out += "\r\n";
  if (!head) out += response.body;
  return out;
}

Response error_response(int status, std::string_view message) {
  Response response;
  response.status = status;
  response.content_type = "application/json";
  response.body = fmt::format("{{\"error\":\"{}\"}}\n", json_string_body(message));
  return response;
}

Response unauthorized_response(std::string_view message) {
  Response response = error_response(401, message);
  response.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ddprun\"");
  return response;
}

Response method_not_allowed_response(std::string_view method) {
  Response response = error_response(
      405, fmt::format("method {} is not allowed: this server answers GET and HEAD", method));
  response.headers.emplace_back("Allow", "GET, HEAD");
  return response;
}

}  // namespace ddp::status_http
