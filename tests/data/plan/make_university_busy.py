"""Writes university-busy-snapshot.json: a constructed snapshot of the site examples/university.yaml
describes (not a recording: no such site is at hand), as busy as university clusters are.

- gpu-v100: v100-[01-08], 4 × V100-SXM2-32GB each (GRES as NVML autodetect names it,
  ``tesla_v100-sxm2-32gb``), MaxTime 2 days; gpu-a100: a100-[01-04], 4 × A100-SXM4-80GB
  (``nvidia_a100-sxm4-80gb``), MaxTime 1 day. TRESBillingWeights as on the dev cluster.
- Every GPU is allocated to other users' jobs.
- Start estimates in the form ``sbatch --test-only`` gives them: one a100 node frees 2 GPUs in
  10 minutes, 4 in 25; the v100 partition has room in 40 minutes (1-2 GPUs) or 2 hours (4);
  multi-node shapes later still.

Run: python tests/data/plan/make_university_busy.py
"""

import json
from pathlib import Path

T0 = 1796000000.0


def node(name, gpu, site, partition, memory):
    return {
        "name": name,
        "state": "allocated",
        "slurm_state": "ALLOCATED",
        "reason": None,
        "partitions": [partition],
        "gpu_type": gpu,
        "gpus_total": 4,
        "gpus_alloc": 4,
        "gpus_free": 0,
        "gpu_memory_gb": memory,
        "cpus": 64,
        "cpus_alloc": 64,
        "mem_gb": 512.0,
        "mem_alloc_gb": 512.0,
        "site_gpu_type": site,
        "features": [],
    }


def estimate(partition, gpu, gpus, nodes, wait_s, names):
    return {
        "partition": partition,
        "gpu_type": gpu,
        "gpus_per_node": gpus,
        "nodes": nodes,
        "start": T0 + wait_s,
        "node_names": names,
        "observed_at": T0,
        "error": None,
        "reservation": None,
    }


v100 = [
    node(f"v100-{i:02d}", "v100-32g", "tesla_v100-sxm2-32gb", "gpu-v100", 32.0) for i in range(1, 9)
]
a100 = [
    node(f"a100-{i:02d}", "a100-80g", "nvidia_a100-sxm4-80gb", "gpu-a100", 80.0)
    for i in range(1, 5)
]
weights = {"cpu": 0.05, "mem": 0.01, "gres/gpu": 1.0}
snapshot = {
    "slurm_version": "23.11.4",
    "observed_at": T0,
    "deployment": "lab-llm",
    "backend": "file",
    "nodes": v100 + a100,
    "partitions": [
        {
            "name": "gpu-v100",
            "state": "up",
            "nodes": [n["name"] for n in v100],
            "gpu_types": ["v100-32g"],
            "max_time_s": 172800,
            "billing_weights": weights,
            "default": False,
        },
        {
            "name": "gpu-a100",
            "state": "up",
            "nodes": [n["name"] for n in a100],
            "gpu_types": ["a100-80g"],
            "max_time_s": 86400,
            "billing_weights": {"cpu": 0.05, "mem": 0.01, "gres/gpu": 2.5},
            "default": False,
        },
    ],
    "node_groups": [],
    "jobs": [],
    "limits": {
        "account": "ai-lab",
        "qos": "normal",
        "grp_gpus": None,
        "grp_gpus_by_type": {},
        "max_gpus_per_job": None,
        "max_gpus_per_job_by_type": {},
        "max_jobs": 8,
        "max_submit_jobs": 10,
        "observed_at": T0,
    },
    "estimates": [
        estimate("gpu-a100", "a100-80g", 1, 1, 600, ["a100-03"]),
        estimate("gpu-a100", "a100-80g", 2, 1, 600, ["a100-03"]),
        estimate("gpu-a100", "a100-80g", 4, 1, 1500, ["a100-02"]),
        estimate("gpu-a100", "a100-80g", 4, 2, 14400, ["a100-01", "a100-02"]),
        estimate("gpu-v100", "v100-32g", 1, 1, 2400, ["v100-05"]),
        estimate("gpu-v100", "v100-32g", 2, 1, 2400, ["v100-05"]),
        estimate("gpu-v100", "v100-32g", 4, 1, 7200, ["v100-07"]),
        estimate("gpu-v100", "v100-32g", 4, 2, 10800, ["v100-07", "v100-08"]),
    ],
    "warnings": [],
}
Path(__file__).with_name("university-busy-snapshot.json").write_text(json.dumps(snapshot, indent=1))
