// The standard metrics of Prometheus' process collector for this process, as
// client libraries export them, read from /proc/self, /proc/stat and the
// open-file limit:
//
//   process_cpu_seconds_total       counter  user and system CPU time, seconds
//   process_resident_memory_bytes   gauge    resident set size
//   process_virtual_memory_bytes    gauge    virtual memory size
//   process_open_fds                gauge    open file descriptors
//   process_max_fds                 gauge    the soft open-file limit (left out when unlimited)
//   process_start_time_seconds      gauge    start time, Unix seconds (boot time + start ticks)
//   process_threads                 gauge    threads
//
// A value that cannot be read is left out with its family, never made up.
//
// Ownership: writes into the caller's MetricsText. Blocking: reads a few
// /proc files (microseconds). Thread-safety: may be called from any thread,
// each with its own MetricsText. Errors: none of its own; a family already
// declared in `out` throws MetricsText's InternalError.
#pragma once

#include "ddp/status_http/metrics_text.h"

namespace ddp::status_http {

void write_process_metrics(MetricsText& out);

}  // namespace ddp::status_http
