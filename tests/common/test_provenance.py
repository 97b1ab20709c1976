"""distill.common.provenance: the CPU time other processes take while a benchmark times something is
measured, and a busy machine is named in a warning that says what to do."""

from __future__ import annotations

import subprocess
import sys
import time

from distill.common.provenance import MachineLoad, describe, warning


def test_cpu_time_of_another_process_is_counted_and_called_busy():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"])
    with MachineLoad() as load:
        time.sleep(1.6)
    report = load.report()
    spinner.wait()  # reaped after the block: its CPU time is another process's, not ours
    assert report["others_cpu_s"] > 0.8 and report["others_cores"] > 0.5 and report["busy"]
    assert report["own_cpu_s"] < 0.5 and report["wall_s"] >= 1.6
    assert "the machine was busy while this was timed" in report["warning"]
    assert "**Warning:**" in describe(report) and f"of {report['cpus']} cores" in describe(report)


def test_the_warning_says_how_to_stop_oversubscribing_cores():
    assert "OMP_NUM_THREADS=1" in warning(1.3, 2.5, cpus=2, threads=2)
    assert "OMP_NUM_THREADS" not in warning(1.3, 2.5, cpus=2, threads=1)
    assert "load average was 2.50 on 2 cores" in warning(None, 2.5, cpus=2, threads=1)
