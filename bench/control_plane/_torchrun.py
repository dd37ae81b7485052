#!/usr/bin/python3
"""torchrun (torch.distributed.run of Debian's torch 1.13), with one fix:
under Python 3.11 its Std.from_str("0") returns None (IntFlag iteration skips
the zero member), so every torchrun start fails in start_processes with
"'NoneType' object has no attribute 'get'". Upstream later fixed it the same
way (Std(int(v))). Arguments are torchrun's.
"""
import re

from torch.distributed.elastic.multiprocessing import api


def _from_str(vm):
    if re.fullmatch(r"\d", vm):
        return api.Std(int(vm))
    return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = staticmethod(_from_str)

from torch.distributed import run  # noqa: E402

if __name__ == "__main__":
    run.main()
