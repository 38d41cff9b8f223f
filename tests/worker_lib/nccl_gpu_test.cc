// The NCCL backend on real GPUs: skipped without a CUDA device (label gpu).
#include <gtest/gtest.h>

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
TEST(NcclGpu, AllreduceSumOnOneRankPerDevice) {
  if (!nccl_available()) GTEST_SKIP() << "no CUDA device";
  int devices = 0;
  cudaGetDeviceCount(&devices);
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<float> results(devices, 0.0f);
  for (int r = 0; r < devices; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions options;
      options.device = r;
      auto pg = make_nccl_process_group(store, r, devices, options);
      cudaSetDevice(r);
      float* d = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d), 1024 * sizeof(float));
      std::vector<float> h(1024, static_cast<float>(r + 1));
      cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
      pg->allreduce(Buffer::of(d, 1024, Device::cuda(r)))->wait();
      cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
      results[r] = h[1023];
      cudaFree(d);
    });
  }
  for (auto& t : threads) t.join();
  for (float v : results) EXPECT_EQ(v, static_cast<float>(devices * (devices + 1) / 2));
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
