"""Every collective, dtype and reduce op of the torch backend "ddp", on every rank.

Run by driver.py under a launcher (ddprun or torchrun), any number of ranks >= 2.
Each result is checked against what this rank computes alone from every rank's
input (each rank can make any rank's input: inputs are functions of the rank),
and against torch's Gloo on a Gloo group of the same ranks where Gloo supports
the case: integers and bool bit-identical, floats within torch's tolerances
(torch.testing.assert_close). Prints "ok <n> checks, <m> against gloo" and exits
0, or raises at the first difference (the launcher then fails).
"""
from datetime import timedelta

import torch
import torch.distributed as dist

import ddp_torch  # noqa: F401  (registers "ddp")
import rank_main

R = dist.ReduceOp
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
DTYPES = FLOATS + INTS + [torch.bool]
ARITH_OPS = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
BIT_OPS = [R.BAND, R.BOR, R.BXOR]


class Checks:
    def __init__(self):
        self.count = 0
        self.against_gloo = 0

    def same(self, got, expected, what):
        self.count += 1
        if got.dtype != expected.dtype or got.shape != expected.shape:
            raise AssertionError(f"{what}: got {got.dtype}{list(got.shape)}, "
                                 f"expected {expected.dtype}{list(expected.shape)}")
        if got.dtype.is_floating_point:
            torch.testing.assert_close(got, expected, msg=lambda m: f"{what}: {m}")
        elif not torch.equal(got, expected):
            raise AssertionError(f"{what}: got {got.tolist()}, expected {expected.tolist()}")


def value(rank, dtype, n=5, offset=0):
    """Rank `rank`'s input: small integers (exact in every dtype), different per rank."""
    base = torch.arange(n, dtype=torch.int64) + 3 * rank + offset
    if dtype == torch.bool:
        return (base % 3) == 0
    if dtype.is_floating_point:
        return ((base % 5) + 1).to(dtype) / 2  # halves: exact in float16 and bfloat16
    return ((base % 7) + 1).to(dtype)


def reduce_alone(tensors, op):
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op == R.SUM:
            acc = acc + t if acc.dtype != torch.bool else acc | t
        elif op == R.PRODUCT:
            acc = acc * t if acc.dtype != torch.bool else acc & t
        elif op == R.MIN:
            acc = torch.minimum(acc, t)
        elif op == R.MAX:
            acc = torch.maximum(acc, t)
        elif op == R.BAND:
            acc = acc & t
        elif op == R.BOR:
            acc = acc | t
        elif op == R.BXOR:
            acc = acc ^ t
    return acc


def ops_for(dtype):
    return ARITH_OPS + (BIT_OPS if not dtype.is_floating_point else [])


def gloo_result(gloo, run):
    """`run(group)` on the Gloo group, or None where Gloo refuses the case (every
    rank refuses alike: Gloo checks dtypes and ops locally)."""
    try:
        return run(gloo)
    except RuntimeError:
        return None


def compare_gloo(checks, ddp_out, gloo_out, what):
    if gloo_out is not None:
        checks.same(ddp_out, gloo_out, what + " (against gloo)")
        checks.against_gloo += 1


