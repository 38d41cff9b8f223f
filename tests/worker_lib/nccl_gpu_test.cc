// The NCCL backend on real GPUs: skipped without a CUDA device (label gpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store/memory_store.h"
#include "ddp/worker/process_group_nccl.h"

#ifdef DDP_WITH_NCCL
#include <cuda_runtime_api.h>
#endif

namespace ddp {
namespace {

TEST(NcclGpu, BuiltWithoutNcclThrowsBackendError) {
#ifdef DDP_WITH_NCCL
  GTEST_SKIP() << "built with NCCL";
#else
  EXPECT_THROW(make_nccl_process_group(std::make_shared<MemoryStore>(), 0, 1), BackendError);
#endif
}

#ifdef DDP_WITH_NCCL
// Runs fn(rank, group) on one thread per CUDA device, rank r on device r
// (current on its thread), all in one NCCL group.
void on_every_device(const std::function<void(int, ProcessGroup&)>& fn) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < devices; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions options;
      options.device = r;
      auto pg = make_nccl_process_group(store, r, devices, options);
      cudaSetDevice(r);
      fn(r, *pg);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclGpu, AllreduceSumOnOneRankPerDevice) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  int devices = 0;
  cudaGetDeviceCount(&devices);
  std::vector<float> results(devices, 0.0f);
  on_every_device([&](int r, ProcessGroup& pg) {
    float* d = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&d), 1024 * sizeof(float));
    std::vector<float> h(1024, static_cast<float>(r + 1));
    cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    pg.allreduce(Buffer::of(d, 1024, Device::cuda(r)))->wait();
    cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
    results[r] = h[1023];
    cudaFree(d);
  });
  for (float v : results) EXPECT_EQ(v, static_cast<float>(devices * (devices + 1) / 2));
}

// Rank r's value at element i of what it sends to rank `to`.
float sent_value(int r, int to, std::size_t i) {
  return static_cast<float>(r * 100 + to * 10 + static_cast<int>(i % 7));
}

TEST(NcclGpu, GatherScatterAndAlltoallOnOneRankPerDevice) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  int devices = 0;
  cudaGetDeviceCount(&devices);
  const std::size_t n = 257;
  const auto world = static_cast<std::size_t>(devices);
  std::vector<std::vector<float>> gathered(world), scattered(world), exchanged(world);
  on_every_device([&](int r, ProcessGroup& pg) {
    const auto device = Device::cuda(r);
    float* one = nullptr;
    float* all = nullptr;
    float* all_out = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&one), n * sizeof(float));
    cudaMalloc(reinterpret_cast<void**>(&all), n * world * sizeof(float));
    cudaMalloc(reinterpret_cast<void**>(&all_out), n * world * sizeof(float));
    std::vector<float> h(n * world);
    for (std::size_t to = 0; to < world; ++to) {
      for (std::size_t i = 0; i < n; ++i) h[to * n + i] = sent_value(r, static_cast<int>(to), i);
    }
    cudaMemcpy(all, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(one, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);  // its chunk for rank 0
    // Gather to rank 0, into all_out; scatter from rank 0's `all` into `one`.
    pg.gather(Buffer::of(all_out, n * world, device), Buffer::of(one, n, device), 0)->wait();
    gathered[r].resize(n * world);
    cudaMemcpy(gathered[r].data(), all_out, n * world * sizeof(float), cudaMemcpyDeviceToHost);
    pg.scatter(Buffer::of(one, n, device), Buffer::of(all, n * world, device), 0)->wait();
    scattered[r].resize(n);
    cudaMemcpy(scattered[r].data(), one, n * sizeof(float), cudaMemcpyDeviceToHost);
    pg.alltoall(Buffer::of(all_out, n * world, device), Buffer::of(all, n * world, device), {}, {})
        ->wait();
    exchanged[r].resize(n * world);
    cudaMemcpy(exchanged[r].data(), all_out, n * world * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(one);
    cudaFree(all);
    cudaFree(all_out);
  });
  for (std::size_t from = 0; from < world; ++from) {
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(gathered[0][from * n + i], sent_value(static_cast<int>(from), 0, i));
    }
  }
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(scattered[r][i], sent_value(0, static_cast<int>(r), i));
      for (std::size_t from = 0; from < world; ++from) {
        EXPECT_EQ(exchanged[r][from * n + i],
                  sent_value(static_cast<int>(from), static_cast<int>(r), i));
      }
    }
  }
}

TEST(NcclGpu, BitwiseOpsAndRecvAnyAreRefusedNamingThem) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  auto pg = make_nccl_process_group(std::make_shared<MemoryStore>(), 0, 1);
  cudaSetDevice(0);
  std::int32_t* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), 4 * sizeof(std::int32_t));
  const Buffer buffer = Buffer::of(d, 4, Device::cuda(0));
  try {
    pg->allreduce(buffer, ReduceOp::kBxor);
    ADD_FAILURE() << "bxor was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bxor is not supported by NCCL"), std::string::npos);
  }
  try {
    pg->recv_any(buffer);
    ADD_FAILURE() << "recv_any was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("recv from any source is not supported by NCCL"),
              std::string::npos);
  }
  cudaFree(d);
}

TEST(NcclGpu, WithoutADeviceCreationFailsWithAClearError) {
  if (nccl_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_nccl_process_group(std::make_shared<MemoryStore>(), 0, 1);
    FAIL() << "expected an error without a CUDA device";
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::kBackend || e.kind() == ErrorKind::kInvalidArgument)
        << e.what();
  }
}

TEST(NcclGpu, RejectsCpuBuffers) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  auto pg = make_nccl_process_group(std::make_shared<MemoryStore>(), 0, 1);
  std::vector<float> h(4);
  EXPECT_THROW(pg->allreduce(Buffer::of(h)), InvalidArgument);
}
#endif

}  // namespace
}  // namespace ddp
