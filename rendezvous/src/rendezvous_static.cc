// The static rendezvous handler: every node publishes "<round>/node_<group rank>"
// = "<local world size> <master port> <addr> <nonce>" under its given --node_rank
// and then reads every node's record, within the job-instance protocol described
// in rendezvous.h. (The c10d handler is dynamic_rendezvous.cc.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>

#include "ddp/common/background.h"
#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/rendezvous/rendezvous.h"
#include "job_counts_store.h"
#include "records.h"
#include "round_control.h"

namespace ddp {
namespace {

using rendezvous_detail::StaticNode;

std::uint64_t random_nonce() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

std::string random_instance() {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(random_nonce()));
  return text;
}

// The keys one round uses besides its workers' (which cannot be listed).
std::vector<std::string> round_keys(const std::string& prefix, int nodes) {
  std::vector<std::string> keys = {prefix + "/end", prefix + "/exit_barrier"};
  for (int rank = 0; rank < nodes; ++rank) {
    keys.push_back(prefix + "/node_" + std::to_string(rank));
    keys.push_back(round_area_key(prefix, rank));
  }
  return keys;
}

// The heartbeat and housekeeping thread of a multi-node handler. It adds to the
// instance's heartbeat counter and runs cleanup tasks (deleting keys) on a
// store handle of its own, so that neither waits behind the agent's blocking
// calls and the agent never waits for them. It holds no reference to the
// handler: a BackgroundWorker, abandoned when a frozen store keeps it blocked
// past shutdown's deadline.
class Keeper {
 public:
  using Task = std::function<void(Store&)>;

  Keeper(std::shared_ptr<Store> store, StoreOpener opener, std::string heartbeat_key,
         std::chrono::milliseconds period, const Runtime& runtime)
      : handle_(std::make_shared<rendezvous_detail::OwnStoreHandle>(std::move(store),
                                                                    std::move(opener))),
        beats_(std::make_shared<Beats>()),
        worker_(
            period,
            [handle = handle_, beats = beats_, key = std::move(heartbeat_key)] {
              // The store unreachable ends the worker: nothing to beat on. The
              // instance then looks dead to newcomers, which is the truth as far
              // as they can tell.
              beats->saw(handle->get().add(key, 1));
            },
            runtime) {}

  void post(Task task) { worker_.post(bind(std::move(task))); }
  void set_period(std::chrono::milliseconds period) { worker_.set_period(period); }

  // How many beats other agents added to the counter between this keeper's
  // own beats (each of ours adds exactly one): it moves while another agent
  // of the instance is alive. Any thread.
  std::int64_t others_beats() const { return beats_->others.load(); }

  // Stops beating, runs the tasks already posted and then `last` (if any) and
  // ends the thread; waits at most `deadline` for that, then abandons it. `last`
  // is queued together with the stop so that no beat can follow it.
  void stop(std::chrono::milliseconds deadline, Task last = {}) {
    worker_.stop(deadline, last ? bind(std::move(last)) : BackgroundWorker::Task());
  }

 private:
  // Cleanup is best effort: keys left behind are harmless to a new instance,
  // which never reads them (the worker drops what a task throws).
  BackgroundWorker::Task bind(Task task) {
    return [handle = handle_, task = std::move(task)] { task(handle->get()); };
  }

  struct Beats {
    // The counter's value after our last beat (the worker's thread only).
    std::int64_t last = -1;
    std::atomic<std::int64_t> others{0};
    void saw(std::int64_t value) {
      if (last >= 0 && value > last + 1) others += value - last - 1;
      last = value;
    }
  };