def check_all_reduce(c, rank, size, gloo):
    for dtype in DTYPES:
        for op in ops_for(dtype):
            inputs = [value(r, dtype) for r in range(size)]
            t = inputs[rank].clone()
            dist.all_reduce(t, op=op)
            what = f"all_reduce {op} {dtype}"
            c.same(t, reduce_alone(inputs, op), what)

            def on_gloo(group, op=op, x=inputs[rank]):
                g = x.clone()
                dist.all_reduce(g, op=op, group=group)
                return g
            compare_gloo(c, t, gloo_result(gloo, on_gloo), what)
    for dtype in (torch.float32, torch.float64):
        t = value(rank, dtype).clone()
        dist.all_reduce(t, op=R.AVG)
        c.same(t, reduce_alone([value(r, dtype) for r in range(size)], R.SUM) / size, f"AVG {dtype}")
    # Non-contiguous (a transposed view) and zero-element tensors.
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        grid = value(rank, dtype, 12).reshape(3, 4)
        view = grid.t()
        assert not view.is_contiguous()
        dist.all_reduce(view)
        c.same(grid, reduce_alone([value(r, dtype, 12) for r in range(size)], R.SUM).reshape(3, 4),
               f"all_reduce non-contiguous {dtype}")
    empty = torch.empty(0)
    dist.all_reduce(empty)
    c.same(empty, torch.empty(0), "all_reduce zero elements")
    # Bitwise ops on floats: refused on every rank before anything is sent.
    try:
        dist.all_reduce(torch.ones(2), op=R.BAND)
        raise AssertionError("BAND on float32 was not refused")
    except RuntimeError as e:
        c.count += 1
        assert "float32" in str(e) or "Float" in str(e), str(e)


def check_coalesced_and_broadcast(c, rank, size, gloo):
    tensors = [value(rank, torch.float32, 3).clone(), value(rank, torch.float32, 8, 1).reshape(4, 2)]
    dist.all_reduce_coalesced(tensors)
    c.same(tensors[0], reduce_alone([value(r, torch.float32, 3) for r in range(size)], R.SUM),
           "all_reduce_coalesced [0]")
    c.same(tensors[1], reduce_alone([value(r, torch.float32, 8, 1) for r in range(size)],
                                    R.SUM).reshape(4, 2), "all_reduce_coalesced [1]")
    for dtype in DTYPES:
        for root in range(size):
            t = value(rank, dtype).clone()
            dist.broadcast(t, src=root)
            c.same(t, value(root, dtype), f"broadcast {dtype} from {root}")
    for op in (R.SUM, R.MAX):
        for dtype in (torch.float32, torch.int32, torch.bfloat16):
            root = size - 1
            t = value(rank, dtype).clone()
            dist.reduce(t, dst=root, op=op)
            if rank == root:
                c.same(t, reduce_alone([value(r, dtype) for r in range(size)], op),
                       f"reduce {op} {dtype}")

                def on_gloo(group, op=op, x=value(rank, dtype)):
                    g = x.clone()
                    dist.reduce(g, dst=root, op=op, group=group)
                    return g
            else:
                def on_gloo(group, op=op, x=value(rank, dtype)):
                    dist.reduce(x.clone(), dst=root, op=op, group=group)
                    return None
            compare_gloo(c, t, gloo_result(gloo, on_gloo), f"reduce {op} {dtype}")


