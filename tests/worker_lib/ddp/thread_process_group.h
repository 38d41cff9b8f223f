// An in-process ProcessGroup over threads, for fast multi-rank tests: W ranks
// share a ThreadWorld; the i-th collective of every rank meets in slot i, and
// the last rank to arrive computes it for all (so it is asynchronous for every
// other rank, as the contract requires). A collective that does not complete
// within the world's timeout fails with TimeoutError naming the missing ranks.
// 16-bit sums are accumulated rank by rank with rounding after each addition,
// as a ring allreduce in a 16-bit dtype would.
//
// abort(reason) on any rank ends the whole world, as if the agent had aborted
// every rank at once: every pending operation of every rank, and every later
// one, fails with GroupChanged naming the reason (a real Gloo peer sees
// NetworkError until its own abort); the buffers of the operations it fails
// are never touched again. Idempotent: the first reason stays.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/worker/half.h"
#include "ddp/worker/process_group.h"

namespace ddp::testing {

class ThreadWork final : public Work {
 public:
  ThreadWork(std::string op, std::uint64_t seq, std::chrono::milliseconds timeout)
      : op_(std::move(op)), seq_(seq), timeout_(timeout) {}

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    const auto limit = timeout.count() == 0 ? timeout_ : timeout;
    if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
      if (timeout.count() != 0) return false;
      throw TimeoutError("ThreadProcessGroup", op_ + " #" + std::to_string(seq_) +
                                                   " timed out; missing ranks: " + missing_);
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  bool is_completed() const override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  std::exception_ptr exception() const override {
    std::lock_guard lock(mutex_);
    return error_;
  }
  std::uint64_t sequence_number() const override { return seq_; }

  // The first call wins (a computed result or an abort).
  void complete(std::exception_ptr error) {
    {
      std::lock_guard lock(mutex_);
      if (done_) return;
      done_ = true;
      error_ = error;
    }
    cv_.notify_all();
  }
  void set_missing(std::string m) {
    std::lock_guard lock(mutex_);
    missing_ = std::move(m);
  }

 private:
  std::string op_;
  std::uint64_t seq_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string missing_ = "?";
};

class ThreadWorld {
 public:
  explicit ThreadWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : size_(size), timeout_(timeout) {}
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  struct Slot {
    std::string op;
    std::vector<Buffer> in, out;
    std::vector<std::shared_ptr<ThreadWork>> works;
    std::vector<char> arrived;
    int count = 0;
    int root = 0;
    ReduceOp reduce = ReduceOp::kSum;
  };

