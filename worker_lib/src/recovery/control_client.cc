#include "recovery/control_client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/common/background.h"
#include "ddp/common/error.h"
#include "ddp/common/time.h"
#include "ddp/worker_contract/env_names.h"

namespace ddp::detail {

namespace {

// The longest a failed collective waits for the agent's word (explain()).
constexpr std::chrono::milliseconds kMaxGrace{600000};

// The descriptor named by `text` when it is a SOCK_SEQPACKET Unix socket
// (an agent's control channel); -1 for anything else, left alone.
int control_socket(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 3 || fd > 1 << 20) return -1;
  int type = 0;
  int domain = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_SEQPACKET) {
    return -1;
  }
  len = sizeof(domain);
  if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
      domain != AF_UNIX) {
    return -1;
  }
  // Programs this worker starts must not inherit it.
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return static_cast<int>(fd);
}

}  // namespace

struct ControlClient::State {
  int fd = -1;
  std::mutex mutex;
  std::condition_variable cv;
  std::shared_ptr<AbortSignal> current = std::make_shared<AbortSignal>();
  std::vector<std::weak_ptr<ProcessGroup>> groups;  // of the current round
  std::optional<NextRound> next;                    // named by the agent, not joined yet
  int round = -1;                                   // the current round's number (round())
  // Each generation's round number (-1: unknown); back() is the current one's.
  std::vector<int> numbers{-1};
  std::string stopped;  // why in-place recovery is over
  // How long a failed collective waits for the agent's word (explain()).
  std::chrono::milliseconds grace{0};
};

namespace {
std::mutex open_mutex;
bool opened = false;
ControlClient* the_client = nullptr;  // lives as long as the process
}  // namespace

ControlClient* ControlClient::open(std::chrono::milliseconds change_grace) {
  std::lock_guard lock(open_mutex);
  if (opened) return the_client;
  opened = true;
  const char* text = std::getenv(env_names::kControlFd);
  const int fd = control_socket(text);
  if (fd < 0) {
    if (text != nullptr && *text != '\0') {
      spdlog::warn(
          "{}={} is not an agent's control channel: this worker will be restarted, "
          "not recovered in place",
          env_names::kControlFd, text);
    }
    return nullptr;
  }
  auto* client =
      new ControlClient(fd, change_grace);  // never deleted: its thread may outlive main()
  if (!client->send(contract::encode(contract::Hello{true, ::getpid()}))) {
    spdlog::warn("the agent did not get this worker's hello: it will not recover in place");
  }
  // Its reader (ddp/common/background.h: the call owns the client, which is
  // never deleted) reads as long as the process lives, or until the agent's
  // end closes: it is never waited for, so it is abandoned at once, when
  // `reader` goes out of scope. (A BackgroundCall never destroyed would leave
  // its thread neither joined nor detached: ThreadSanitizer reports that as a
  // thread leak at exit.)
  BackgroundCall reader([client] {
    try {
      client->read_loop();
    } catch (...) {
      std::terminate();  // as before: the worker must not go on deaf to its agent
    }
  });
  the_client = client;
  return client;
}

ControlClient* ControlClient::get() {
  std::lock_guard lock(open_mutex);
  return the_client;
}

ControlClient::ControlClient(int fd, std::chrono::milliseconds change_grace)
    : state_(std::make_shared<State>()) {
  state_->fd = fd;
  state_->grace = std::clamp(change_grace, std::chrono::milliseconds(0), kMaxGrace);
}

std::shared_ptr<AbortSignal> ControlClient::signal() {
  std::lock_guard lock(state_->mutex);
  return state_->current;
}

void ControlClient::track(const std::shared_ptr<ProcessGroup>& group) {
  std::string why;
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->current->is_set()) {
      state_->groups.push_back(group);
      return;
    }
    why = state_->current->why();
  }
  group->abort(why);  // made after its round ended
}

ControlClient::NextRound ControlClient::wait_next_round(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  const bool named = state_->cv.wait_for(
      lock, timeout, [&] { return state_->next.has_value() || !state_->stopped.empty(); });
  if (!state_->stopped.empty()) {
    throw ShutdownError("ddp::reform", "no in-place recovery: " + state_->stopped);
  }
  if (!named) {
    throw TimeoutError("ddp::reform", fmt::format("the agent named no next round within {} s",
                                                  std::chrono::duration<double>(timeout).count()));
  }
  NextRound next = std::move(*state_->next);
  state_->next.reset();
  state_->current = next.signal;
  state_->groups.clear();
  if (next.round) state_->round = next.round->round;
  state_->numbers.push_back(next.round ? next.round->round : -1);
  return next;
}