  // The worker's own store handle (a TcpStore serializes calls, and the
  // agent's handle may block in a rendezvous wait for minutes).
  std::shared_ptr<rendezvous_detail::OwnStoreHandle> handle_;
  std::shared_ptr<Beats> beats_;
  BackgroundWorker worker_;  // declared last: stopped first
};

// Thrown inside next_rendezvous when the forming instance being joined turns
// out to be dead: the handler takes it over and joins the round again.
struct InstanceDead {};

class RoundHandler : public RendezvousHandler {
 public:
  // `runtime` must outlive the handler.
  RoundHandler(const RendezvousParams& params, RendezvousStore store, const Runtime& runtime)
      : params_(params), store_(std::move(store)), runtime_(runtime) {
    const char* origin = this->origin();
    if (!store_.has_store()) throw InvalidArgument(origin, "no store given");
    if (params_.min_nodes < 1 || params_.max_nodes < params_.min_nodes) {
      throw InvalidArgument(origin, "bad node range " + std::to_string(params_.min_nodes) + ":" +
                                        std::to_string(params_.max_nodes));
    }
    if (params_.min_nodes != params_.max_nodes) {
      throw InvalidArgument(origin, "the static backend needs a fixed number of nodes, got " +
                                        std::to_string(params_.min_nodes) + ":" +
                                        std::to_string(params_.max_nodes));
    }
    if (params_.node_rank < 0 || params_.node_rank >= params_.max_nodes) {
      throw InvalidArgument(origin, "node rank " + std::to_string(params_.node_rank) +
                                        " is outside [0, " + std::to_string(params_.max_nodes) +
                                        ")");
    }
    if (params_.local_world_size < 1) {
      throw InvalidArgument(origin, "local world size must be at least 1");
    }
    if (params_.instance_heartbeat_interval.count() <= 0 ||
        params_.instance_dead_after <= params_.instance_heartbeat_interval) {
      throw InvalidArgument(origin,
                            "the heartbeat timeout must exceed a positive heartbeat "
                            "interval");
    }
  }

  // Stops the heartbeat without the job-end cleanup (shutdown() does that).
  ~RoundHandler() override {
    if (keeper_) keeper_->stop(std::chrono::seconds(1));
  }

  std::unique_ptr<Round> join() override {
    // A round of one node is ended by nobody else: it touches no store.
    RendezvousInfo info = next_rendezvous();
    const bool solo = info.group_world_size <= 1;
    std::function<bool()> needed;
    if (store_.served_here()) needed = [this] { return others_beat(); };
    return std::make_unique<rendezvous_detail::StoreRound>(std::move(info), *this, solo, origin(),
                                                           nullptr, std::move(needed));
  }

  // Whether another agent of the instance added to the heartbeat counter
  // within instance_dead_after, on this node's clock; the first look of a
  // round counts them alive. (The agents' store is this node's: it keeps the
  // instance's counter for every node.)
  bool others_beat() {
    if (!keeper_) return false;
    const auto now = runtime_.now();
    const std::int64_t beats = keeper_->others_beats();
    if (!others_seen_ || others_seen_->beats != beats) others_seen_ = OthersSeen{beats, now};
    return now - others_seen_->since < params_.instance_dead_after;
  }

  RendezvousInfo next_rendezvous() {
    const int round = round_++;
    if (params_.max_nodes == 1) {  // nobody to meet: no store round trip at all
      if (instance_.empty()) instance_ = random_instance();
      StaticNode mine{params_.local_world_size, worker_master_port(), params_.local_addr};
      RendezvousInfo info = make_info(round, round_prefix(round), 0, {mine});
      info.instance = instance_;
      return info;
    }
    if (instance_.empty()) join_instance("");
    for (;;) {
      try {
        RendezvousInfo info = join_round(round);
        on_round_formed(info);
        return info;
      } catch (const InstanceDead&) {
        join_instance(instance_);
      }
    }
  }

  void shutdown(std::chrono::milliseconds deadline) override {
    if (!keeper_) return;
    Keeper::Task leave;
    if (last_nodes_ > 0) {
      const std::string base = base_prefix();
      const std::string instance = instance_;
      const std::string instance_key = this->instance_key();
      const std::string last_round = round_prefix(last_round_);
      const std::string before = last_round_ > 0 ? round_prefix(last_round_ - 1) : "";
      const int nodes = last_nodes_, before_nodes = before_nodes_;
      leave = [=](Store& store) {
        if (store.add(base + instance + "/left", 1) < nodes) return;
        // Every agent of the last round has left: nobody reads these anymore.
        std::vector<std::string> keys = round_keys(last_round, nodes);
        if (!before.empty()) {
          for (auto& key : round_keys(before, before_nodes)) keys.push_back(std::move(key));
        }
        for (const char* name : {"/left", "/heartbeat", "/started", "/round", "/counts"}) {
          keys.push_back(base + instance + name);
        }
        for (const auto& key : keys) store.delete_key(key);
        // Only our own instance: never delete a newer one's claim.
        if (store.compare_set(instance_key, instance, instance) == instance) {
          store.delete_key(instance_key);
        }
      };
    }
    keeper_->stop(deadline, std::move(leave));
    keeper_.reset();
  }