  std::shared_ptr<ThreadWork> join(int rank, std::uint64_t seq, const std::string& op, Buffer in,
                                   Buffer out, int root, ReduceOp reduce) {
    auto work = std::make_shared<ThreadWork>(op, seq, timeout_);
    std::unique_lock lock(mutex_);
    if (!abort_reason_.empty()) {
      auto error = aborted_error(op, seq);
      lock.unlock();
      work->complete(error);
      return work;
    }
    Slot& s = slots_[seq];
    if (s.works.empty()) {
      s.op = op;
      s.in.resize(size_);
      s.out.resize(size_);
      s.works.resize(size_);
      s.arrived.assign(size_, 0);
      s.root = root;
      s.reduce = reduce;
    }
    s.in[rank] = in;
    s.out[rank] = out;
    s.works[rank] = work;
    s.arrived[rank] = 1;
    ++s.count;
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (!s.arrived[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    }
    for (auto& w : s.works) {
      if (w) w->set_missing(missing);
    }
    if (s.count < size_) return work;
    Slot done = std::move(s);
    slots_.erase(seq);
    lock.unlock();
    // Out of slots_, so an abort from now on leaves this one to complete.
    std::exception_ptr error;
    try {
      compute(done);
    } catch (...) {
      error = std::current_exception();
    }
    for (auto& w : done.works) w->complete(error);
    return work;
  }

  // Ends the world (see the top of the file); `rank` is the rank that aborted.
  void abort(int rank, const std::string& reason) {
    std::vector<std::pair<std::shared_ptr<ThreadWork>, std::exception_ptr>> failed;
    {
      std::lock_guard lock(mutex_);
      if (!abort_reason_.empty()) return;
      abort_reason_ = "rank " + std::to_string(rank) + " aborted the group: " +
                      (reason.empty() ? std::string("(no reason given)") : reason);
      for (auto& [seq, slot] : slots_) {
        for (auto& w : slot.works) {
          if (w) failed.emplace_back(w, aborted_error(slot.op, seq));
        }
      }
      slots_.clear();
    }
    for (auto& [w, error] : failed) w->complete(error);
  }

  bool aborted() const {
    std::lock_guard lock(mutex_);
    return !abort_reason_.empty();
  }

 private:
  template <typename T>
  static void reduce_typed(Slot& s) {
    const std::size_t n = s.in[0].count;
    std::vector<T> acc(static_cast<const T*>(s.in[0].data),
                       static_cast<const T*>(s.in[0].data) + n);
    for (std::size_t r = 1; r < s.in.size(); ++r) {
      const T* p = static_cast<const T*>(s.in[r].data);
      for (std::size_t i = 0; i < n; ++i) {
        switch (s.reduce) {
          case ReduceOp::kSum:
          case ReduceOp::kAvg:
            acc[i] += p[i];
            break;
          case ReduceOp::kMin:
            acc[i] = std::min(acc[i], p[i]);
            break;
          case ReduceOp::kMax:
            acc[i] = std::max(acc[i], p[i]);
            break;
          case ReduceOp::kProduct:
            acc[i] *= p[i];
            break;
          case ReduceOp::kBand:
          case ReduceOp::kBor:
          case ReduceOp::kBxor:
            throw BackendError("ThreadProcessGroup",
                               "bitwise reductions are not implemented by the test double");
        }
      }
    }
    if (s.reduce == ReduceOp::kAvg) {
      for (auto& v : acc) v /= static_cast<T>(s.in.size());
    }
    for (auto& b : s.out) std::memcpy(b.data, acc.data(), n * sizeof(T));
  }

  template <typename T16>
  static void reduce_16(Slot& s) {
    if (s.reduce != ReduceOp::kSum && s.reduce != ReduceOp::kAvg) {
      throw BackendError("ThreadProcessGroup", "16-bit allreduce supports sum and avg only");
    }
    const std::size_t n = s.in[0].count;
    std::vector<std::uint16_t> acc(static_cast<const std::uint16_t*>(s.in[0].data),
                                   static_cast<const std::uint16_t*>(s.in[0].data) + n);
    for (std::size_t r = 1; r < s.in.size(); ++r) {
      const auto* p = static_cast<const std::uint16_t*>(s.in[r].data);
      for (std::size_t i = 0; i < n; ++i) {
        acc[i] = T16::from_float(T16::to_float(acc[i]) + T16::to_float(p[i]));
      }
    }
    if (s.reduce == ReduceOp::kAvg) {
      for (auto& v : acc) v = T16::from_float(T16::to_float(v) / static_cast<float>(s.in.size()));
    }
    for (auto& b : s.out) std::memcpy(b.data, acc.data(), n * 2);
  }

  static void compute(Slot& s) {
    for (std::size_t r = 1; r < s.in.size(); ++r) {
      if (s.in[r].count != s.in[0].count || s.in[r].dtype != s.in[0].dtype) {
        throw InvalidArgument("ThreadProcessGroup",
                              s.op + ": ranks passed buffers of different sizes or dtypes");
      }
    }
    if (s.op == "allreduce") {
      switch (s.in[0].dtype) {
        case DType::kFloat32:
          reduce_typed<float>(s);
          break;
        case DType::kFloat64:
          reduce_typed<double>(s);
          break;
        case DType::kInt32:
          reduce_typed<std::int32_t>(s);
          break;
        case DType::kInt64:
          reduce_typed<std::int64_t>(s);
          break;
        case DType::kUInt8:
          reduce_typed<std::uint8_t>(s);
          break;
        case DType::kFloat16:
          reduce_16<Half>(s);
          break;
        case DType::kBFloat16:
          reduce_16<BFloat16>(s);
          break;
        case DType::kInt8:
        case DType::kBool:
          throw BackendError("ThreadProcessGroup", std::string(to_string(s.in[0].dtype)) +
                                                       " is not implemented by the test double");
      }
    } else if (s.op == "broadcast") {
      const Buffer& src = s.in[s.root];
      for (std::size_t r = 0; r < s.in.size(); ++r) {
        if (static_cast<int>(r) != s.root) std::memcpy(s.in[r].data, src.data, src.nbytes());
      }
    } else if (s.op == "allgather") {
      const std::size_t bytes = s.in[0].nbytes();
      for (auto& out : s.out) {
        if (out.nbytes() != bytes * s.in.size()) {
          throw InvalidArgument("ThreadProcessGroup", "allgather: output has the wrong size");
        }
        for (std::size_t r = 0; r < s.in.size(); ++r) {
          std::memcpy(static_cast<std::byte*>(out.data) + r * bytes, s.in[r].data, bytes);
        }
      }
    } else if (s.op == "barrier") {
      // nothing to move
    }
  }

  // Only once abort_reason_ is set (under mutex_, or by the thread that read it so).
  std::exception_ptr aborted_error(const std::string& op, std::uint64_t seq) const {
    return std::make_exception_ptr(GroupChanged(
        "ThreadProcessGroup", op + " #" + std::to_string(seq) + " failed: " + abort_reason_));
  }

  int size_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Slot> slots_;
  std::string abort_reason_;  // non-empty once aborted
};

class ThreadProcessGroup final : public ProcessGroup {
 public:
  ThreadProcessGroup(std::shared_ptr<ThreadWorld> world, int rank)
      : ProcessGroup(rank, world->size()), world_(std::move(world)) {}

