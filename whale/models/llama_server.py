"""`python -m whale.models.llama_server ARGS`: `llama_cpp.server ARGS`, with llama.cpp's extra
CPU buffer types (the AMX and repacked weight layouts) turned off on CPUs that have AMX.

Why: llama.cpp's AMX matrix multiply segfaults in the first inference on Sapphire Rapids
class CPUs (ggml-org/llama.cpp#20824). Measured on this project's 2-core Xeon with AMX and
llama-cpp-python 0.3.36 built natively: SIGSEGV in libggml-cpu on the first chat, with both
catalog quants (Q4_K_M, Q4_1); with `use_extra_bufts = False` the same calls succeed. CPUs
without AMX keep llama.cpp's defaults. `WHALE_LLAMA_EXTRA_BUFTS=1` (or `0`) forces the choice.
The native llama-server (`native`) follows the same choice with its `--no-repack` flag (the
same `use_extra_bufts = false`; measured: without it, SIGSEGV at the first decode on this CPU).

This server is the embedded backend's fallback when the native binary is not built, or with
`WHALE_EMBEDDED_SERVER=python` (see `embedded`).
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any


def has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def extra_bufts_off() -> bool:
    forced = os.environ.get("WHALE_LLAMA_EXTRA_BUFTS")
    if forced in ("0", "1"):
        return forced == "0"
    return has_amx()


def main() -> None:
    if extra_bufts_off():
        from llama_cpp import llama_cpp as lc

        default = lc.llama_model_default_params

        def params() -> Any:
            p = default()
            p.use_extra_bufts = False
            return p

        lc.llama_model_default_params = params  # read by Llama() at each model load
    sys.argv[0] = "llama_cpp.server"
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
