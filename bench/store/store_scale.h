// store_bench --scale: the store at the machine's limit. N clients, spread
// over several worker processes (each holds its share of the connections, so
// that no process passes the open-file limit), each connect to a real server
// process, do one `set`, then all go through a barrier as the agents do
// (add to a counter; the client that brings it to N sets the `done` key;
// every client waits for it). For each N it prints exactly
//   store_scale clients=<n> connect_s=<x> barrier_s=<y> daemon_peak_rss_mib=<m> errors=<e>
// for ddp-rendezvous, and
//   store_scale impl=c10d clients=<n> connect_s=<x> barrier_s=<y> daemon_peak_rss_mib=<m> errors=<e>
// for c10d's TCPStore (torch 1.13, its server in a process of its own), which
// stops at the first count where it fails (the line then shows the errors).
//
// connect_s: from the start signal until every client is connected (TCP and
// handshake) and has done its set; barrier_s: from the barrier's start signal
// (sent once every worker finished the first phase) until every client passed
// it. daemon_peak_rss_mib: VmHWM of the server process. errors: clients that
// failed to connect or a call that failed or timed out.
//
// Blocking: run_scale() runs everything and returns the exit code (0 when
// every run of ddp-rendezvous had no error). It must be called while the
// process has a single thread (it forks). Nothing is left behind: servers and
// workers are killed and reaped, also on errors.
#pragma once

#include <string>
#include <vector>

namespace ddp::bench {

struct ScaleSettings {
  std::vector<int> clients;  // client counts, in order
  int processes = 16;        // worker processes (raised so that each fits the fd limit)
  int threads = 4;           // threads per worker process
  double timeout_s = 60;     // per run: connect, every call, and the run as a whole
  std::string daemon;        // ddp-rendezvous; empty: next to this binary
  bool with_c10d = true;     // also run c10d's TCPStore
  bool with_ddp = true;      // run ddp-rendezvous
};

int run_scale(const ScaleSettings& settings, const std::string& self_dir);

}  // namespace ddp::bench
