"""What the PD benchmark scripts share: the machine's load line and a nearest-rank percentile."""

from __future__ import annotations

import math
import os
import subprocess


def uptime() -> str:
    """uptime(1)'s line (the load averages go beside every figure), or the load alone."""
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with 16 samples p99 is the maximum."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]
