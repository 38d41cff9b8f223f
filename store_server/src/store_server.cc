#include "ddp/store_server/store_server.h"

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "ddp/common/error.h"
#include "server.h"

namespace ddp {

class StoreServer::Impl {
 public:
  explicit Impl(const StoreServerOptions& options) : server(options) {}

  server::Server server;
  std::mutex mutex;
  std::thread thread;
  bool started = false;  // start() or run() was called
  std::atomic<bool> running_on_caller{false};
};

StoreServer::StoreServer(const StoreServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}

StoreServer::~StoreServer() {
  try {
    stop();
  } catch (...) {
    // Destructors do not throw; stop() only fails on a broken thread library.
  }
}

void StoreServer::start() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->started) return;
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->server.run(); });
}

void StoreServer::run() {
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->started) return;
    impl_->started = true;
    impl_->running_on_caller = true;
  }
  impl_->server.run();
  impl_->running_on_caller = false;
}

void StoreServer::stop() {
  impl_->server.stop();
  std::lock_guard lock(impl_->mutex);
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  } else if (!impl_->started) {
    // Never served: run the shutdown here so sockets and timers are released.
    impl_->started = true;
    impl_->server.run();
  }
}

std::uint16_t StoreServer::port() const { return impl_->server.port(); }

const StoreServerOptions& StoreServer::options() const { return impl_->server.options(); }

std::size_t StoreServer::num_clients() const { return impl_->server.num_clients(); }

StoreServerStats StoreServer::stats(std::chrono::milliseconds wait) const {
  // Read on the serving thread, which owns every figure; the promise is
  // shared so that an answer after the caller gave up touches nothing gone.
  auto promise = std::make_shared<std::promise<StoreServerStats>>();
  auto answer = promise->get_future();
  server::Server* server = &impl_->server;
  boost::asio::post(server->io_context(),
                    [server, promise] { promise->set_value(server->stats()); });
  if (answer.wait_for(wait) != std::future_status::ready) {
    throw TimeoutError("store server", "the serving thread did not answer within " +
                                           std::to_string(wait.count()) + " ms");
  }
  return answer.get();
}

}  // namespace ddp
