// The status page (status_http/page/status_page.html), embedded in the
// library at build time: one self-contained HTML document whose inline script
// reads /status from the server that served it (sending the Bearer token it
// was opened with, /?token=...).
//
// Ownership: the text is static, in the library's read-only data. Blocking:
// none. Thread-safety: may be called from any thread. Errors: none.
#pragma once

#include <string_view>

#include "ddp/status_http/server.h"

namespace ddp::status_http {

// The page's bytes, exactly as the file held them at build time (UTF-8).
std::string_view status_page_html();

// A Content-Security-Policy for responses carrying the page: its own inline
// script and styles, requests to the server it came from, images from there
// or data: URLs; nothing else (no other origin, no plugins, no framing, no
// form posts). A page that needs more must change this with it.
inline constexpr const char* kStatusPageCsp =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

// The page as a response: HTML, UTF-8, with kStatusPageCsp.
Response status_page_response();

}  // namespace ddp::status_http
