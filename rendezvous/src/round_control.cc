#include "round_control.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "ddp/common/error.h"

namespace ddp {

std::string encode_round_end(const RoundEnd& end) {
  switch (end.kind) {
    case RoundEnd::Kind::kRestart:
      return "restart " + std::to_string(end.node) + " " + std::to_string(end.value);
    case RoundEnd::Kind::kAbort:
      return "abort " + std::to_string(end.node) + " " + std::to_string(end.value);
    case RoundEnd::Kind::kDone:
      return "done";
    case RoundEnd::Kind::kNodeLost:
      return "lost " + std::to_string(end.node) + " " + end.member;
    case RoundEnd::Kind::kNodeJoined:
      return "joined " + end.member;
    case RoundEnd::Kind::kStoreLost:
      return "store_lost";
  }
  return "";
}

std::optional<RoundEnd> parse_round_end(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  in >> word;
  RoundEnd end;
  if (word == "done") {
    end.kind = RoundEnd::Kind::kDone;
    return end;
  }
  if (word == "restart" || word == "abort") {
    end.kind = word == "restart" ? RoundEnd::Kind::kRestart : RoundEnd::Kind::kAbort;
    if (!(in >> end.node >> end.value)) return std::nullopt;
    return end;
  }
  if (word == "lost") {
    end.kind = RoundEnd::Kind::kNodeLost;
    if (!(in >> end.node >> end.member)) return std::nullopt;
    return end;
  }
  if (word == "joined") {
    end.kind = RoundEnd::Kind::kNodeJoined;
    if (!(in >> end.member)) return std::nullopt;
    return end;
  }
  return std::nullopt;
}

std::string describe(const RoundEnd& end) {
  switch (end.kind) {
    case RoundEnd::Kind::kRestart:
      return "a worker on node " + std::to_string(end.node) + " failed (exit code " +
             std::to_string(end.value) + ")";
    case RoundEnd::Kind::kAbort:
      return "the agent of node " + std::to_string(end.node) + " stopped the job (signal " +
             std::to_string(end.value) + ")";
    case RoundEnd::Kind::kDone:
      return "every node finished";
    case RoundEnd::Kind::kNodeLost:
      return "node " + std::to_string(end.node) + " (member " + end.member +
             ") was lost: it missed its keep-alives" + (end.detail.empty() ? "" : " (" + end.detail + ")");
    case RoundEnd::Kind::kNodeJoined:
      return "a new node (member " + end.member + ") asked to join";
    case RoundEnd::Kind::kStoreLost:
      return "lost the rendezvous store: " + end.detail;
  }
  return "";
}

namespace rendezvous_detail {
namespace {

class EndKeyWatch : public RoundWatch {
 public:
  EndKeyWatch(std::shared_ptr<Store> store, std::string key, std::function<void()> wake,
              std::string store_name)
      : state_(std::make_shared<State>()) {
    auto state = state_;
    thread_ = std::thread([state, store = std::move(store), key = std::move(key),
                           wake = std::move(wake), store_name = std::move(store_name)] {
      RoundEnd end;
      try {
        // One call that waits and reads: the agent that sets the key may be
        // the store's host and exit right after, so no second round trip.
        std::string value;
        for (;;) {
          try {
            value = store->get(key, std::chrono::hours(1));
            break;
          } catch (const TimeoutError&) {
            if (state->cancelled) return;
          }
        }
        auto parsed = parse_round_end(value);
        if (parsed) {
          end = *parsed;
        } else {
          end.kind = RoundEnd::Kind::kStoreLost;
          end.detail = "unreadable round end '" + value + "' at " + key + " in the store at " +
                       store_name;
        }
      } catch (const std::exception& e) {
        end.kind = RoundEnd::Kind::kStoreLost;
        end.detail = "the store at " + store_name + " failed: " + e.what();
      }
      {
        std::lock_guard lock(state->mutex);
        state->end = end;
      }
      if (!state->cancelled) wake();
    });
  }

  ~EndKeyWatch() override {
    if (!thread_.joinable()) return;
    bool done;
    {
      std::lock_guard lock(state_->mutex);
      done = state_->end.has_value();
    }
    state_->cancelled = true;
    if (done) {
      thread_.join();
    } else {
      thread_.detach();  // ends when the key appears or the store goes away
    }
  }

  std::optional<RoundEnd> ended() const override {
    std::lock_guard lock(state_->mutex);
    return state_->end;
  }

 private:
  struct State {
    mutable std::mutex mutex;
    std::optional<RoundEnd> end;
    std::atomic<bool> cancelled{false};
  };
  std::shared_ptr<State> state_;
  std::thread thread_;
};

class EndKeyWrite : public PendingEnd {
 public:
  EndKeyWrite(std::shared_ptr<Store> store, std::string key, std::string value)
      : state_(std::make_shared<State>()) {
    auto state = state_;
    thread_ = std::thread([state, store = std::move(store), key = std::move(key),
                           value = std::move(value)] {
      std::string error;
      try {
        store->compare_set(key, "", value);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard lock(state->mutex);
      state->error = std::move(error);
      state->done = true;
      state->changed.notify_all();
    });
  }

  ~EndKeyWrite() override { wait_until(Clock::now()); }

  std::string wait_until(Clock::time_point deadline) override {
    if (!thread_.joinable()) return result_;
    std::unique_lock lock(state_->mutex);
    const bool done = state_->changed.wait_until(lock, deadline, [&] { return state_->done; });
    result_ = done ? state_->error : "the store did not answer in time; not waiting for it";
    lock.unlock();
    if (done) {
      thread_.join();
    } else {
      thread_.detach();
    }
    return result_;
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;
    std::string error;
  };
  std::shared_ptr<State> state_;
  std::thread thread_;
  std::string result_;
};

class InertWatch : public RoundWatch {
 public:
  std::optional<RoundEnd> ended() const override { return std::nullopt; }
};

class NothingToTell : public PendingEnd {
 public:
  std::string wait_until(Clock::time_point) override { return ""; }
};

}  // namespace

std::unique_ptr<RoundWatch> watch_end_key(std::shared_ptr<Store> store, std::string key,
                                          std::function<void()> wake, std::string store_name) {
  return std::make_unique<EndKeyWatch>(std::move(store), std::move(key), std::move(wake),
                                       std::move(store_name));
}

std::unique_ptr<PendingEnd> set_end_key(std::shared_ptr<Store> store, std::string key,
                                        std::string value) {
  return std::make_unique<EndKeyWrite>(std::move(store), std::move(key), std::move(value));
}

void arrive_at_exit_barrier(const std::shared_ptr<Store>& store, const RendezvousInfo& info,
                            Clock::time_point deadline, const char* origin) {
  if (store->add(info.round_prefix + "/exit_barrier", 1) < info.group_world_size) return;
  RoundEnd done;
  done.kind = RoundEnd::Kind::kDone;
  const std::string error =
      set_end_key(store, info.round_prefix + "/end", encode_round_end(done))->wait_until(deadline);
  if (!error.empty()) throw NetworkError(origin, "cannot end the round: " + error);
}

std::unique_ptr<RoundWatch> inert_watch() { return std::make_unique<InertWatch>(); }
std::unique_ptr<PendingEnd> nothing_to_tell() { return std::make_unique<NothingToTell>(); }

}  // namespace rendezvous_detail
}  // namespace ddp
