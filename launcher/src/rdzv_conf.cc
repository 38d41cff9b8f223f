#include "rdzv_conf.h"

#include <cctype>
#include <sstream>

#include "values.h"

namespace ddp::launcher {

const std::vector<RdzvConfKey>& rdzv_conf_table() {
  using K = RdzvConfKind;
  using C = LaunchConfig;
  static const std::vector<RdzvConfKey> table = {
      {"join_timeout", K::kSeconds, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.params.join_timeout; }},
      // torchrun's static and etcd rendezvous call the join timeout so.
      {"timeout", K::kSeconds, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.params.join_timeout; }},
      {"last_call_timeout", K::kSeconds, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.params.last_call_timeout; }},
      // How long a stopping agent waits for the store to take its word.
      {"close_timeout", K::kSeconds, false,
       [](C& c) -> RdzvConfField { return &c.agent.announce_timeout; }},
      // The longest one keep-alive write may take.
      {"heartbeat_timeout", K::kPositiveSeconds, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.keep_alive_write_timeout; }},
      {"keep_alive_interval", K::kPositiveSeconds, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.params.keep_alive_interval; }},
      {"keep_alive_max_attempt", K::kPositiveInt, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.params.keep_alive_max_attempt; }},
      // How long one store call retries a lost connection.
      {"read_timeout", K::kPositiveSeconds, false,
       [](C& c) -> RdzvConfField { return &c.rendezvous.read_timeout; }},
      // Whether this node hosts the c10d store (unset: the node whose address
      // the endpoint is).
      {"is_host", K::kBool, false, [](C& c) -> RdzvConfField { return &c.rendezvous.is_host; }},
      // torchrun's c10d: tcp (its default) or file; ddprun's store is TCP.
      {"store_type", K::kStoreType, false, [](C&) -> RdzvConfField { return {}; }},
      // torchrun sets static's rank from --node_rank, over any given here.
      {"rank", K::kIgnored, false, [](C&) -> RdzvConfField { return {}; },
       "--node_rank gives the node's rank (torchrun overrides it with --node_rank too)"},
      {"protocol", K::kProtocol, true,
       [](C& c) -> RdzvConfField { return &c.rendezvous.etcd.tls; }},
      {"cacert", K::kReadableFile, true,
       [](C& c) -> RdzvConfField { return &c.rendezvous.etcd.ca_file; }},
      {"cert", K::kReadableFile, true,
       [](C& c) -> RdzvConfField { return &c.rendezvous.etcd.cert_file; }},
      {"key", K::kReadableFile, true,
       [](C& c) -> RdzvConfField { return &c.rendezvous.etcd.key_file; }},
      {"username", K::kName, true,
       [](C& c) -> RdzvConfField { return &c.rendezvous.etcd.username; }},
      // The password is never on the command line.
      {"password_file", K::kPasswordFile, true,
       [](C& c) -> RdzvConfField { return &c.rendezvous.etcd.password; }},
      // torchrun's etcd (v2) rendezvous keeps its keys under this prefix.
      {"etcd_prefix", K::kIgnored, true, [](C&) -> RdzvConfField { return {}; },
       "ddprun keeps a job's keys under rdzv/<run_id>/ in etcd (its v3 layout is not "
       "torchrun's)"},
  };
  return table;
}

const RdzvConfKey* find_rdzv_conf_key(const std::string& key) {
  for (const auto& row : rdzv_conf_table()) {
    if (row.key == key) return &row;
  }
  return nullptr;
}