  RendezvousInfo make_info(int round, const std::string& prefix, int group_rank,
                           const std::vector<StaticNode>& records) const {
    RendezvousInfo info;
    info.round = round;
    info.store_addr = store_.host();
    info.store_port = store_.port();
    info.group_rank = group_rank;
    info.group_world_size = static_cast<int>(records.size());
    info.round_prefix = prefix;
    info.worker_prefix = prefix + "/workers";
    info.world_size = 0;
    for (std::size_t rank = 0; rank < records.size(); ++rank) {
      const StaticNode& record = records[rank];
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

  std::string store_name() const override { return store_.name(); }

  std::uint16_t worker_master_port() const {
    return params_.worker_master_port != 0 ? params_.worker_master_port : find_free_port();
  }

  // Connected on first use when only an opener was given (a single node
  // never needs its own client).
  std::optional<JobCounts> job_counts() override {
    if (params_.max_nodes == 1) return std::nullopt;  // a single node never touches the store
    return rendezvous_detail::read_job_counts(*store_.client(), counts_key());
  }
  JobCounts count_round_end(const JobCounts& mine, int round, const RoundEndCount& how) override {
    if (params_.max_nodes == 1) return counted(mine, round, how);
    return rendezvous_detail::count_round_end(*store_.client(), counts_key(), round, how);
  }
  std::shared_ptr<Store> store() override { return store_.client(); }
  std::shared_ptr<Store> open_store() override { return store_.open(); }
  std::string store_token() const override { return store_.token(); }
  std::string backend() const override { return "static"; }
  const RendezvousParams& params() const override { return params_; }

 private:
  const char* origin() const { return "static rendezvous"; }
  std::string base_prefix() const { return "rdzv/" + params_.run_id + "/"; }
  std::string instance_key() const { return base_prefix() + "instance"; }
  // The job's counts (job_counts.h), one key per instance.
  std::string counts_key() const { return instance_prefix(instance_) + "/counts"; }
  std::string instance_prefix(const std::string& instance) const {
    return base_prefix() + instance;
  }
  std::string round_prefix(int round) const {
    return instance_prefix(instance_) + "/round_" + std::to_string(round);
  }

  // The instance's heartbeat counter, read without creating it: -1 when it
  // does not exist (not beaten yet, or deleted because the instance was
  // replaced or ended). A deleted counter must never look like a moving one.
  std::int64_t heartbeat_of(Store& store, const std::string& instance) {
    const std::string key = instance_prefix(instance) + "/heartbeat";
    if (!store.check({key})) return -1;
    try {
      return rendezvous_detail::parse_integer(store.get(key, std::chrono::milliseconds(1)), key,
                                              "instance heartbeat", 0,
                                              std::numeric_limits<std::int64_t>::max());
    } catch (const TimeoutError&) {
      return -1;  // deleted between the check and the get
    }
  }

  // Watches `instance`'s heartbeat until it moves up (true) or stays still for
  // heartbeat_timeout (false). Also false as soon as the run id's instance
  // key no longer names it (replaced or ended): the caller looks again.
  bool alive(Store& store, const std::string& instance) {
    const std::int64_t first = heartbeat_of(store, instance);
    const auto give_up = runtime_.now() + params_.instance_dead_after;
    while (runtime_.now() < give_up) {
      runtime_.sleep_for(poll_period());
      if (heartbeat_of(store, instance) > first) return true;
      if (!store.check({instance_key()}) ||
          store.compare_set(instance_key(), instance, instance) != instance) {
        return false;
      }
    }
    return false;
  }

  std::chrono::milliseconds poll_period() const {
    return std::max(std::chrono::milliseconds(1), params_.instance_heartbeat_interval / 20);
  }

  // Claims a new instance of the run id, joins the one forming, or refuses a
  // live started one. `dead` is an instance found dead: it is replaced.
  void join_instance(std::string dead) {
    Store& store = *this->store();
    std::string expected = dead;
    for (;;) {
      const std::string mine = random_instance();
      const std::string current = store.compare_set(instance_key(), expected, mine);
      if (current == mine) {
        instance_ = mine;
        joiner_.reset();
        start_keeper(params_.instance_heartbeat_interval / 10);
        if (!expected.empty()) forget_instance(expected);
        return;
      }
      if (!expected.empty() && current == expected) {
        expected.clear();  // the key vanished (its job ended): claim afresh
        continue;
      }
      if (store.check({instance_prefix(current) + "/started"})) {
        if (alive(store, current)) {
          throw InvalidArgument(origin(),
                                "run id '" + params_.run_id +
                                    "' is already used by a running job "
                                    "(instance " +
                                    current +
                                    " has started and its agents heartbeat); "
                                    "pick another --rdzv_id, or stop that job first (a node that "
                                    "arrives after its job started cannot join it either)");
        }
        expected = current;  // a crashed job's instance: take it over
        continue;
      }
      // Forming: join it, and confirm while the round forms that its creator
      // still beats (a job that crashed before its first round formed leaves
      // such an instance behind, with records pointing at dead nodes).
      instance_ = current;
      joiner_ = Joiner{heartbeat_of(store, current), runtime_.now(), false};
      return;
    }
  }

  // Deletes what a replaced instance left that we can name: its bookkeeping
  // keys and its last two rounds (earlier ones were deleted while it ran).
  void forget_instance(const std::string& old) {
    const std::string prefix = instance_prefix(old);
    const int nodes = params_.max_nodes;
    keeper_->post([prefix, nodes](Store& store) {
      int last = 0;
      if (store.check({prefix + "/round"})) {
        last = static_cast<int>(
            rendezvous_detail::parse_integer(store.get(prefix + "/round"), prefix + "/round",
                                             "instance round", 0, rendezvous_detail::kMaxRound));
      }
      std::vector<std::string> keys;
      for (int round = std::max(0, last - 1); round <= last; ++round) {
        for (auto& key : round_keys(prefix + "/round_" + std::to_string(round), nodes)) {
          keys.push_back(std::move(key));
        }
      }
      for (const char* name : {"/left", "/heartbeat", "/started", "/round", "/counts"}) {
        keys.push_back(prefix + name);
      }
      for (const auto& key : keys) store.delete_key(key);
    });
  }

  void start_keeper(std::chrono::milliseconds period) {
    if (keeper_) keeper_->stop(std::chrono::milliseconds(0));
    keeper_ = std::make_unique<Keeper>(store_.client_if_made(), store_.opener(),
                                       instance_prefix(instance_) + "/heartbeat",
                                       std::max(std::chrono::milliseconds(1), period), runtime_);
  }

  // While joining a forming instance: true once its heartbeat moved, or once
  // another member marked its first round formed (the creator may end right
  // after that, before beating again); throws InstanceDead once neither
  // happened for instance_dead_after.
  bool confirmed(Store& store) {
    if (!joiner_ || joiner_->confirmed) return true;
    if (heartbeat_of(store, instance_) > joiner_->heartbeat ||
        store.check({instance_prefix(instance_) + "/started"})) {
      joiner_->confirmed = true;
      return true;
    }
    if (runtime_.now() - joiner_->since >= params_.instance_dead_after) throw InstanceDead{};
    return false;
  }

  // Runs a blocking store call with `timeout`; while an unconfirmed instance
  // is being joined the wait is cut into slices that check its heartbeat.
  template <typename Call>
  auto wait_watching(Store& store, std::chrono::milliseconds timeout, Call call) {
    const auto deadline = runtime_.now() + timeout;
    for (;;) {
      if (confirmed(store)) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - runtime_.now());
        return call(std::max(std::chrono::milliseconds(0), left));
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - runtime_.now());
      try {
        return call(std::max(std::chrono::milliseconds(1), std::min(left, poll_period() * 5)));
      } catch (const TimeoutError&) {
        if (runtime_.now() >= deadline) throw;
      }
    }
  }

