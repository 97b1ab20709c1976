"""What produced an output and under which conditions: Python and package versions, and how busy the
machine was while something was timed, recorded beside every run and report.

Machine load:
Timings on a shared CPU are distorted by other jobs (a 2-minute demo took 26 minutes beside three
others), and worse when torch's threads, one per core by default, compete with theirs. Every
command that times decoding or training records here the load average at both ends and the CPU
time the *other* processes took meanwhile (Linux /proc/stat minus this process and its children),
and warns when that was enough to distort the figures.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# Every package whose version can move a result: the tokenizer trainer (tokenizers), data order (datasets,
# numpy), kernels (torch), training loops (transformers, trl, peft, accelerate, deepspeed), GGUF dequantising.
PACKAGES = ("distill", "torch", "transformers", "tokenizers", "trl", "peft", "accelerate", "datasets", "numpy", "deepspeed", "safetensors", "gguf")


def package_version(name: str) -> str | None:
    """The installed version of `name`, or None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Python's version and each package's installed version (None when absent)."""
    return {"python": platform.python_version(), **{name: package_version(name) for name in packages}}


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in open("/proc/cpuinfo").read().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The processor's feature flags (/proc/cpuinfo on Linux; empty elsewhere): which of avx2, avx512f,
    avx512_bf16, amx_bf16 it has decides which dtype is fastest on it."""
    try:
        for line in open("/proc/cpuinfo").read().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_record() -> dict[str, Any]:
    """The processor and whether it multiplies bfloat16 natively (float32 is the faster format without it)."""
    flags = cpu_flags()
    native = sorted(f for f in ("avx512_bf16", "amx_bf16") if f in flags)
    return {
        "name": cpu_name(),
        "flags": sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags),
        "bf16": f"native bf16 ({', '.join(native)})" if native else "no native bf16",
    }


def environment(device: Any = None, load: MachineLoad | None = None) -> dict[str, Any]:
    """The one record of where something ran, beside every run and report: Python and package
    versions, the platform, the device and its name, torch's threads and OMP_NUM_THREADS, and, given
    a started `MachineLoad`, how busy the machine was meanwhile."""
    import torch

    device = torch.device(device or "cpu")
    record = {
        **versions(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu": cpu_record(),
    }
    if load is not None:
        record["machine_load"] = load.report()
    return record


# Other processes using more than this many cores on average make timings untrustworthy.
BUSY_CORES = 0.25


def _busy_jiffies() -> int | None:
    """CPU time (clock ticks) all processes spent busy since boot, from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user and nice
    return sum(fields) - idle - guest


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _snapshot() -> tuple[float, int | None, float, tuple[float, float, float]]:
    return time.perf_counter(), _busy_jiffies(), _own_cpu_s(), os.getloadavg()


class MachineLoad:
    """`load = MachineLoad().start()` ... `load.stop()` (or `with MachineLoad() as load:`), then
    `load.report()`: what else ran on the machine meanwhile."""

    def start(self) -> MachineLoad:
        self.begin, self.end, self.credited = _snapshot(), None, 0.0
        return self

    def credit(self, cpu_s: float) -> None:
        """Count `cpu_s` CPU seconds of processes this job drives but does not wait for (a long-lived
        engine the operating system would count as another process's) as this job's own."""
        self.credited += cpu_s

    def stop(self) -> MachineLoad:
        self.end = _snapshot()
        return self

    def __enter__(self) -> MachineLoad:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def report(self) -> dict[str, Any]:
        """cpus, wall_s, load averages at start and end, this process's CPU seconds, the other
        processes' CPU seconds and average cores, whether that counts as busy, and the warning."""
        end = self.end or _snapshot()
        wall = end[0] - self.begin[0]
        own = end[2] - self.begin[2] + self.credited
        others = None
        if self.begin[1] is not None and end[1] is not None:
            others = max(0.0, (end[1] - self.begin[1]) / os.sysconf("SC_CLK_TCK") - own)
        cores = others / wall if others is not None and wall > 0 else None
        cpus = os.cpu_count() or 1
        # Without /proc/stat, the 1-minute load average beyond this process's threads is the evidence.
        busy = cores > BUSY_CORES if cores is not None else end[3][0] > (_threads() or 1) + 0.5
        return {
            "cpus": cpus,
            "torch_threads": _threads(),
            "wall_s": wall,
            "loadavg_start": list(self.begin[3]),
            "loadavg_end": list(end[3]),
            "own_cpu_s": own,
            "others_cpu_s": others,
            "others_cores": cores,
            "busy": busy,
            "warning": warning(cores, end[3][0], cpus, _threads()) if busy else None,
        }


def warning(cores: float | None, loadavg: float, cpus: int, threads: int | None) -> str:
    """The line a busy machine gets, with how to make the timings trustworthy."""
    what = f"other processes used {cores:.2f} of {cpus} cores on average" if cores is not None else f"the load average was {loadavg:.2f} on {cpus} cores"
    advice = "rerun on an idle machine"
    if threads is not None and threads >= cpus:
        advice += f"; on a shared machine give torch fewer threads than its {threads} (e.g. OMP_NUM_THREADS=1), as oversubscribed cores slow it many times over"
    return f"the machine was busy while this was timed ({what}): speeds and speedups are distorted; {advice}"


def describe(report: dict[str, Any]) -> str:
    """One line for a Markdown report: how busy the machine was, and the warning when it was busy."""
    others = (
        f"other processes used {report['others_cores']:.2f} of {report['cpus']} cores on average"
        if report["others_cores"] is not None
        else f"{report['cpus']} cores"
    )
    line = (
        f"Machine load while timed: {others}; load average {report['loadavg_start'][0]:.2f} at the start, "
        f"{report['loadavg_end'][0]:.2f} at the end; torch threads {report['torch_threads']}."
    )
    return line + (f" **Warning:** {report['warning']}." if report["busy"] else "")


def warn(report: dict[str, Any], prog: str) -> None:
    """Print the busy-machine warning to stderr, if there is one."""
    if report.get("warning"):
        print(f"{prog}: warning: {report['warning']}", file=sys.stderr)
