"""The two-model deployment the demand tests read: ``declared`` (a fixed rate) and ``auto``
(``demand: auto``, measured from metered intervals)."""

from __future__ import annotations

from coral_hpc.config import Deployment, parse_deployment

_MODELS = """\
deployment: t
state_dir: /tmp/s
db_path: /tmp/d.db
cluster:
  partitions: [{{name: a100}}]
engine: {{kind: sim}}
models:
  - name: declared
    source: x
    architecture: qwen3-8b
    mix: {{input_tokens: 512, output_tokens: 128}}
    demand: {declared}
    slo: {{ttft_s: 2, tpot_s: 0.1}}
  - name: auto
    source: y
    architecture: qwen3-8b
    mix: {{input_tokens: 100, output_tokens: 50}}
    demand: auto
    slo: {{ttft_s: 2, tpot_s: 0.1}}
"""


def demand_deployment(policy: str = "", declared: str = "{requests_per_s: 2}",
                      name: str = "m.yaml") -> Deployment:
    """The deployment with ``policy`` (the fields inside ``policy: {...}``, last in the file so
    a problem's line number is the file's last) and the ``declared`` model's ``demand``,
    parsed as the file ``name``."""
    text = _MODELS.format(declared=declared)
    return parse_deployment(text + (f"policy: {{{policy}}}\n" if policy else ""), name)
