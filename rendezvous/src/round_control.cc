#include "round_control.h"

#include <atomic>
#include <charconv>
#include <mutex>
#include <vector>

#include "ddp/common/background.h"
#include "ddp/common/error.h"
#include "records.h"

namespace ddp {

std::string round_area_key(const std::string& round_prefix, int node) {
  return round_prefix + "/area/" + std::to_string(node);
}

std::string encode_round_end(const RoundEnd& end) {
  switch (end.kind) {
    case RoundEnd::Kind::kRestart:
    case RoundEnd::Kind::kAbort:
      return std::string(end.kind == RoundEnd::Kind::kRestart ? "restart " : "abort ") +
             std::to_string(end.node) + " " + std::to_string(end.value) + (end.hang ? " hang" : "");
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

namespace {

// The space-separated words of `text`; empty when there are more than `most`.
std::vector<std::string> words_of(const std::string& text, std::size_t most) {
  std::vector<std::string> words;
  std::size_t at = 0;
  while (at < text.size()) {
    while (at < text.size() && text[at] == ' ') ++at;
    const std::size_t begin = at;
    while (at < text.size() && text[at] != ' ') ++at;
    if (at == begin) break;
    if (words.size() == most) return {};
    words.push_back(text.substr(begin, at - begin));
  }
  return words;
}

// A whole integer token in [low, high].
std::optional<int> int_in(const std::string& word, int low, int high) {
  int value = 0;
  auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  if (ec != std::errc() || end != word.data() + word.size() || value < low || value > high) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::optional<RoundEnd> parse_round_end(const std::string& text) {
  if (text.size() > 256) return std::nullopt;
  const std::vector<std::string> w = words_of(text, 4);
  if (w.empty()) return std::nullopt;
  RoundEnd end;
  // Node ranks of a round; exit codes and signal numbers.
  constexpr int kMostNodes = rendezvous_detail::kMaxNodes;
  if (w[0] == "done" && w.size() == 1) {
    end.kind = RoundEnd::Kind::kDone;
    return end;
  }
  if (w[0] == "store_lost" && w.size() == 1) {
    end.kind = RoundEnd::Kind::kStoreLost;
    return end;
  }
  if ((w[0] == "restart" || w[0] == "abort") &&
      (w.size() == 3 || (w.size() == 4 && w[3] == "hang"))) {
    end.kind = w[0] == "restart" ? RoundEnd::Kind::kRestart : RoundEnd::Kind::kAbort;
    end.hang = w.size() == 4;
    auto node = int_in(w[1], -1, kMostNodes - 1);
    auto value = int_in(w[2], -255, 255);
    if (!node || !value) return std::nullopt;
    end.node = *node;
    end.value = *value;
    return end;
  }
  if (w[0] == "lost" && w.size() == 3) {
    end.kind = RoundEnd::Kind::kNodeLost;
    auto node = int_in(w[1], 0, kMostNodes - 1);
    if (!node || !rendezvous_detail::is_member_id(w[2])) return std::nullopt;
    end.node = *node;
    end.member = w[2];
    return end;
  }
  if (w[0] == "joined" && w.size() == 2) {
    end.kind = RoundEnd::Kind::kNodeJoined;
    if (!rendezvous_detail::is_member_id(w[1])) return std::nullopt;
    end.member = w[1];
    return end;
  }
  return std::nullopt;
}

std::string describe(const RoundEnd& end) {
  switch (end.kind) {
    case RoundEnd::Kind::kRestart:
      return "a worker on node " + std::to_string(end.node) + " failed (exit code " +
             std::to_string(end.value) + ")" + (end.hang ? " after a hang" : "");
    case RoundEnd::Kind::kAbort:
      if (end.hang) {
        return "the agent of node " + std::to_string(end.node) +
               " stopped the job after a hang (--on_hang=fail)";
      }
      return "the agent of node " + std::to_string(end.node) + " stopped the job (signal " +
             std::to_string(end.value) + ")";
    case RoundEnd::Kind::kDone:
      return "every node finished";
    case RoundEnd::Kind::kNodeLost:
      return "node " + std::to_string(end.node) + " (member " + end.member +
             ") was lost: it missed its keep-alives" +
             (end.detail.empty() ? "" : " (" + end.detail + ")");
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
      : state_(std::make_shared<State>()),
        call_([state = state_, store = std::move(store), key = std::move(key),
               wake = std::move(wake), store_name = std::move(store_name)] {
          std::optional<RoundEnd> end = wait_for_end(*state, *store, key, store_name);
          if (!end) return;  // cancelled
          {
            std::lock_guard lock(state->mutex);
            state->end = end;
          }
          // Under its own mutex, which the destructor takes to cancel: once the
          // destructor returned, no wake-up starts (one in progress finishes first).
          std::lock_guard waking(state->waking);
          if (!state->cancelled) wake();
        }) {}

  ~EndKeyWatch() override {
    std::lock_guard waking(state_->waking);
    state_->cancelled = true;
    // call_'s destructor then joins a finished watch, or leaves one still
    // waiting in the store to end when the key appears or the store goes away.
  }

  std::optional<RoundEnd> ended() const override {
    std::lock_guard lock(state_->mutex);
    return state_->end;
  }

 private:
  struct State {
    mutable std::mutex mutex;
    std::optional<RoundEnd> end;
    std::mutex waking;  // held while calling wake(), and to set `cancelled`
    std::atomic<bool> cancelled{false};
  };

  // Waits for the key (a timeout only renews the wait) and reads how the
  // round ended; nullopt when the watch was cancelled meanwhile.
  static std::optional<RoundEnd> wait_for_end(const State& state, Store& store,
                                              const std::string& key,
                                              const std::string& store_name) {
    RoundEnd end;
    try {
      // One call that waits and reads: the agent that sets the key may be
      // the store's host and exit right after, so no second round trip.
      std::string value;
      for (;;) {
        try {
          value = store.get(key, std::chrono::hours(1));
          break;
        } catch (const TimeoutError&) {
          if (state.cancelled) return std::nullopt;
        }
      }
      if (auto parsed = parse_round_end(value)) return *parsed;
      end.kind = RoundEnd::Kind::kStoreLost;
      end.detail = "unreadable round end '" + shown_value(value) + "' at " + key +
                   " in the store at " + store_name;
    } catch (const std::exception& e) {
      end.kind = RoundEnd::Kind::kStoreLost;
      end.detail = "the store at " + store_name + " failed: " + e.what();
    }
    return end;
  }

  std::shared_ptr<State> state_;
  BackgroundCall call_;  // declared last: started once state_ exists
};

class EndKeyWrite : public PendingEnd {
 public:
  EndKeyWrite(std::shared_ptr<Store> store, std::string key, std::string value)
      : call_([store = std::move(store), key = std::move(key), value = std::move(value)] {
          store->compare_set(key, "", value);
        }) {}

  std::string wait_until(Clock::time_point deadline) override {
    if (!call_.wait_until(deadline)) return "the store did not answer in time; not waiting for it";
    if (auto error = call_.error()) return what_of(error);
    return "";
  }

 private:
  BackgroundCall call_;
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

StoreRound::StoreRound(RendezvousInfo info, RendezvousHandler& handler, bool solo,
                       const char* origin, std::function<Duration()> grace,
                       std::function<bool()> needed)
    : Round(std::move(info)), handler_(handler), solo_(solo), origin_(origin),
      grace_(std::move(grace)), needed_(std::move(needed)) {}

std::unique_ptr<RoundWatch> StoreRound::watch(std::function<void()> wake) {
  if (solo_) return inert_watch();
  return watch_end_key(handler_.open_store(), info().round_prefix + "/end", std::move(wake),
                       handler_.store_name());
}

std::unique_ptr<PendingEnd> StoreRound::end(const RoundEnd& end) {
  if (solo_) return nothing_to_tell();
  return set_end_key(handler_.store(), info().round_prefix + "/end", encode_round_end(end));
}

void StoreRound::arrive_at_exit_barrier(Clock::time_point deadline) {
  if (solo_) return;
  rendezvous_detail::arrive_at_exit_barrier(handler_.store(), info(), deadline, origin_);
}

std::chrono::milliseconds StoreRound::grace_for_membership_change() {
  return grace_ ? grace_() : Duration(0);
}

bool StoreRound::needed_by_others() {
  if (solo_ || !needed_) return false;
  try {
    return needed_();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace rendezvous_detail
}  // namespace ddp
