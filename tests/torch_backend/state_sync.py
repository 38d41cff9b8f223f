"""ddp_torch.sync_state on 3 ranks (env://, backend "ddp", no agent), run by state_driver.py.

Phases, each with a model and optimizer of its own (liveness is the process's):
1. ranks 1 and 2 sync Adam state on a group of their own (a fresh start there:
   rank 1's wins) and become live; rank 0 stays a fresh process.
2. all 3 sync Adam state: the root is rank 1, the lowest live rank, not rank 0;
   rank 0, which never stepped, receives exp_avg, exp_avg_sq and the `step`
   tensor, rank 1's lr and betas and counters; rank 2's own later changes are
   overwritten too.
3. all live now: rank 0 is the root. SGD with momentum: only rank 0 stepped;
   its parameters hold -0.0, NaNs with payloads and infinities; a buffer is
   non-contiguous. Every bit of every tensor arrives (bytes compared), the
   momentum buffers are allocated on ranks 1 and 2, lr and momentum adopted.
4. registrations that differ (a parameter's shape on rank 2, the optimizer's
   type on rank 1, counter names on rank 2): RuntimeError on every rank naming
   the differing rank and the first difference, no tensor changed anywhere;
   a counter that is not an int is refused. A sync after them still works.
5. a layout too large for the layouts' exchange's first round (3000 parameters)
   takes its second round.
ElasticDistributedSampler takes its world from the default group. Each rank prints
"rank <r>: ok".
"""
import pickle

import torch
import torch.distributed as dist
import ddp_torch
import rank_main


class Net(torch.nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, width)
        self.norm = torch.nn.BatchNorm1d(16)
        self.register_buffer("strided", torch.arange(24, dtype=torch.float64).reshape(4, 6).t())

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def make(seed, width=4):
    torch.manual_seed(seed)
    return Net(width)


def train(net, opt, seed, steps):
    torch.manual_seed(100 + seed)
    for _ in range(steps):
        opt.zero_grad()
        net(torch.randn(8, 8)).pow(2).sum().backward()
        opt.step()


