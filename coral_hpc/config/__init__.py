"""``models.yaml``: one frozen, validated description of a deployment.

:func:`load_deployment` reads the file, validates it with pydantic (unknown keys rejected) and
returns a :class:`Deployment`. Every problem is reported at once, each naming the file, the line,
the field (``models[1].slo.ttft_s``) and what would be valid; see
:class:`coral_hpc.errors.ConfigError`.

Units, one meaning everywhere (../shared/ARCHITECTURE.md): demand and throughput are requests per
second of the model's own request mix; token-based demand is converted on load
(output tokens/s ÷ mean output tokens).

This package's one job is the configuration; its modules, one job each:

- :mod:`~coral_hpc.config.source`: a file's bounded bytes in, YAML data and line numbers out
- :mod:`~coral_hpc.config.base`: what every section shares (frozen base, value checks)
- :mod:`~coral_hpc.config.cluster`, :mod:`~coral_hpc.config.engine`,
  :mod:`~coral_hpc.config.gateway`, :mod:`~coral_hpc.config.policy`,
  :mod:`~coral_hpc.config.models`: one section each; :mod:`~coral_hpc.config.engine_flags`: the
  engine arguments a config may not set
- :mod:`~coral_hpc.config.deployment`: the whole file and the checks across sections
- :mod:`~coral_hpc.config.locate`, :mod:`~coral_hpc.config.problems`,
  :mod:`~coral_hpc.config.load`: field paths to lines, pydantic errors to problem lines, loading
- :mod:`~coral_hpc.config.secret_files`, :mod:`~coral_hpc.config.host`: checks against this host

Callers import from ``coral_hpc.config``; the names below are its public API.
"""

from __future__ import annotations

from coral_hpc.config.base import SAFE_NAME
from coral_hpc.config.cluster import (
    DEFAULT_CPUS_PER_GPU,
    DEFAULT_MEM_PER_GPU_GB,
    MAX_PRICE,
    MAX_TIME_LIMIT_S,
    ApptainerEnvironment,
    ClusterConfig,
    EngineEnvironment,
    ModuleEnvironment,
    PartitionConfig,
    SlurmSettings,
    VenvEnvironment,
    parse_slurm_time,
)
from coral_hpc.config.deployment import (
    DEFAULT_SLURM_CALLS_PER_MIN,
    Deployment,
    hf_home_of,
    slurm_calls_per_min,
)
from coral_hpc.config.engine import KV_CONNECTORS, EngineConfig, KvConnectorConfig
from coral_hpc.config.engine_flags import (
    PLANNER_ENV,
    PLANNER_FLAGS,
    engine_args_problems,
    engine_flag_problem,
)
from coral_hpc.config.gateway import GatewayConfig, is_loopback_host
from coral_hpc.config.host import (
    host_path_problems,
    measured_profiles_problems,
    private_state_problems,
)
from coral_hpc.config.load import load_deployment, parse_deployment
from coral_hpc.config.locate import field_line
from coral_hpc.config.models import SLO, Demand, ModelConfig, RequestLengths, RequestMix
from coral_hpc.config.policy import SOLVER_FORM, PolicyConfig, RetentionConfig
from coral_hpc.config.scale import ScaleToZero, parse_duration, scale_to_zero
from coral_hpc.config.secret_files import check_private_file, stat_private_file
from coral_hpc.errors import ConfigError

__all__ = [
    "DEFAULT_CPUS_PER_GPU",
    "DEFAULT_MEM_PER_GPU_GB",
    "DEFAULT_SLURM_CALLS_PER_MIN",
    "KV_CONNECTORS",
    "MAX_PRICE",
    "MAX_TIME_LIMIT_S",
    "PLANNER_ENV",
    "PLANNER_FLAGS",
    "SAFE_NAME",
    "SLO",
    "SOLVER_FORM",
    "ApptainerEnvironment",
    "ClusterConfig",
    "ConfigError",
    "Demand",
    "Deployment",
    "EngineConfig",
    "EngineEnvironment",
    "GatewayConfig",
    "KvConnectorConfig",
    "ModelConfig",
    "ModuleEnvironment",
    "PartitionConfig",
    "PolicyConfig",
    "RequestLengths",
    "RequestMix",
    "RetentionConfig",
    "ScaleToZero",
    "SlurmSettings",
    "VenvEnvironment",
    "check_private_file",
    "engine_args_problems",
    "engine_flag_problem",
    "field_line",
    "hf_home_of",
    "host_path_problems",
    "is_loopback_host",
    "load_deployment",
    "measured_profiles_problems",
    "parse_deployment",
    "parse_duration",
    "parse_slurm_time",
    "private_state_problems",
    "scale_to_zero",
    "slurm_calls_per_min",
    "stat_private_file",
]
