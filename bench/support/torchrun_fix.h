// The sitecustomize.py the benchmarks put on torchrun's PYTHONPATH: Debian's
// torch 1.13 cannot parse its own -r/-t defaults on Python 3.11 (IntFlag
// iteration skips 0), and this replaces Std.from_str with a version that can.
#pragma once

namespace ddp::bench {

inline constexpr const char* kTorchrunSiteCustomize =
    "try:\n"
    "    import re\n"
    "    from torch.distributed.elastic.multiprocessing import api as _api\n"
    "    def _from_str(cls, vm):\n"
    "        if re.match(_api._VALUE_REGEX, vm):\n"
    "            return cls(int(vm))\n"
    "        if re.match(_api._MAPPING_REGEX, vm):\n"
    "            return {int(i): cls(int(v)) for i, v in (m.split(':') for m in vm.split(','))}\n"
    "        raise ValueError(f'{vm} does not match: <{_api._VALUE_REGEX}> or "
    "<{_api._MAPPING_REGEX}>')\n"
    "    _api.Std.from_str = classmethod(_from_str)\n"
    "except Exception:\n"
    "    pass\n";

}  // namespace ddp::bench
