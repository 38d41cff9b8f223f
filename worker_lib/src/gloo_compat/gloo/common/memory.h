// gloo/common/memory.h for the Gloo that Debian packages (libgloo-dev
// 0.0~git20220518.5b14351). Its gloo/transport/tcp/pair.h and unbound_buffer.h
// include this header, which the package does not install; process_group_gloo.cc
// needs those two (ProcessGroup::abort fails Gloo's TCP pairs). worker_lib/src/gloo_compat
// is ahead of the system's include path for ddp_worker, so this file is found.
//
// Written here from Gloo's published interface. The three types must keep the
// layout libgloo was compiled with, since the pairs and buffers inside the library
// hold them: NonOwningPtr<T> and ShareableNonOwningPtr<T> are one std::shared_ptr<T>,
// WeakNonOwningPtr<T> is one std::weak_ptr<T>. Their meaning:
//   - ShareableNonOwningPtr<T> lives inside an object (an unbound buffer) and hands
//     out weak references to it; it owns nothing (its deleter does nothing), and its
//     destructor waits until no strong reference taken from it is left, so that no
//     other thread still uses the object when it goes.
//   - WeakNonOwningPtr<T> is such a weak reference (a pair keeps one per pending
//     operation).
//   - NonOwningPtr<T> is a short-lived strong reference taken from a weak one; empty
//     when the object is gone.
// Marked a system header, as Gloo's other headers are here.
#pragma GCC system_header
#pragma once

#include <memory>
#include <thread>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;
template <typename T>
class ShareableNonOwningPtr;

template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak) : ptr_(weak.ptr_.lock()) {}

  T* operator->() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  std::shared_ptr<T> ptr_;
};

template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>& root) : ptr_(root.ptr_) {}

  // Whether it was ever made from a root (expired or not): its control block is
  // not an empty weak_ptr's.
  explicit operator bool() const noexcept {
    const std::weak_ptr<T> empty;
    return ptr_.owner_before(empty) || empty.owner_before(ptr_);
  }

 protected:
  std::weak_ptr<T> ptr_;

  friend class NonOwningPtr<T>;
};

template <typename T>
class ShareableNonOwningPtr final {
 public:
  explicit ShareableNonOwningPtr(T* object) : ptr_(object, [](T*) {}) {}
  ShareableNonOwningPtr(const ShareableNonOwningPtr&) = delete;
  ShareableNonOwningPtr& operator=(const ShareableNonOwningPtr&) = delete;

  // Drops the root reference, then waits until every NonOwningPtr taken from a
  // weak reference is gone.
  ~ShareableNonOwningPtr() {
    const std::weak_ptr<T> last(ptr_);
    ptr_.reset();
    while (!last.expired()) std::this_thread::yield();
  }

 protected:
  std::shared_ptr<T> ptr_;

  friend class WeakNonOwningPtr<T>;
};

}  // namespace gloo