def check_gathers(c, rank, size, gloo):
    for dtype in DTYPES:
        out = [torch.zeros(5, dtype=dtype) for _ in range(size)]
        dist.all_gather(out, value(rank, dtype))
        for r in range(size):
            c.same(out[r], value(r, dtype), f"all_gather {dtype} [{r}]")
        whole = torch.zeros(size * 5, dtype=dtype)
        dist.all_gather_into_tensor(whole, value(rank, dtype))
        c.same(whole, torch.cat([value(r, dtype) for r in range(size)]),
               f"all_gather_into_tensor {dtype}")

        def on_gloo(group, dtype=dtype):
            g = [torch.zeros(5, dtype=dtype) for _ in range(size)]
            dist.all_gather(g, value(rank, dtype), group=group)
            return torch.cat(g)
        compare_gloo(c, torch.cat(out), gloo_result(gloo, on_gloo), f"all_gather {dtype}")
    # all_gather_coalesced: several inputs of different sizes, one per output list entry.
    for dtype in (torch.float32, torch.int64, torch.bool):
        inputs = [value(rank, dtype, n=3), value(rank, dtype, n=6, offset=1).view(2, 3)]
        lists = [[torch.zeros(3, dtype=dtype), torch.zeros(2, 3, dtype=dtype)] for _ in range(size)]
        dist.all_gather_coalesced(lists, inputs)
        for r in range(size):
            c.same(lists[r][0], value(r, dtype, n=3), f"all_gather_coalesced {dtype} [{r}][0]")
            c.same(lists[r][1], value(r, dtype, n=6, offset=1).view(2, 3),
                   f"all_gather_coalesced {dtype} [{r}][1]")

        def coalesced_on_gloo(group, dtype=dtype):
            ins = [value(rank, dtype, n=3), value(rank, dtype, n=6, offset=1).view(2, 3)]
            outs = [[torch.zeros(3, dtype=dtype), torch.zeros(2, 3, dtype=dtype)] for _ in range(size)]
            dist.all_gather_coalesced(outs, ins, group=group)
            return torch.cat([t.flatten() for lst in outs for t in lst])
        compare_gloo(c, torch.cat([t.flatten() for lst in lists for t in lst]),
                     gloo_result(gloo, coalesced_on_gloo), f"all_gather_coalesced {dtype}")
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    c.count += 1
    assert objects == [{"rank": r, "text": "x" * r} for r in range(size)], objects
    root = 1
    for dtype in (torch.float16, torch.int8, torch.bool, torch.float64):
        out = [torch.zeros(5, dtype=dtype) for _ in range(size)] if rank == root else None
        dist.gather(value(rank, dtype), gather_list=out, dst=root)
        if rank == root:
            c.same(torch.cat(out), torch.cat([value(r, dtype) for r in range(size)]),
                   f"gather {dtype}")
        got = torch.zeros(5, dtype=dtype)
        chunks = [value(r, dtype, offset=7) for r in range(size)] if rank == root else None
        dist.scatter(got, scatter_list=chunks, src=root)
        c.same(got, value(rank, dtype, offset=7), f"scatter {dtype}")


def check_reduce_scatter(c, rank, size):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        for op in (R.SUM, R.MAX) + ((R.BXOR,) if not dtype.is_floating_point else ()):
            chunks = [value(rank, dtype, 4, offset=j) for j in range(size)]
            out = torch.zeros(4, dtype=dtype)
            dist.reduce_scatter(out, chunks, op=op)
            expected = reduce_alone([value(r, dtype, 4, offset=rank) for r in range(size)], op)
            c.same(out, expected, f"reduce_scatter {op} {dtype}")
            out = torch.zeros(4, dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat(chunks), op=op)
            c.same(out, expected, f"reduce_scatter_tensor {op} {dtype}")


def check_all_to_all(c, rank, size, gloo):
    # Uneven: rank i sends (i + j + 1) rows of 2 to rank j.
    def rows(i, j, dtype):
        return value(10 * i + j, dtype, 2 * (i + j + 1)).reshape(i + j + 1, 2)
    for dtype in (torch.float32, torch.int8, torch.bool, torch.bfloat16):
        send = torch.cat([rows(rank, j, dtype) for j in range(size)])
        recv = torch.zeros(sum(i + rank + 1 for i in range(size)), 2, dtype=dtype)
        dist.all_to_all_single(recv, send, output_split_sizes=[i + rank + 1 for i in range(size)],
                               input_split_sizes=[rank + j + 1 for j in range(size)])
        expected = torch.cat([rows(i, rank, dtype) for i in range(size)])
        c.same(recv, expected, f"all_to_all_single uneven {dtype}")
        outs = [torch.zeros(i + rank + 1, 2, dtype=dtype) for i in range(size)]
        dist.all_to_all(outs, [rows(rank, j, dtype) for j in range(size)])
        c.same(torch.cat(outs), expected, f"all_to_all uneven {dtype}")
    even_in = value(rank, torch.int32, 3 * size)
    even_out = torch.zeros(3 * size, dtype=torch.int32)
    dist.all_to_all_single(even_out, even_in)
    c.same(even_out, torch.cat([value(i, torch.int32, 3 * size)[3 * rank:3 * rank + 3]
                                for i in range(size)]), "all_to_all_single even")

    def on_gloo(group):
        g = torch.zeros(3 * size, dtype=torch.int32)
        dist.all_to_all_single(g, even_in, group=group)
        return g
    compare_gloo(c, even_out, gloo_result(gloo, on_gloo), "all_to_all_single even")