namespace {

bool is_seconds(RdzvConfKind kind) {
  return kind == RdzvConfKind::kSeconds || kind == RdzvConfKind::kPositiveSeconds;
}

// The keys that are (not) etcd's and (not) seconds, comma-separated; the
// ignored ones only when `ignored`, and then only those.
std::string keys(bool etcd_only, int seconds /* 1: only, 0: none, -1: any */,
                 bool ignored = false) {
  std::string list;
  for (const auto& row : rdzv_conf_table()) {
    if ((row.kind == RdzvConfKind::kIgnored) != ignored) continue;
    if (!ignored && row.etcd_only != etcd_only) continue;
    if (seconds >= 0 && is_seconds(row.kind) != (seconds == 1)) continue;
    list += (list.empty() ? "" : ", ") + std::string(row.key);
  }
  return list;
}

// Reads `value` as `row` says and stores it in its field of `c`.
void apply_key(const RdzvConfKey& row, const std::string& value, const std::string& name,
               const HostFacts& host, LaunchConfig& c) {
  const RdzvConfField field = row.field(c);
  auto readable = [&](const std::string& path) {
    if (!host.is_readable(path)) fail(name + ": cannot read '" + path + "'");
    return path;
  };
  switch (row.kind) {
    case RdzvConfKind::kSeconds:
      *std::get<std::chrono::milliseconds*>(field) = parse_secs(value, name);
      break;
    case RdzvConfKind::kPositiveSeconds:
      *std::get<std::chrono::milliseconds*>(field) = positive_secs(value, name);
      break;
    case RdzvConfKind::kPositiveInt:
      *std::get<int*>(field) =
          static_cast<int>(parse_int_in(value, 1, 1000000, name, "a positive integer"));
      break;
    case RdzvConfKind::kBool:
      if (value == "1" || value == "true" || value == "True") {
        *std::get<bool*>(field) = true;
      } else if (value == "0" || value == "false" || value == "False") {
        *std::get<bool*>(field) = false;
      } else {
        fail(name + ": expected true or false, got '" + value + "'");
      }
      break;
    case RdzvConfKind::kProtocol:
      if (value != "http" && value != "https")
        fail(name + ": expected http or https, got '" + value + "'");
      *std::get<bool*>(field) = value == "https";
      break;
    case RdzvConfKind::kReadableFile:
      *std::get<std::string*>(field) = readable(value);
      break;
    case RdzvConfKind::kName:
      if (value.empty()) fail(name + ": must not be empty");
      *std::get<std::string*>(field) = value;
      break;
    case RdzvConfKind::kPasswordFile: {
      std::string password = host.first_line(readable(value));
      // A file written on Windows (or by `echo` into a CRLF editor) ends its
      // line with "\r\n": the "\r" is not part of the password.
      if (!password.empty() && password.back() == '\r') password.pop_back();
      if (password.empty()) fail(name + ": '" + value + "' holds no password on its first line");
      *std::get<std::string*>(field) = password;
      break;
    }
    case RdzvConfKind::kStoreType: {
      // As torch reads it: stripped, in lower case.
      const auto first = value.find_first_not_of(" \t");
      std::string type = first == std::string::npos
                             ? ""
                             : value.substr(first, value.find_last_not_of(" \t") + 1 - first);
      for (char& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (type == "file") {
        fail(name +
             "=file: ddprun's rendezvous runs on its TCP store only (torchrun's FileStore is "
             "not supported); leave it out or give tcp");
      }
      if (type != "tcp") fail(name + ": expected tcp, got '" + value + "'");
      break;
    }
    case RdzvConfKind::kIgnored:
      c.warnings.push_back(name + " is ignored: " + row.ignored_because);
      break;
  }
}

}  // namespace

std::string rdzv_conf_help_keys() {
  return keys(false, 1) + " (seconds), " + keys(false, 0) + "; for etcd also " + keys(true, -1) +
         "; accepted and ignored (with a warning): " + keys(false, -1, true);
}

void apply_rdzv_conf(const std::string& text, const std::string& what, const std::string& backend,
                     const HostFacts& host, LaunchConfig& c) {
  std::istringstream in(text);
  for (std::string item; !text.empty() && std::getline(in, item, ',');) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      fail(what + ": expected key=value[,key=value...], got '" + text + "'");
    c.rdzv_conf[item.substr(0, eq)] = item.substr(eq + 1);
  }
  auto apply = [&](const std::string& key, const std::string& value) {
    const std::string name = what + " " + key;
    const RdzvConfKey* row = find_rdzv_conf_key(key);
    if (row == nullptr) {
      fail(what + ": unknown key '" + key + "' (known: " + keys(false, -1) +
           "; for etcd: " + keys(true, -1) + "; ignored: " + keys(false, -1, true) + ")");
    }
    if (row->etcd_only && backend != "etcd") fail(name + ": only for --rdzv_backend=etcd");
    apply_key(*row, value, name, host, c);
  };
  const bool join_timeout = c.rdzv_conf.count("join_timeout") > 0;
  if (join_timeout && c.rdzv_conf.count("timeout") > 0) {
    fail(what +
         ": timeout (torchrun's static and etcd name) and join_timeout are the same key: "
         "give one");
  }
  const std::string first = join_timeout ? "join_timeout" : "timeout";
  if (auto it = c.rdzv_conf.find(first); it != c.rdzv_conf.end()) apply(it->first, it->second);
  for (const auto& [key, value] : c.rdzv_conf) {
    if (key != first) apply(key, value);
  }
  c.rendezvous.connect_timeout = c.rendezvous.params.join_timeout;
}

}  // namespace ddp::launcher
