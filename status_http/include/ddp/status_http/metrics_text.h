// Builds one exposition in Prometheus' text format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/): families of
// counters, gauges and untyped samples, each written as
//
//   # HELP <name> <help>
//   # TYPE <name> <type>
//   <name>{<label>="<value>",...} <value>
//
// Samples are written under their family's HELP and TYPE lines, in the order
// they were added, whatever families were declared in between; families
// appear in the order they were declared. Label values and help are escaped
// as the format says (label values: \\, \" and \n; help: \\ and \n), and a
// byte sequence that is not valid UTF-8 becomes U+FFFD (Prometheus refuses
// the whole exposition otherwise). Values: integers up to 2^53 in magnitude
// exactly and without an exponent, NaN, +Inf and -Inf as Prometheus spells
// them, any other value in the shortest form that reads back to it.
//
// Ownership: a MetricsText owns its text. Blocking: none. Thread-safety: none;
// one thread builds an exposition. Errors: a misuse (a bad name, type or
// label, a family declared twice, a sample of an undeclared family) throws
// InternalError: these are bugs of the caller, never caused by the data.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/status_http/server.h"

namespace ddp::status_http {

using Labels = std::vector<std::pair<std::string, std::string>>;

// The Content-Type of a response carrying MetricsText::text().
inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

class MetricsText {
 public:
  // Declares a family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]* and not be
  // declared yet; `type` is "counter", "gauge" or "untyped"; a counter's name
  // ends in "_total"; `help` is not empty (promtool's lint asks for it).
  void family(std::string_view name, std::string_view type, std::string_view help);

  // One sample of the family `name` (declared before). Label names match
  // [a-zA-Z_][a-zA-Z0-9_]*, do not start with "__" and appear once.
  void sample(std::string_view name, const Labels& labels, double value);
  void sample(std::string_view name, double value);  // without labels

  // The exposition so far. The reference is valid until the next call of a
  // member function.
  const std::string& text() const;

 private:
  struct Family {
    std::string header;   // its HELP and TYPE lines
    std::string samples;  // its sample lines
  };
  std::vector<Family> families_;
  std::unordered_map<std::string, std::size_t> family_index_;
  mutable std::string text_;
};

// The exposition as a response (kMetricsContentType).
Response metrics_response(const MetricsText& text);

}  // namespace ddp::status_http