def check_point_to_point(c, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(5, dtype=torch.float64)
    reqs = [dist.isend(value(rank, torch.float64), right), dist.irecv(got, left)]
    for req in reqs:
        req.wait()
    c.same(got, value(left, torch.float64), "isend/irecv ring")
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.zeros(5, dtype=torch.int64)
            src = dist.recv(t)  # from any source
            c.same(t, value(src, torch.int64), f"recv from any source ({src})")
            seen.add(src)
        assert seen == set(range(1, size)), seen
    else:
        dist.send(value(rank, torch.int64), 0)
    dist.barrier()


def check_async(c, rank, size):
    t = value(rank, torch.float32).clone()
    work = dist.all_reduce(t, async_op=True)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2)
    work.wait()
    expected = reduce_alone([value(r, torch.float32) for r in range(size)], R.SUM)
    c.same(t, expected, "async all_reduce wait()")
    c.same(doubled.wait(), expected * 2, "async all_reduce get_future().then()")
    # A callback that issues the next collective (as PowerSGD's comm hook does):
    # futures complete outside ddp's locks, so this cannot deadlock.
    def reduce_again(fut):
        again = fut.value()[0].clone()
        dist.all_reduce(again)
        return again
    chained = dist.all_reduce(value(rank, torch.float32).clone(), async_op=True).get_future()
    c.same(chained.then(reduce_again).wait(), expected * size, "a collective issued in a future's callback")
    works = [dist.broadcast(torch.full((3,), float(rank)), src=r, async_op=True) for r in range(size)]
    for work in works:
        work.wait()
        c.count += 1
        assert work.is_completed() and work.is_success()


def check_subgroup(c, rank, size):
    members = [0, size - 1]
    sub = dist.new_group(members, backend="ddp")
    if rank in members:
        t = value(rank, torch.int64).clone()
        dist.all_reduce(t, group=sub)
        c.same(t, reduce_alone([value(r, torch.int64) for r in members], R.SUM), "subgroup all_reduce")
        assert dist.get_world_size(sub) == 2
    else:
        c.count += 1
        assert sub == dist.GroupMember.NON_GROUP_MEMBER


def check_refusals(c, rank, size):
    """Dtypes ddp has none of: a RuntimeError naming the dtype, on every rank."""
    for call, name in ((lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16)), "Short"),
                       (lambda: dist.broadcast(torch.zeros(2, dtype=torch.complex64), 0), "ComplexFloat")):
        try:
            call()
            raise AssertionError(f"{name} was not refused")
        except RuntimeError as e:
            c.count += 1
            assert name in str(e) and "ddp" in str(e), str(e)
    # Complex SUM is torch's own: all_reduce reduces its real view (torch.view_as_real).
    t = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(t)
    c.same(t, torch.full((3,), complex(sum(range(size)), size), dtype=torch.complex64),
           "all_reduce complex64 (through its real view)")


def main():
    dist.init_process_group("ddp", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "ddp", dist.get_backend()
    gloo = dist.new_group(backend="gloo")
    c = Checks()
    check_all_reduce(c, rank, size, gloo)
    check_coalesced_and_broadcast(c, rank, size, gloo)
    check_gathers(c, rank, size, gloo)
    check_reduce_scatter(c, rank, size)
    check_all_to_all(c, rank, size, gloo)
    check_point_to_point(c, rank, size)
    check_async(c, rank, size)
    check_subgroup(c, rank, size)
    check_refusals(c, rank, size)
    dist.barrier()
    print(f"rank {rank}: ok {c.count} checks, {c.against_gloo} against gloo", flush=True)


if __name__ == "__main__":
    rank_main.run(main)
