# A tiny collective job run as a module (-m trainpkg.collect) or by a shell
# wrapper (--no_python ./run_collect.sh): each rank all-reduces its rank and
# writes <out>/rank<RANK>.json with how it was started.
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--via", default="python")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    result = {
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "world_size": dist.get_world_size(),
        "sum": total.item(),
        "tag": args.tag,
        "via": args.via,
        "module": __spec__.name if __spec__ is not None else None,
        "script": os.path.basename(sys.argv[0]),
        "executable": sys.executable,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