  RendezvousInfo join_round(int round) {
    const std::string prefix = round_prefix(round);
    const auto timeout = params_.join_timeout;
    const int group_rank = params_.node_rank;
    const int nodes = params_.max_nodes;
    Store& store = *this->store();
    StaticNode mine{params_.local_world_size, 0, params_.local_addr};
    if (group_rank == 0) mine.master_port = worker_master_port();
    const std::string my_key = prefix + "/node_" + std::to_string(group_rank);
    mine.nonce = random_nonce();
    const std::string my_value = rendezvous_detail::encode_static_node(mine);
    const std::string stored = store.compare_set(my_key, "", my_value);
    if (stored != my_value) {
      // In a forming instance of a crashed job the record is stale: only a
      // live instance makes this a duplicate.
      while (!confirmed(store)) runtime_.sleep_for(poll_period());
      throw InvalidArgument(origin(), "node rank " + std::to_string(group_rank) +
                                          " already joined round " + std::to_string(round) +
                                          " of run '" + params_.run_id +
                                          "' (two nodes with the same --node_rank?)");
    }

    std::vector<std::string> keys;
    for (int rank = 0; rank < nodes; ++rank) {
      keys.push_back(prefix + "/node_" + std::to_string(rank));
    }
    std::vector<std::string> values;
    try {
      values = wait_watching(store, timeout,
                             [&](std::chrono::milliseconds t) { return store.multi_get(keys, t); });
    } catch (const TimeoutError&) {
      std::string missing;
      for (const auto& key : keys) {
        if (!store.check({key}))
          missing += (missing.empty() ? "" : ", ") + key.substr(prefix.size() + 1);
      }
      throw TimeoutError("rendezvous", "round " + std::to_string(round) + " of run '" +
                                           params_.run_id + "': not every node joined within " +
                                           std::to_string(timeout.count() / 1000.0) +
                                           " s (missing: " + missing + ")");
    }
    // Every record is there, but a record of a crashed job's forming instance
    // may be among them: accept the round only from a live instance.
    while (!confirmed(store)) runtime_.sleep_for(poll_period());

    std::vector<StaticNode> records;
    for (int rank = 0; rank < nodes; ++rank) {
      records.push_back(rendezvous_detail::parse_static_node(values[static_cast<std::size_t>(rank)],
                                                             keys[static_cast<std::size_t>(rank)]));
    }
    if (!started_) {
      // Before this node reports the round formed: from now on a newcomer with
      // the same run id must be refused, not let into round 0.
      store.set(instance_prefix(instance_) + "/started", "1");
    }
    RendezvousInfo info = make_info(round, prefix, group_rank, records);
    info.instance = instance_;
    return info;
  }

