// The static and c10d rendezvous handlers. Both share the round bookkeeping:
// every node publishes "<round>/node_<group rank>" = "<local world size> <master
// port> <addr> <nonce>" and then reads every node's record. They differ in how a
// node learns its group rank: given (static) or by arrival order (c10d).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "ddp/common/error.h"
#include "ddp/rendezvous/rendezvous.h"

namespace ddp {
namespace {

struct NodeRecord {
  int local_world_size = 0;
  std::uint16_t master_port = 0;
  std::string addr;
};

std::string encode(const NodeRecord& record, std::uint64_t nonce) {
  return std::to_string(record.local_world_size) + " " + std::to_string(record.master_port) +
         " " + record.addr + " " + std::to_string(nonce);
}

NodeRecord decode(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  NodeRecord record;
  unsigned port = 0;
  if (!(in >> record.local_world_size >> port >> record.addr) || port > 65535 ||
      record.local_world_size < 1) {
    throw ProtocolError("rendezvous", "malformed node record at '" + key + "': '" + text + "'");
  }
  record.master_port = static_cast<std::uint16_t>(port);
  return record;
}

std::uint64_t random_nonce() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

class RoundHandler : public RendezvousHandler {
 public:
  RoundHandler(const RendezvousParams& params, RendezvousStore store, bool dynamic_ranks)
      : params_(params), store_(std::move(store)), dynamic_ranks_(dynamic_ranks) {
    const char* origin = dynamic_ranks ? "c10d rendezvous" : "static rendezvous";
    if (!store_.store && !store_.opener) throw InvalidArgument(origin, "no store given");
    if (params_.min_nodes < 1 || params_.max_nodes < params_.min_nodes) {
      throw InvalidArgument(origin, "bad node range " + std::to_string(params_.min_nodes) + ":" +
                                        std::to_string(params_.max_nodes));
    }
    if (!dynamic_ranks && params_.min_nodes != params_.max_nodes) {
      throw InvalidArgument(origin, "the static backend needs a fixed number of nodes, got " +
                                        std::to_string(params_.min_nodes) + ":" +
                                        std::to_string(params_.max_nodes));
    }
    if (!dynamic_ranks && (params_.node_rank < 0 || params_.node_rank >= params_.max_nodes)) {
      throw InvalidArgument(origin, "node rank " + std::to_string(params_.node_rank) +
                                        " is outside [0, " + std::to_string(params_.max_nodes) +
                                        ")");
    }
    if (params_.local_world_size < 1) {
      throw InvalidArgument(origin, "local world size must be at least 1");
    }
  }

