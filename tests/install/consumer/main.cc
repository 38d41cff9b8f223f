// A training program outside the ddp tree: joins its group from ddprun's
// environment and all-reduces one number.
#include <cstdio>
#include <vector>

#include <ddp/worker/init.h>

int main() {
  ddp::init_process_group();
  std::vector<float> value{static_cast<float>(ddp::rank() + 1)};
  ddp::default_group()->allreduce(ddp::Buffer::of(value))->wait();
  std::printf("rank %d of %d: sum %g\n", ddp::rank(), ddp::world_size(), value[0]);
  ddp::destroy_process_group();
  return 0;
}
