"""CUDA tensors through the torch backend "ddp" (ddp::worker's NCCL groups).

Run by driver.py (`driver.py cuda`) on 2 ranks under ddprun, only where torch
sees at least 2 CUDA devices and the build has NCCL (otherwise the driver skips
it). Each rank works on the device LOCAL_RANK. all_reduce (SUM, PRODUCT, MIN,
MAX; float16, float32, float64, int32, int64), broadcast from every root,
async_op with wait() and with get_future(), a non-contiguous tensor, and a CPU
all_reduce on the same group between CUDA ones. Each result is checked against
what this rank computes alone from every rank's input, and must stay on the
rank's device. Prints "rank <r>: ok ..." and exits 0, or raises (exit 1).
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

import ddp_torch  # noqa: F401  (registers "ddp")
import collectives
import rank_main
from collectives import reduce_alone

R = dist.ReduceOp
DTYPES = [torch.float16, torch.float32, torch.float64, torch.int32, torch.int64]
OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX}


# Inputs, the reduction each rank computes alone and the comparison are the CPU
# matrix's (collectives.py); here every result must also stay on its device.
def value(rank, dtype, n=1000, offset=0):
    return collectives.value(rank, dtype, n, offset)


class Checks(collectives.Checks):
    def __init__(self, device):
        super().__init__()
        self.device = device

    def same(self, got, expected, what):
        """`got` (on this rank's device) equals `expected` (on the CPU)."""
        if got.device != self.device:
            raise AssertionError(f"{what}: the result is on {got.device}, expected {self.device}")
        super().same(got.cpu(), expected, what)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("ddp", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    checks = Checks(device)

    for dtype in DTYPES:
        inputs = [value(r, dtype) for r in range(size)]
        for name, op in OPS.items():
            t = inputs[rank].to(device, copy=True)
            dist.all_reduce(t, op=op)
            checks.same(t, reduce_alone(inputs, op), f"all_reduce {name} {dtype}")
        for root in range(size):
            t = value(rank, dtype, offset=10).to(device, copy=True)
            dist.broadcast(t, src=root)
            checks.same(t, value(root, dtype, offset=10), f"broadcast from {root} {dtype}")

    inputs = [value(r, torch.float32, n=1 << 20) for r in range(size)]
    expected = reduce_alone(inputs, R.SUM)
    t = inputs[rank].to(device, copy=True)
    dist.all_reduce(t, async_op=True).wait()
    checks.same(t, expected, "all_reduce async_op wait()")
    t = inputs[rank].to(device, copy=True)
    (got,) = dist.all_reduce(t, async_op=True).get_future().wait()
    checks.same(got, expected, "all_reduce async_op get_future()")
    t = value(rank, torch.float32, n=64, offset=20).to(device, copy=True)
    dist.broadcast(t, src=1, async_op=True).wait()
    checks.same(t, value(1, torch.float32, n=64, offset=20), "broadcast async_op wait()")

    # A column of a row-major matrix: every second element.
    matrices = [value(r, torch.float32, n=2 * 300).reshape(300, 2) for r in range(size)]
    column = matrices[rank].to(device, copy=True)[:, 1]
    dist.all_reduce(column)
    checks.same(column, reduce_alone([m[:, 1] for m in matrices], R.SUM), "all_reduce non-contiguous")

    # A CPU collective on the same group between CUDA ones.
    cpu = value(rank, torch.int64, n=16)
    dist.all_reduce(cpu)
    if not torch.equal(cpu, reduce_alone([value(r, torch.int64, n=16) for r in range(size)], R.SUM)):
        raise AssertionError(f"CPU all_reduce after CUDA ones: got {cpu.tolist()}")
    t = value(rank, torch.float64).to(device, copy=True)
    dist.all_reduce(t, op=R.MAX)
    checks.same(t, reduce_alone([value(r, torch.float64) for r in range(size)], R.MAX),
                "CUDA all_reduce after a CPU one")

    torch.cuda.synchronize(device)
    dist.barrier()
    print(f"rank {rank}: ok {checks.count} checks on {device} "
          f"({torch.cuda.get_device_name(device)})", flush=True)


if __name__ == "__main__":
    rank_main.run(main)
