"""`make test-isa`: the numerics-sensitive tests again under each instruction set this CPU can
emulate downward, so that one machine checks the kernels older or other CPUs run.

PyTorch picks its vectorised kernels by ``ATEN_CPU_CAPABILITY`` (default, avx2, avx512),
oneDNN (matmuls, bf16, AMX, int8 on request) by ``ONEDNN_MAX_CPU_ISA`` and FBGEMM (PyTorch's
int8) by ``FBGEMM_ENABLE_INSTRUCTIONS`` (AVX2, AVX512, AVX512_E1: VNNI; it has nothing older
than AVX2, and no AVX-VNNI kernels); each can only go down from what the CPU has. Each level
below is run where the CPU has its instructions, the highest of them being the one `make test`
already ran (said, not rerun).
ONNX Runtime chooses its kernels from the CPU alone: its int8 tests are checked against a
simulation of the quantisation that holds on every CPU (tests/int8_oracle.py), not by this
ladder.

    python tests/isa_ladder.py [--only LEVEL] -- PYTEST_ARGS...

Exit status: 0 when every level run passed, 1 otherwise; a table of the levels at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from wtnmt.runtime import cpu_flags, cpuinfo


@dataclass(frozen=True)
class Level:
    name: str
    aten: str  # ATEN_CPU_CAPABILITY
    onednn: str  # ONEDNN_MAX_CPU_ISA
    fbgemm: str  # FBGEMM_ENABLE_INSTRUCTIONS
    needs: frozenset[str]  # /proc/cpuinfo flags


AVX512 = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
LEVELS = (
    Level("sse4.1", "default", "SSE41", "AVX2", frozenset({"sse4_1"})),
    Level("avx2", "avx2", "AVX2", "AVX2", frozenset({"avx2"})),
    # AVX2 with AVX-VNNI, no AVX-512 (Intel's E-core Xeons): oneDNN's int8 has VNNI, FBGEMM's not
    Level("avx2-vnni", "avx2", "AVX2_VNNI", "AVX2", frozenset({"avx2", "avx_vnni"})),
    Level("avx512", "avx512", "AVX512_CORE", "AVX512", AVX512),
    Level("avx512-vnni", "avx512", "AVX512_CORE_VNNI", "AVX512_E1", AVX512 | {"avx512_vnni"}),
    Level(
        "avx512-bf16",
        "avx512",
        "AVX512_CORE_BF16",
        "AVX512_E1",
        AVX512 | {"avx512_vnni", "avx512_bf16"},
    ),
    Level(
        "amx",
        "avx512",
        "AVX512_CORE_AMX",
        "AVX512_E1",
        AVX512 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"},
    ),
)


def cpu_model(path: Path = Path("/proc/cpuinfo")) -> str:
    return cpuinfo(path).get("model name", "unknown CPU")


def plan(flags: set[str], only: str | None) -> tuple[list[Level], Level | None]:
    """The levels to run (every one the CPU has, below its highest; or ``only``) and the
    CPU's own (highest) level, None where it has none of them (not x86)."""
    have = [level for level in LEVELS if level.needs <= flags]
    native = have[-1] if have else None
    if only is not None:
        chosen = [level for level in LEVELS if level.name == only]
        if not chosen:
            names = ", ".join(level.name for level in LEVELS)
            raise SystemExit(f"isa_ladder: --only {only!r}: not a level ({names})")
        return [level for level in chosen if level in have and level != native], native
    return [level for level in have if level != native], native


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one level: " + ", ".join(lv.name for lv in LEVELS))
    parser.add_argument("pytest", nargs=argparse.REMAINDER, help="-- then pytest's arguments")
    args = parser.parse_args(argv)
    pytest_args = args.pytest[1:] if args.pytest[:1] == ["--"] else args.pytest
    flags = cpu_flags()
    levels, native = plan(flags, args.only)
    print(f"test-isa: {cpu_model()}; its own level: {native.name if native else 'none'}")
    rows = []
    if native is not None and (args.only is None or args.only == native.name):
        rows.append((native.name, "this CPU's own: `make test` ran these tests on it", True))
    if args.only is not None and not levels and (native is None or args.only != native.name):
        rows.append((args.only, "not run: this CPU lacks its instructions", True))
    for level in levels:
        env = dict(
            os.environ,
            ATEN_CPU_CAPABILITY=level.aten,
            ONEDNN_MAX_CPU_ISA=level.onednn,
            FBGEMM_ENABLE_INSTRUCTIONS=level.fbgemm,
        )
        probe = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
            env=env,
            capture_output=True,
            text=True,
        )
        capability = probe.stdout.strip() or "?"
        print(
            f"test-isa: {level.name} (ATEN_CPU_CAPABILITY={level.aten} → ATen {capability}, "
            f"ONEDNN_MAX_CPU_ISA={level.onednn}, FBGEMM_ENABLE_INSTRUCTIONS={level.fbgemm})",
            flush=True,
        )
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], env=env)
        seconds = time.monotonic() - start
        ok = done.returncode == 0
        rows.append((level.name, f"{'passed' if ok else 'FAILED'} in {seconds:.0f} s", ok))
    print("\n| level | result |\n|---|---|")
    for name, result, _ in rows:
        print(f"| {name} | {result} |")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
