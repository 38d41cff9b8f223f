#include "worker_control.h"

#include <unistd.h>

#include "ddp/common/logging.h"

namespace ddp::agent {

WorkerControl::~WorkerControl() {
  for (auto& [local_rank, channel] : channels_) close(channel);
}

void WorkerControl::close(Channel& channel) {
  if (channel.agent_fd >= 0) ::close(channel.agent_fd);
  if (channel.worker_fd >= 0) ::close(channel.worker_fd);
  channel.agent_fd = channel.worker_fd = -1;
}

int WorkerControl::prepare(int local_rank) {
  forget(local_rank);
  auto [agent_fd, worker_fd] = control::make_socket_pair();
  Channel& channel = channels_[local_rank];
  channel.agent_fd = agent_fd;
  channel.worker_fd = worker_fd;
  return worker_fd;
}

void WorkerControl::started(int local_rank) {
  auto it = channels_.find(local_rank);
  if (it == channels_.end() || it->second.worker_fd < 0) return;
  ::close(it->second.worker_fd);
  it->second.worker_fd = -1;
}

void WorkerControl::forget(int local_rank) {
  auto it = channels_.find(local_rank);
  if (it == channels_.end()) return;
  close(it->second);
  channels_.erase(it);
}

void WorkerControl::take(Channel& channel, const control::Message& m) {
  // A report of a round other than the one expected was sent before the
  // worker heard of that one: stale.
  auto current = [&](int round) {
    return !channel.expected_round || *channel.expected_round == round;
  };
  if (auto hello = contract::decode_hello(m)) {
    channel.in_place = hello->in_place;
  } else if (auto reformed = contract::decode_reformed(m)) {
    if (current(reformed->round)) channel.reformed = *reformed;
  } else if (auto synced = contract::decode_synced(m)) {
    if (current(synced->round)) channel.synced = *synced;
  } else if (m.type == "hello" || m.type == "reformed" || m.type == "synced") {
    log::get("ddprun")->warn("ignored a malformed '{}' control message", m.type);
  }  // another type: one this agent does not know
}

void WorkerControl::poll() {
  for (auto& [local_rank, channel] : channels_) {
    if (channel.agent_fd < 0) continue;
    // A bounded drain: a worker cannot keep the agent here.
    for (int i = 0; i < 64; ++i) {
      control::Message message;
      const control::Received got = control::receive(channel.agent_fd, message, false);
      if (got == control::Received::kMessage) {
        take(channel, message);
      } else if (got == control::Received::kMalformed) {
        log::get("ddprun")->warn("ignored a malformed control message from local rank {}",
                                 local_rank);
      } else {
        break;  // nothing more, or the worker is gone (its exit says the rest)
      }
    }
  }
}

bool WorkerControl::in_place(int local_rank) const {
  auto it = channels_.find(local_rank);
  return it != channels_.end() && it->second.in_place;
}

std::optional<contract::Reformed> WorkerControl::reformed(int local_rank) const {
  auto it = channels_.find(local_rank);
  return it == channels_.end() ? std::nullopt : it->second.reformed;
}

std::optional<contract::Synced> WorkerControl::synced(int local_rank) const {
  auto it = channels_.find(local_rank);
  return it == channels_.end() ? std::nullopt : it->second.synced;
}

void WorkerControl::expect_reform(int local_rank, int round) {
  auto it = channels_.find(local_rank);
  if (it == channels_.end()) return;
  it->second.expected_round = round;
  it->second.reformed.reset();
  it->second.synced.reset();
}

control::Sent WorkerControl::send(int local_rank, const control::Message& message) {
  auto it = channels_.find(local_rank);
  if (it == channels_.end() || it->second.agent_fd < 0) return control::Sent::kClosed;
  return control::send(it->second.agent_fd, message);
}

}  // namespace ddp::agent
