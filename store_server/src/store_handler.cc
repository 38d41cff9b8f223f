#include "store_handler.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>

#include "ddp/common/error.h"
#include "ddp/store/store_util.h"

namespace ddp {

using protocol::Op;
using protocol::Status;

namespace {

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace

void StoreHandler::reserve(std::uint64_t added, std::uint64_t removed) const {
  if (added <= removed) return;
  std::uint64_t after = stored_bytes_ - std::min(removed, stored_bytes_) + added;
  if (after > limits_.max_store_bytes) {
    throw Refused{Status::kStoreFull,
                  fmt::format("store full: the store would hold {} of its limit of {} "
                              "(max_store_bytes)",
                              mib(after), mib(limits_.max_store_bytes))};
  }
}

void StoreHandler::set(std::string_view key, std::string_view value) {
  // Look up first so that overwriting an existing key allocates nothing new.
  auto it = data_.find(key);
  if (it != data_.end()) {
    reserve(entry_bytes(key.size(), value.size()), entry_bytes(key.size(), it->second.size()));
    stored_bytes_ = stored_bytes_ - entry_bytes(key.size(), it->second.size()) +
                    entry_bytes(key.size(), value.size());
    it->second.assign(value);
  } else {
    reserve(entry_bytes(key.size(), value.size()), 0);
    data_.emplace(std::string(key), std::string(value));
    stored_bytes_ += entry_bytes(key.size(), value.size());
  }
  wake(key);
}

void StoreHandler::erase(Map::iterator it) {
  stored_bytes_ -= entry_bytes(it->first.size(), it->second.size());
  data_.erase(it);
}

bool StoreHandler::handle(const protocol::Request& q, std::string& out, Waiter* waiter) {
  try {
    switch (q.op) {
      case Op::kSet:
        set(q.key, q.value);
        protocol::encode_ok(out);
        return true;
      case Op::kAppend: {
        auto it = data_.find(q.key);
        if (it == data_.end()) {
          set(q.key, q.value);
          protocol::encode_ok(out);
          return true;
        }
        const std::uint64_t grown = it->second.size() + q.value.size();
        if (grown > limits_.max_value_size) {
          throw Refused{Status::kInvalidArgument,
                        fmt::format("append would grow key '{}' to {} bytes, above the limit of "
                                    "{} bytes (max_value_size)",
                                    q.key, grown, limits_.max_value_size)};
        }
        reserve(q.value.size(), 0);
        stored_bytes_ += q.value.size();
        it->second.append(q.value);
        wake(q.key);
        protocol::encode_ok(out);
        return true;
      }
      case Op::kGet:
      case Op::kWait:
      case Op::kMultiGet: {
        views_.clear();
        if (q.op == Op::kGet) {
          views_.push_back(q.key);
        } else {
          views_.assign(q.keys.begin(), q.keys.end());
        }
        bool all = std::all_of(views_.begin(), views_.end(),
                               [&](std::string_view k) { return data_.find(k) != data_.end(); });
        if (all) {
          reply_ready(q.op, views_, out);
          return true;
        }
        return park(q, waiter, out);
      }
      case Op::kAdd: {
        auto it = data_.find(q.key);
        std::string key(q.key);
        auto result =
            store_util::add_to_decimal(it == data_.end() ? nullptr : &it->second, q.delta, "", key);
        // Format in place: a counter's string keeps its capacity (no allocation per add).
        char digits[24];
        auto end = std::to_chars(digits, digits + sizeof(digits), result).ptr;
        std::string_view text(digits, static_cast<std::size_t>(end - digits));
        if (it != data_.end()) {
          stored_bytes_ = stored_bytes_ - it->second.size() + text.size();
          it->second.assign(text);
        } else {
          reserve(entry_bytes(key.size(), text.size()), 0);
          stored_bytes_ += entry_bytes(key.size(), text.size());
          data_.emplace(std::move(key), std::string(text));
        }
        wake(q.key);
        protocol::encode_integer(out, result);
        return true;
      }
      case Op::kCompareSet: {
        std::string key(q.key);
        auto it = data_.find(key);
        const bool missing = it == data_.end();
        // Only a swap changes the stored bytes: a missing key with an empty
        // `expected`, or a present one equal to `expected`.
        if (missing ? q.value.empty() : it->second == q.value) {
          reserve(entry_bytes(key.size(), q.desired.size()),
                  missing ? 0 : entry_bytes(key.size(), it->second.size()));
          stored_bytes_ = stored_bytes_ + entry_bytes(key.size(), q.desired.size()) -
                          (missing ? 0 : entry_bytes(key.size(), it->second.size()));
        }
        auto result =
            store_util::compare_set(data_, it, key, std::string(q.value), std::string(q.desired));
        wake(q.key);
        protocol::encode_value(out, result);
        return true;
      }
      case Op::kCheck: {
        bool all = std::all_of(q.keys.begin(), q.keys.end(),
                               [&](std::string_view k) { return data_.find(k) != data_.end(); });
        protocol::encode_flag(out, all);
        return true;
      }
      case Op::kDeleteKey: {
        auto it = data_.find(q.key);
        bool existed = it != data_.end();
        if (existed) erase(it);
        protocol::encode_flag(out, existed);
        return true;
      }
      case Op::kNumKeys:
        protocol::encode_integer(out, static_cast<std::int64_t>(data_.size()));
        return true;
      case Op::kMultiSet:
        if (q.keys.size() != q.values.size()) {
          protocol::encode_error(out, Status::kInvalidArgument,
                                 "multi_set with different numbers of keys and values");
          return true;
        }
        {
          // All or nothing: the whole batch must fit before any key is set
          // (an estimate that ignores keys repeated in the batch).
          std::uint64_t added = 0, removed = 0;
          for (std::size_t i = 0; i < q.keys.size(); ++i) {
            added += entry_bytes(q.keys[i].size(), q.values[i].size());
            auto it = data_.find(q.keys[i]);
            if (it != data_.end()) removed += entry_bytes(it->first.size(), it->second.size());
          }
          reserve(added, removed);
        }
        for (std::size_t i = 0; i < q.keys.size(); ++i) set(q.keys[i], q.values[i]);
        protocol::encode_ok(out);
        return true;
      case Op::kHello:
      case Op::kAuth:
        break;
    }
    protocol::encode_error(out, Status::kUnexpected,
                           std::string(protocol::to_string(q.op)) + " after the handshake");
    return true;
  } catch (const InvalidArgument& e) {
    protocol::encode_error(out, Status::kInvalidArgument, e.what());
    return true;
  } catch (const Refused& refused) {
    protocol::encode_error(out, refused.status, refused.message);
    return true;
  }
}

void StoreHandler::reply_ready(Op op, const std::vector<std::string_view>& keys, std::string& out) {
  switch (op) {
    case Op::kGet:
      protocol::encode_value(out, data_.find(keys.front())->second);
      return;
    case Op::kMultiGet: {
      std::vector<std::string_view> values;
      values.reserve(keys.size());
      // Status byte and count, then a length and the bytes of each value: a
      // multi_get repeating one large key must not build a huge reply.
      std::uint64_t size = 5;
      for (auto k : keys) {
        values.emplace_back(data_.find(k)->second);
        size += 4 + values.back().size();
      }
      if (size > limits_.max_reply_size) {
        protocol::encode_error(
            out, Status::kReplyTooLarge,
            fmt::format("multi_get of {} keys would need a reply of {} bytes, above the limit "
                        "of {} bytes (max_frame_size)",
                        keys.size(), size, limits_.max_reply_size));
        return;
      }
      protocol::encode_values(out, values);
      return;
    }
    default:
      protocol::encode_ok(out);
      return;
  }
}

bool StoreHandler::park(const protocol::Request& q, Waiter* waiter, std::string& out) {
  if (q.timeout_ms == 0 || waiter == nullptr || parked_.count(waiter) != 0) {
    // Nothing to wait with (a zero timeout, or no waiter): time out at once.
    std::vector<std::string_view> missing;
    for (auto k : views_) {
      if (data_.find(k) == data_.end()) missing.push_back(k);
    }
    protocol::encode_error(out, Status::kTimeout,
                           store_util::timeout_message(missing, std::chrono::milliseconds(0)));
    return true;
  }
  std::uint64_t bytes = 0;
  for (auto k : views_) bytes += k.size() + sizeof(std::string);
  if (parked_bytes_ + bytes > limits_.max_parked_bytes) {
    protocol::encode_error(
        out, Status::kStoreFull,
        fmt::format("store full: cannot wait for {} key(s): waiting requests already hold {} "
                    "of their limit of {}",
                    views_.size(), mib(parked_bytes_), mib(limits_.max_parked_bytes)));
    return true;
  }
  parked_bytes_ += bytes;
  Parked p{q.op, std::vector<std::string>(views_.begin(), views_.end()), 0, q.timeout_ms, bytes,
           {}};
  while (data_.find(p.keys[p.next]) != data_.end()) ++p.next;
  register_waiter(waiter, parked_.emplace(waiter, std::move(p)).first->second);
  return false;
}

void StoreHandler::register_waiter(Waiter* waiter, Parked& p) {
  auto& list = key_waiters_[p.keys[p.next]];
  p.position = list.insert(list.end(), waiter);
}

void StoreHandler::wake(std::string_view key) {
  // The waiters there now, one at a time from the key's live list: whatever a
  // wake-up does, the list and every parked request's position in it stay
  // consistent. One that must wait on (a key it needs is missing, this one
  // too when it was not written after all) goes back to a list's end, and is
  // not taken again by this call.
  auto it = key_waiters_.find(key);
  if (it == key_waiters_.end()) return;
  for (std::size_t n = it->second.size(); n > 0; --n) {
    it = key_waiters_.find(key);
    if (it == key_waiters_.end() || it->second.empty()) break;
    Waiter* w = it->second.front();
    it->second.pop_front();
    auto pit = parked_.find(w);
    if (pit == parked_.end()) continue;
    Parked& p = pit->second;
    while (p.next < p.keys.size() && data_.find(p.keys[p.next]) != data_.end()) ++p.next;
    if (p.next == p.keys.size()) {
      // A key seen earlier may have been deleted since: check them all once
      // before answering, and wait for the first missing one again if so.
      p.next = 0;
      while (p.next < p.keys.size() && data_.find(p.keys[p.next]) != data_.end()) ++p.next;
    }
    if (p.next < p.keys.size()) {
      register_waiter(w, p);
      continue;
    }
    wake_views_.assign(p.keys.begin(), p.keys.end());
    scratch_.clear();
    reply_ready(p.op, wake_views_, scratch_);
    parked_bytes_ -= p.bytes;
    parked_.erase(pit);
    w->on_wake(scratch_);
  }
  it = key_waiters_.find(key);
  if (it != key_waiters_.end() && it->second.empty()) key_waiters_.erase(it);
}

void StoreHandler::cancel(Waiter* waiter) {
  auto pit = parked_.find(waiter);
  if (pit == parked_.end()) return;
  const Parked& p = pit->second;
  auto it = key_waiters_.find(p.keys[p.next]);
  if (it != key_waiters_.end()) {
    it->second.erase(p.position);
    if (it->second.empty()) key_waiters_.erase(it);
  }
  parked_bytes_ -= p.bytes;
  parked_.erase(pit);
}

bool StoreHandler::expire(Waiter* waiter, std::string& out) {
  auto pit = parked_.find(waiter);
  if (pit == parked_.end()) return false;
  std::vector<std::string_view> missing;
  for (const auto& k : pit->second.keys) {
    if (data_.find(k) == data_.end()) missing.push_back(k);
  }
  auto timeout = std::chrono::milliseconds(pit->second.timeout_ms);
  const std::string message = store_util::timeout_message(missing, timeout);
  cancel(waiter);
  protocol::encode_error(out, Status::kTimeout, message);
  return true;
}

void StoreHandler::shutdown(std::string_view message) {
  auto parked = std::move(parked_);
  parked_.clear();
  parked_bytes_ = 0;
  key_waiters_.clear();
  for (auto& [waiter, p] : parked) {
    scratch_.clear();
    protocol::encode_error(scratch_, Status::kShutdown, message);
    const_cast<Waiter*>(waiter)->on_wake(scratch_);
  }
}

bool StoreHandler::is_parked(const Waiter* waiter) const { return parked_.count(waiter) != 0; }

}  // namespace ddp