def raw(t):
    """The tensor's bytes (bit for bit: -0.0, NaN payloads)."""
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def snapshot(net, opt):
    """Every bit of the model and optimizer: tensors' bytes, other values as they are."""
    out = {f"module.{n}": raw(t) for n, t in list(net.named_parameters()) + list(net.named_buffers())}
    if opt is not None:
        names = {id(p): n for n, p in net.named_parameters()}
        for p, state in opt.state.items():
            for key, value in state.items():
                out[f"state.{names[id(p)]}.{key}"] = raw(value) if torch.is_tensor(value) else value
        out["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return out


def gathered(obj, group=None):
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_same_as(root, net, opt, group=None):
    """Every rank of `group` holds what its rank `root` (a rank of the group) holds."""
    everyone = gathered(snapshot(net, opt), group)
    ref = everyone[root]
    for r, snap in enumerate(everyone):
        diff = [k for k in set(snap) | set(ref) if snap.get(k) != ref.get(k)]
        expect(not diff, f"rank {r} differs from rank {root} in {sorted(diff)}")


def phase_survivors(rank, pair):
    """Ranks 1 and 2 become live on their own group; the Adam model they keep."""
    net = make(rank)
    opt = torch.optim.Adam(net.parameters(), lr=0.01 * (rank + 1), betas=(0.8, 0.9))
    if rank == 0:
        return None, None
    train(net, opt, rank, 2)
    counters = ddp_torch.sync_state(net, opt, {"step": 10 * rank, "epoch": rank}, group=pair)
    expect(counters == {"step": 10, "epoch": 1}, f"counters {counters}")
    info = ddp_torch.last_sync()
    expect(info.root == 0 and info.received == (rank == 2) and not info.from_live, f"{info}")
    expect_same_as(0, net, opt, pair)
    train(net, opt, rank, rank)  # rank 2 drifts: rank 1's state must win next
    return net, opt


def phase_lowest_live(rank, net, opt):
    if rank == 0:  # fresh: never stepped, no optimizer state, another lr
        net = make(7)
        opt = torch.optim.Adam(net.parameters(), lr=0.5)
    before = snapshot(net, opt) if rank == 1 else None
    counters = ddp_torch.sync_state(net, opt, {"epoch": 100 + rank, "step": 1000 + rank})
    expect(counters == {"epoch": 101, "step": 1001}, f"counters {counters}")
    info = ddp_torch.last_sync()
    expect(info.root == 1 and info.from_live and info.received == (rank != 1), f"{info}")
    expect(info.bytes > 0 and info.seconds >= 0, f"{info}")
    if rank == 1:
        expect(snapshot(net, opt) == before, "the root's state changed")
    expect_same_as(1, net, opt)
    state = opt.state[net.fc1.weight]
    expect(set(state) == {"step", "exp_avg", "exp_avg_sq"}, f"Adam state {sorted(state)}")
    expect(torch.is_tensor(state["step"]) and state["step"].item() == 3.0, f"step {state['step']}")
    expect(opt.param_groups[0]["lr"] == 0.02 and opt.param_groups[0]["betas"] == (0.8, 0.9),
           f"hyperparameters {opt.param_groups[0]}")
    train(net, opt, 0, 1)  # the received state trains: the same step on every rank
    expect_same_as(1, net, opt)


def special_values(net):
    """-0.0, NaNs with payloads, infinities and a denormal in fc1's weight (rank 0 only)."""
    with torch.no_grad():
        bits = net.fc1.weight.view(-1).view(torch.int32)
        for i, word in enumerate([0x80000000, 0x7FC00001, 0x7FA00F00, -8388608, 0x7F800000, 0x00000001]):
            bits[i] = word - (1 << 32) if word >= 1 << 31 else word


def phase_root_zero(rank):
    net = make(rank)
    opt = torch.optim.SGD(net.parameters(), lr=0.1 + rank, momentum=0.9, nesterov=rank == 0)
    if rank == 0:
        train(net, opt, 0, 2)
        special_values(net)
        with torch.no_grad():
            opt.state[net.fc2.bias]["momentum_buffer"].view(torch.int32)[0] = 0x7FC0BEEF
    else:
        net.strided.mul_(-1)
    counters = ddp_torch.sync_state(net, opt, {"position": 64 * rank})
    expect(counters == {"position": 0}, f"counters {counters}")
    info = ddp_torch.last_sync()
    expect(info.root == 0 and info.from_live and info.received == (rank != 0), f"{info}")
    strided = torch.arange(24, dtype=torch.float64).reshape(4, 6).t()
    expect(not net.strided.is_contiguous() and torch.equal(net.strided, strided), f"{net.strided}")
    expect(all("momentum_buffer" in opt.state[p] for p in net.parameters()), "momentum buffers missing")
    expect(opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["nesterov"], f"{opt.param_groups[0]}")
    expect_same_as(0, net, opt)
    return net, opt


def expect_refused(rank, what, call, needle):
    try:
        call()
    except RuntimeError as e:
        expect(needle in str(e), f"{what}: {e}")
        return
    raise AssertionError(f"{what}: sync_state did not raise on rank {rank}")


def phase_mismatch(rank, net, opt):
    before = snapshot(net, opt)
    other = make(rank, width=5 if rank == 2 else 4)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    expect_refused(rank, "shape", lambda: ddp_torch.sync_state(other, other_opt),
                   "rank(s) 2 hold a model, optimizer or counters that differ from rank 0's (the lowest "
                   "live rank); nothing was changed: module entry 2 is parameter 'fc2.weight' (5x16, "
                   "float32, cpu) on rank 2 but parameter 'fc2.weight' (4x16, float32, cpu) on rank 0")
    wrong = torch.optim.Adam(net.parameters()) if rank == 1 else opt
    expect_refused(rank, "optimizer type", lambda: ddp_torch.sync_state(net, wrong),
                   "the optimizer is torch.optim.adam.Adam on rank 1 but torch.optim.sgd.SGD on rank 0")
    names = {"step": 1, "epoch": 0} if rank == 2 else {"step": 1}
    expect_refused(rank, "counters", lambda: ddp_torch.sync_state(net, opt, names),
                   "the counters are ['epoch', 'step'] on rank 2 but ['step'] on rank 0")
    expect_refused(rank, "not an int", lambda: ddp_torch.sync_state(net, opt, {"step": 1.5}),
                   "counter 'step' is 1.5, not an int")
    expect(snapshot(net, opt) == before, "a refused sync_state changed the state")
    counters = ddp_torch.sync_state(net, opt, {"step": rank})
    expect(counters == {"step": 0}, f"counters after the refusals {counters}")


def phase_large_layout(rank):
    """A layout too large for the exchange's first round (over 64 KiB pickled: 3000 parameters)."""
    net = torch.nn.Module()
    for i in range(3000):
        net.register_parameter(f"parameter_with_a_long_name_{i}", torch.nn.Parameter(torch.full((2,), float(rank))))
    size = len(pickle.dumps(ddp_torch.state._describe(True, net, None, {})))
    expect(size > 64 * 1024, f"the layout is only {size} bytes")
    expect(ddp_torch.sync_state(net, None, {"n": rank}) == {"n": 0}, "counters")
    expect(all(p.eq(0).all() for p in net.parameters()), "rank 0's parameters did not arrive")


def main():
    dist.init_process_group("ddp")
    rank = dist.get_rank()
    expect(ddp_torch.last_sync() is None, "last_sync before any sync")
    sampler = ddp_torch.ElasticDistributedSampler(range(30), shuffle=False)  # the world's defaults
    expect((sampler.num_replicas, sampler.rank, list(sampler)) == (3, rank, list(range(rank, 30, 3))),
           f"sampler {sampler.num_replicas} {sampler.rank} {list(sampler)}")
    pair = dist.new_group([1, 2], backend="ddp")
    net, opt = phase_survivors(rank, pair)
    phase_lowest_live(rank, net, opt)
    net, opt = phase_root_zero(rank)
    phase_mismatch(rank, net, opt)
    phase_large_layout(rank)
    dist.barrier()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    rank_main.run(main)
