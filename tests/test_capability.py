"""The CPU's name and flags: one reader of /proc/cpuinfo for the whole project."""

from __future__ import annotations

from pathlib import Path

from genesis_fp16.precision import capability

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
model name\t: another CPU
flags\t\t: fpu
"""


def test_the_first_cpu_block_gives_name_and_flags():
    info = capability.parse_cpuinfo(CPUINFO)
    assert info.name == "AMD EPYC 7B13"
    assert info.flags == frozenset({"fpu", "avx2", "avx512f", "avx512_bf16"})


def test_no_cpuinfo_is_an_empty_answer_and_the_name_cpu(monkeypatch):
    assert capability.parse_cpuinfo("") == capability.CpuInfo("", frozenset())
    monkeypatch.setattr(capability, "cpu_info", lambda: capability.CpuInfo("", frozenset()))
    assert capability.cpu_name() == "cpu"


def test_only_capability_reads_proc_cpuinfo():
    root = Path(__file__).resolve().parents[1]
    readers = [
        str(path.relative_to(root))
        for package in ("genesis_fp16", "agents", "infrastructure", "scripts")
        for path in (root / package).rglob("*.py")
        if '"/proc/cpuinfo"' in path.read_text(encoding="utf-8")
    ]
    assert readers == ["genesis_fp16/precision/capability.py"]
