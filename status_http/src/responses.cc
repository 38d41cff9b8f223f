#include <string>

#include "ddp/status_http/metrics_text.h"
#include "ddp/status_http/page.h"

namespace ddp::status_http {

Response status_page_response() {
  Response r;
  r.content_type = "text/html; charset=utf-8";
  r.body = std::string(status_page_html());
  r.headers.emplace_back("Content-Security-Policy", kStatusPageCsp);
  return r;
}

Response metrics_response(const MetricsText& text) {
  Response r;
  r.content_type = kMetricsContentType;
  r.body = text.text();
  return r;
}

}  // namespace ddp::status_http