int ControlClient::round() {
  std::lock_guard lock(state_->mutex);
  return state_->round;
}

ControlClient::Current ControlClient::current() {
  std::lock_guard lock(state_->mutex);
  Current now;
  now.generation = static_cast<int>(state_->numbers.size()) - 1;
  now.number = state_->numbers.back();
  now.ended = state_->current->is_set();
  if (now.ended) now.why = state_->current->why();
  return now;
}

int ControlClient::round_number(int generation) {
  std::lock_guard lock(state_->mutex);
  if (generation < 0 || generation >= static_cast<int>(state_->numbers.size())) return -1;
  return state_->numbers[static_cast<std::size_t>(generation)];
}

bool ControlClient::send(const control::Message& message) {
  const control::Sent sent = control::send(state_->fd, message);
  if (sent == control::Sent::kFull || sent == control::Sent::kRefused) {
    spdlog::warn("could not tell the agent '{}' on its control channel: {}", message.type,
                 control::describe(sent));
  }
  return sent == control::Sent::kSent;
}

std::exception_ptr ControlClient::explain(std::exception_ptr error) {
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const GroupChanged&) {
    return error;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    return error;
  }
  std::shared_ptr<AbortSignal> signal;
  {
    std::unique_lock lock(state_->mutex);
    signal = state_->current;
    state_->cv.wait_for(lock, state_->grace, [&] { return signal->is_set(); });
  }
  if (!signal->is_set()) return error;
  // Expected: the round ended (the agent said why, once, short); how the
  // collective failed before the word came is a detail.
  spdlog::debug("a collective failed as the round ended: {}", what);
  return std::make_exception_ptr(GroupChanged("ProcessGroup", signal->why()));
}

void ControlClient::end_round(const std::string& why) {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    std::lock_guard lock(state_->mutex);
    state_->current->set(why);
    for (auto& weak : state_->groups) {
      if (auto group = weak.lock()) groups.push_back(std::move(group));
    }
    state_->groups.clear();
  }
  state_->cv.notify_all();  // explain() waits for it
  for (auto& group : groups) group->abort(why);
}

void ControlClient::on_abort(const std::optional<contract::Abort>& abort) {
  // Even one this worker cannot read ends the round: the agent moves on.
  const std::string why = abort && !abort->why.empty() ? abort->why : "the round ended";
  {
    std::lock_guard lock(state_->mutex);
    if (state_->next) {
      // A round named but not joined yet ended too: wait for the next one.
      state_->next->signal->set(why);
      state_->next.reset();
    } else if (abort && state_->numbers.back() < 0) {
      state_->numbers.back() = abort->round;  // the round this worker started in
    }
  }
  end_round(why);
  state_->cv.notify_all();
}

void ControlClient::read_loop() {
  for (;;) {
    control::Message message;
    const control::Received got = control::receive(state_->fd, message, /*wait=*/true);
    if (got == control::Received::kMalformed) {
      spdlog::warn("ignored a malformed message on the agent's control channel");
      continue;
    }
    if (got == control::Received::kClosed) {
      {
        std::lock_guard lock(state_->mutex);
        if (state_->stopped.empty()) state_->stopped = "the agent went away";
        state_->next.reset();
      }
      state_->cv.notify_all();
      end_round("the agent went away");
      return;
    }
    if (message.type == "abort") {
      on_abort(contract::decode_abort(message));
    } else if (message.type == "round") {
      // A malformed one is still the next round: reform() says what is wrong.
      auto round = contract::decode_round(message);
      {
        std::lock_guard lock(state_->mutex);
        if (round) state_->grace = std::min(round->change_grace, kMaxGrace);
        state_->next = NextRound{std::move(round), std::make_shared<AbortSignal>()};
      }
      state_->cv.notify_all();
    } else {
      spdlog::debug("ignored a '{}' message on the agent's control channel", message.type);
    }
  }
}

}  // namespace ddp::detail
