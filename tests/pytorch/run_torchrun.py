# torchrun, as `python3 -m torch.distributed.run ARGS...` runs it, with one fix
# for torch 1.13 under Python 3.11: Std.from_str("0") (the default of
# --redirects and --tee) returns None there, because iterating an IntFlag no
# longer yields its zero member, and torchrun then fails before starting any
# worker ("'NoneType' object has no attribute 'get'"). Nothing else is changed;
# on a torch without the bug this is plain torchrun.
import re
import runpy

from torch.distributed.elastic.multiprocessing import api


def std_from_str(cls, value):
    """torchrun's documented parsing: "3" -> Std(3), "0:3,1:0" -> {0: Std(3), 1: Std(0)}."""
    if re.fullmatch(r"[0-3]", value):
        return cls(int(value))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", value):
        return {int(rank): cls(int(std)) for rank, std in (item.split(":") for item in value.split(","))}
    raise ValueError(f"{value} does not match a Std value (0-3) or a mapping (0:1,1:3)")


if api.Std.from_str("0") is None:
    api.Std.from_str = classmethod(std_from_str)

runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
