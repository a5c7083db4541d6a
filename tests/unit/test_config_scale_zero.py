"""Scale to zero in models.yaml: idle_after, wake_timeout and wake, per model and as policy
defaults; bad values name the field."""

from __future__ import annotations

import re

import pytest

from coral_hpc.config import parse_deployment, scale_to_zero
from coral_hpc.errors import ConfigError
from tests.unit.test_config import BASE


def _load(text: str):
    return parse_deployment(text, "z.yaml")


def _model_line(text: str, line: str) -> str:
    return text.replace("    slo: {ttft_s: 2, tpot_s: 0.05}\n",
                        f"    slo: {{ttft_s: 2, tpot_s: 0.05}}\n    {line}\n")


@pytest.mark.parametrize("written,seconds", [
    ("20m", 1200), ("90s", 90), ("1.5h", 5400), ("1d", 86400), ("1200", 1200), ("2 min", 120),
])
def test_idle_after_takes_durations(written, seconds):
    deployment = _load(_model_line(BASE, f"idle_after: '{written}'"))
    settings = scale_to_zero(deployment.models[0], deployment.policy)
    assert settings.idle_after_s == seconds and settings.enabled
    assert settings.wake == "hold" and settings.wake_timeout_s == 300


def test_policy_default_applies_to_models_without_min_replicas():
    text = BASE + "policy: {idle_after: 30m, wake_timeout: 2m, wake: reject}\n"
    deployment = _load(text)
    settings = scale_to_zero(deployment.models[0], deployment.policy)
    assert (settings.idle_after_s, settings.wake_timeout_s, settings.wake) == (1800, 120, "reject")
    # a model that keeps replicas whatever the demand is not scaled to zero by the default
    kept = _load(_model_line(text, "min_replicas: 1"))
    assert not scale_to_zero(kept.models[0], kept.policy).enabled


def test_model_overrides_policy_and_never_opts_out():
    text = BASE + "policy: {idle_after: 30m}\n"
    never = _load(_model_line(text, "idle_after: never"))
    assert not scale_to_zero(never.models[0], never.policy).enabled
    own = _load(_model_line(text, "{idle_after: 5m, wake: reject, wake_timeout: 45s}"
                            .strip("{}").replace(", ", "\n    ")))
    settings = scale_to_zero(own.models[0], own.policy)
    assert (settings.idle_after_s, settings.wake, settings.wake_timeout_s) == (300, "reject", 45)


def test_off_by_default():
    deployment = _load(BASE)
    assert not scale_to_zero(deployment.models[0], deployment.policy).enabled


BAD = [
    ("model-unit", _model_line(BASE, "idle_after: 20 fortnights"), "models[0].idle_after",
     "not a duration"),
    ("model-too-short", _model_line(BASE, "idle_after: 10s"), "models[0].idle_after", "1m .. 7d"),
    ("model-yes", _model_line(BASE, "idle_after: yes"), "models[0].idle_after", "yes/no"),
    ("model-min-replicas", _model_line(BASE, "idle_after: 20m\n    min_replicas: 1"),
     "models[0].idle_after", "min_replicas"),
    ("model-wake", _model_line(BASE, "wake: later"), "models[0].wake", "hold"),
    ("model-timeout", _model_line(BASE, "wake_timeout: 2h"), "models[0].wake_timeout", "1s .. 1h"),
    ("policy-idle", BASE + "policy: {idle_after: -5m}\n", "policy.idle_after", "not a duration"),
    ("policy-timeout", BASE + "policy: {wake_timeout: 0}\n", "policy.wake_timeout", "1s .. 1h"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_values_name_the_field(case):
    _, text, field, phrase = case
    with pytest.raises(ConfigError) as info:
        _load(text)
    wanted = [p for p in info.value.problems if f": {field}: " in p]
    assert wanted, f"no problem names {field}: {info.value.problems}"
    assert re.match(r"z\.yaml:\d+: ", wanted[0]) and phrase in wanted[0], wanted[0]
