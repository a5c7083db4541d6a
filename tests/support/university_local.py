"""examples/university.yaml with its site names changed to the local cluster's
(scripts/dev-cluster): the same five models, priorities, limits, billing prices and the two
partitions with different vLLM images, on partitions ``v100`` (4 × v100 per node) and
``a100-80g`` (8 × a100-80g), charged to root's account ``coral-busy``, with CPUs and memory per
GPU that fit the local nodes (16 CPUs, 64 GB). Used to record a busy snapshot of the local
cluster (tests/data/plan/record_local_busy.py) and to plan on it (tests/unit/test_plan_busy.py).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIVERSITY = REPO / "examples" / "university.yaml"

#: (pattern, replacement): each must match exactly once
SUBSTITUTIONS = (
    (r"(?m)^  account: ai-lab$", "  account: coral-busy"),
    (r"(?m)^  cpus_per_gpu: 8$", "  cpus_per_gpu: 2"),
    (r"(?m)^  mem_per_gpu_gb: 64$", "  mem_per_gpu_gb: 8"),
    (r"(?m)^    - name: gpu-v100\n      gpu_types: \[v100-32g\]$",
     "    - name: v100\n      gpu_types: [v100]"),
    (r"(?m)^    - name: gpu-a100$", "    - name: a100-80g"),
    (r"(?m)^    v100-32g: 24$", "    v100: 8"),
)


def university_local_text() -> str:
    """The adapted configuration (raises AssertionError when the example changed shape)."""
    text = UNIVERSITY.read_text()
    for pattern, value in SUBSTITUTIONS:
        text, count = re.subn(pattern, value, text)
        assert count == 1, f"examples/university.yaml no longer has {pattern!r}"
    return text


def write_university_local(folder: Path) -> Path:
    """Write the adapted configuration into ``folder``; return its path."""
    path = folder / "university-local.yaml"
    path.write_text(university_local_text())
    return path