  RendezvousInfo next_rendezvous() override {
    const int round = round_++;
    const std::string prefix = "rdzv/" + params_.run_id + "/round_" + std::to_string(round);
    const auto timeout = params_.join_timeout;

    int group_rank = dynamic_ranks_ ? 0 : params_.node_rank;
    int nodes = params_.max_nodes;
    if (nodes == 1) {  // nobody to meet: no store round trip at all
      NodeRecord mine{params_.local_world_size, worker_master_port(), params_.local_addr};
      return make_info(round, prefix, 0, {mine});
    }
    Store& store = *this->store();
    // A single-node job needs no arrival bookkeeping: every round trip saved
    // here is restart latency saved.
    if (dynamic_ranks_ && params_.max_nodes > 1) {
      const std::int64_t arrived = store.add(prefix + "/joined", 1);
      group_rank = static_cast<int>(arrived - 1);
      if (arrived == params_.max_nodes) {
        store.compare_set(prefix + "/closed", "", std::to_string(arrived));
      } else if (arrived == params_.min_nodes) {
        // The node that completes the minimum keeps the round open a little
        // longer for late joiners, then closes it at whatever size it has.
        std::this_thread::sleep_for(params_.last_call_timeout);
        store.compare_set(prefix + "/closed", "", std::to_string(store.add(prefix + "/joined", 0)));
      }
      const std::string closed = store.get(prefix + "/closed", timeout);
      nodes = std::stoi(closed);
      if (group_rank >= nodes) {
        throw InvalidArgument("c10d rendezvous", "round " + std::to_string(round) + " of run '" +
                                                     params_.run_id + "' closed with " + closed +
                                                     " nodes before this node joined");
      }
    }

    NodeRecord mine{params_.local_world_size, 0, params_.local_addr};
    if (group_rank == 0) mine.master_port = worker_master_port();
    const std::string my_key = prefix + "/node_" + std::to_string(group_rank);
    const std::string my_value = encode(mine, random_nonce());
    const std::string stored = store.compare_set(my_key, "", my_value);
    if (stored != my_value) {
      throw InvalidArgument(dynamic_ranks_ ? "c10d rendezvous" : "static rendezvous",
                            "node rank " + std::to_string(group_rank) +
                                " already joined round " + std::to_string(round) + " of run '" +
                                params_.run_id + "' (two nodes with the same --node_rank?)");
    }

    std::vector<std::string> keys;
    for (int rank = 0; rank < nodes; ++rank) {
      keys.push_back(prefix + "/node_" + std::to_string(rank));
    }
    std::vector<std::string> values;
    try {
      values = store.multi_get(keys, timeout);
    } catch (const TimeoutError&) {
      std::string missing;
      for (const auto& key : keys) {
        if (!store.check({key})) missing += (missing.empty() ? "" : ", ") + key.substr(prefix.size() + 1);
      }
      throw TimeoutError("rendezvous",
                         "round " + std::to_string(round) + " of run '" + params_.run_id +
                             "': not every node joined within " +
                             std::to_string(timeout.count() / 1000.0) + " s (missing: " + missing +
                             ")");
    }

    std::vector<NodeRecord> records;
    for (int rank = 0; rank < nodes; ++rank) {
      records.push_back(decode(values[static_cast<std::size_t>(rank)],
                               keys[static_cast<std::size_t>(rank)]));
    }
    return make_info(round, prefix, group_rank, records);
  }

  static RendezvousInfo make_info(int round, const std::string& prefix, int group_rank,
                                  const std::vector<NodeRecord>& records) {
    RendezvousInfo info;
    info.round = round;
    info.group_rank = group_rank;
    info.group_world_size = static_cast<int>(records.size());
    info.round_prefix = prefix;
    info.worker_prefix = prefix + "/workers";
    info.world_size = 0;
    for (std::size_t rank = 0; rank < records.size(); ++rank) {
      const NodeRecord& record = records[rank];
      if (static_cast<int>(rank) < group_rank) info.base_rank += record.local_world_size;
      info.world_size += record.local_world_size;
      info.local_world_sizes.push_back(record.local_world_size);
      if (rank == 0) {
        info.master_addr = record.addr;
        info.master_port = record.master_port;
      }
    }
    return info;
  }

  std::uint16_t worker_master_port() const {
    return params_.worker_master_port != 0 ? params_.worker_master_port : find_free_port();
  }

  // Connected on first use when only an opener was given (a single node
  // never needs its own client).
  std::shared_ptr<Store> store() override {
    if (!store_.store) store_.store = store_.opener();
    return store_.store;
  }
  std::shared_ptr<Store> open_store() override {
    return store_.opener ? store_.opener() : store();
  }
  std::string store_host() const override { return store_.host; }
  std::uint16_t store_port() const override { return store_.port; }
  std::string store_token() const override { return store_.token; }
  std::string backend() const override { return dynamic_ranks_ ? "c10d" : "static"; }
  const RendezvousParams& params() const override { return params_; }

 private:
  RendezvousParams params_;
  RendezvousStore store_;
  bool dynamic_ranks_;
  int round_ = 0;
};

}  // namespace

std::unique_ptr<RendezvousHandler> make_static_rendezvous(const RendezvousParams& params,
                                                          RendezvousStore store) {
  return std::make_unique<RoundHandler>(params, std::move(store), false);
}

std::unique_ptr<RendezvousHandler> make_c10d_rendezvous(const RendezvousParams& params,
                                                        RendezvousStore store) {
  return std::make_unique<RoundHandler>(params, std::move(store), true);
}

std::uint16_t find_free_port(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw NetworkError("find_free_port", std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) addr.sin_addr.s_addr = INADDR_ANY;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw NetworkError("find_free_port", "bind " + host + ":0: " + std::strerror(err));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace ddp
