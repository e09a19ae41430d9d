"""What this CPU can do, read once from /proc/cpuinfo: the one reader of CPU features that torch's autocast default
(bf16), OpenVINO's precision and --runtime auto's CPU class all ask.

    this_cpu_class()     # "amx", "avx512-vnni-bf16", "avx512-vnni", "avx2" or "arm": a row of the runtime order
    has_bf16_units()     # AVX-512 BF16 or AMX: bf16 runs natively (without them it is emulated and slow)

A shared leaf: it imports nothing of ner's, and never torch.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The instruction-set flags of the first processor in /proc/cpuinfo's text ("flags" on x86, "Features" on Arm)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def this_cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """This machine's flags; none where there is no /proc (macOS), so every choice falls back to its most
    conservative case."""
    try:
        return cpu_flags(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def cpu_class(flags: frozenset[str] | set[str], machine: str) -> str:
    """The CPU class of runtime_choice.RUNTIME_ORDER: its flags decide, the machine name only tells Arm apart."""
    if machine.lower() in ("aarch64", "arm64") or machine.lower().startswith("arm"):
        return "arm"
    if "amx_bf16" in flags or "amx_int8" in flags:
        return "amx"
    if "avx512_vnni" in flags:
        return "avx512-vnni-bf16" if "avx512_bf16" in flags else "avx512-vnni"
    return "avx2"


def this_cpu_class() -> str:
    return cpu_class(this_cpu_flags(), platform.machine())


def has_bf16_units(flags: frozenset[str] | None = None) -> bool:
    """Native bf16 (AVX-512 BF16 or AMX): autocast and OpenVINO's bf16 hint run faster; without them bf16 is
    emulated and slow. `flags`: this machine's by default."""
    return bool(BF16_FLAGS & (this_cpu_flags() if flags is None else flags))