  std::string backend_name() const override { return "thread"; }

  WorkPtr allreduce(Buffer buffer, ReduceOp op) override {
    return join("allreduce", buffer, buffer, 0, op);
  }
  WorkPtr broadcast(Buffer buffer, int root) override {
    return join("broadcast", buffer, buffer, root, ReduceOp::kSum);
  }
  WorkPtr allgather(Buffer output, Buffer input) override {
    return join("allgather", input, output, 0, ReduceOp::kSum);
  }
  WorkPtr reduce_scatter(Buffer, Buffer, ReduceOp) override {
    return unsupported("reduce_scatter");
  }
  WorkPtr reduce(Buffer, int, ReduceOp) override { return unsupported("reduce"); }
  WorkPtr barrier() override { return join("barrier", Buffer{}, Buffer{}, 0, ReduceOp::kSum); }
  WorkPtr gather(Buffer, Buffer, int) override { return unsupported("gather"); }
  WorkPtr scatter(Buffer, Buffer, int) override { return unsupported("scatter"); }
  WorkPtr alltoall(Buffer, Buffer, std::vector<std::size_t>, std::vector<std::size_t>) override {
    return unsupported("alltoall");
  }
  WorkPtr send(Buffer, int, int) override { return unsupported("send"); }
  WorkPtr recv(Buffer, int, int) override { return unsupported("recv"); }
  WorkPtr recv_any(Buffer, int) override { return unsupported("recv_any"); }
  void abort(const std::string& reason) override { world_->abort(rank(), reason); }

  std::uint64_t issued() const {
    std::lock_guard lock(mutex_);
    return seq_;
  }

 private:
  WorkPtr join(const std::string& op, Buffer in, Buffer out, int root, ReduceOp reduce) {
    std::lock_guard lock(mutex_);  // issue order = lock order, as the contract says
    return world_->join(rank(), seq_++, op, in, out, root, reduce);
  }
  [[noreturn]] WorkPtr unsupported(const char* op) {
    throw BackendError("ThreadProcessGroup",
                       std::string(op) + " is not implemented by the test double");
  }

  std::shared_ptr<ThreadWorld> world_;
  mutable std::mutex mutex_;
  std::uint64_t seq_ = 0;
};

}  // namespace ddp::testing
