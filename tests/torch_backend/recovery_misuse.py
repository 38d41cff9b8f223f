"""ddp_torch's in-place recovery used where it cannot work: clear errors, no hang.
One process over env:// (no agent; recovery_driver.py misuse sets MASTER_ADDR,
MASTER_PORT, RANK=0, WORLD_SIZE=1). Prints "misuse: ok" or raises.
"""
import os
import sys

import torch
import torch.distributed as dist

import ddp_torch


def expect(what, error_type, call, *needles):
    try:
        call()
    except error_type as e:
        missing = [n for n in needles if n not in str(e)]
        assert not missing, f"{what}: the error does not name {missing}: {e}"
        print(f"{what}: {type(e).__name__}: {e}", flush=True)
        return
    raise AssertionError(f"{what}: no {error_type.__name__}")


def main():
    assert issubclass(ddp_torch.GroupChanged, RuntimeError)
    # Without the opt-in: torch's init_process_group, and reform() says what is missing.
    ddp_torch.init_process_group("ddp")
    assert not ddp_torch.recovers_in_place()
    expect("reform() without recover_in_place", RuntimeError, ddp_torch.reform,
           "recover_in_place=True")
    t = torch.ones(3)
    dist.all_reduce(t)  # the group works as torch's own
    assert t.tolist() == [1.0, 1.0, 1.0], t
    dist.destroy_process_group()
    # With it, outside ddprun: the same group, and reform() names the launcher.
    expect("recover_in_place with another backend", ValueError,
           lambda: ddp_torch.init_process_group("gloo", recover_in_place=True), "'ddp'")
    expect("recover_in_place with a rank", ValueError,
           lambda: ddp_torch.init_process_group(recover_in_place=True, rank=0, world_size=1), "rank")
    ddp_torch.init_process_group(recover_in_place=True)
    assert not ddp_torch.recovers_in_place()
    assert dist.get_backend() == "ddp"
    expect("reform() outside ddprun", RuntimeError, ddp_torch.reform, "ddprun")
    dist.all_reduce(t)
    print("misuse: ok", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # torch 1.13 may deadlock in ~ProcessGroupGloo at exit