  // The round formed: this node now keeps the instance alive, and group rank 0
  // deletes the previous round, which nobody reads anymore (every node has
  // written its record of this round, so every node has left that one).
  void on_round_formed(const RendezvousInfo& info) {
    joiner_.reset();
    others_seen_.reset();
    if (!keeper_) {
      start_keeper(params_.instance_heartbeat_interval);
    } else {
      keeper_->set_period(params_.instance_heartbeat_interval);
    }
    started_ = true;
    const int round = info.round;
    const bool rank0 = info.group_rank == 0;
    const std::string previous = round > 0 ? round_prefix(round - 1) : "";
    const int previous_nodes = last_nodes_;
    const std::string prefix = instance_prefix(instance_);
    keeper_->post([=](Store& store) {
      if (!rank0) return;
      store.set(prefix + "/round", std::to_string(round));
      if (!previous.empty()) {
        for (const auto& key : round_keys(previous, previous_nodes)) store.delete_key(key);
      }
    });
    before_nodes_ = last_nodes_;
    last_nodes_ = info.group_world_size;
    last_round_ = round;
  }

  // The other agents' beats as last counted, and when they last moved.
  struct OthersSeen {
    std::int64_t beats = 0;
    Clock::time_point since;
  };

  struct Joiner {
    std::int64_t heartbeat = 0;
    Clock::time_point since;
    bool confirmed = false;
  };

  RendezvousParams params_;
  RendezvousStore store_;
  const Runtime& runtime_;
  int round_ = 0;
  std::string instance_;
  bool started_ = false;
  std::optional<Joiner> joiner_;
  std::optional<OthersSeen> others_seen_;
  int last_round_ = 0;
  int last_nodes_ = 0;    // nodes of the last round that formed
  int before_nodes_ = 0;  // nodes of the round before it
  std::unique_ptr<Keeper> keeper_;
};

}  // namespace

std::unique_ptr<RendezvousHandler> make_static_rendezvous(const RendezvousParams& params,
                                                          RendezvousStore store) {
  return std::make_unique<RoundHandler>(params, std::move(store), real_runtime());
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
