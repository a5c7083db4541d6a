"""``coral-hpc profile models.yaml``: measure the real engine in Slurm jobs per partition and
write measured profiles to the deployment's ``profiles_dir``, which ``plan`` and ``serve`` read.

One engine job at a time; each (model, partition, GPU type, PP) already measured is reused
unless ``--force``, so an interrupted run resumes where it stopped."""

from __future__ import annotations

import click

from coral_hpc.cli._output import (
    EXIT_ENGINE_FAILED,
    EXIT_INTERNAL,
    EXIT_UNAVAILABLE,
    err_console,
    fail,
    print_json,
)


@click.command()
@click.argument("models_yaml", type=click.Path(dir_okay=False))
@click.option("--partition", "partitions", multiple=True,
              help="Profile this partition (repeatable; default every configured one).")
@click.option("--model", "models", multiple=True,
              help="Profile this model (repeatable; default every configured one).")
@click.option("--pp", "pp_degrees", multiple=True, type=click.IntRange(1, 16),
              help="Pipeline degrees to measure (repeatable; default 1). PP > 1 runs a multi-node "
                   "job of one partition; results go under pipelines/.")
@click.option("--stages", "stage_lists", multiple=True, metavar="P1,P2[,...]",
              help="Measure one pipeline with a stage on each named partition, in order (a "
                   "partition named twice gets two nodes; different partitions: a Slurm "
                   "hetjob); needs exactly one --model. Repeatable.")
@click.option("--roles", is_flag=True,
              help="Measure each model as a prefill-only and a decode-only replica instead "
                   "(one stage); results go under roles/, which a measured_only deployment "
                   "with disaggregation plans its prefill and decode replicas from.")
@click.option("--phase-seconds", "phase_s", type=click.FloatRange(min=5), default=None,
              help="How long each open-loop phase of the capacity search lasts, or long enough "
                   "for 40 requests (default 20). Shorter measures sooner and with more noise.")
@click.option("--force", is_flag=True, help="Measure again even where a profile exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile files written as JSON.")
def profile(models_yaml: str, partitions: tuple[str, ...], models: tuple[str, ...],
            pp_degrees: tuple[int, ...], stage_lists: tuple[str, ...], roles: bool,
            phase_s: float | None, force: bool, as_json: bool) -> None:
    """Measure the engine on each partition for MODELS_YAML's models; write measured profiles."""
    from coral_hpc.config import load_deployment
    from coral_hpc.errors import ConfigError, TransientError
    from coral_hpc.model_archs import derived_deployment
    from coral_hpc.profile import profile_tasks, run_profiles
    from coral_hpc.profile.openloop import PHASE_S
    from coral_hpc.profile.run import EngineFailed, ProfileError, pipeline_task
    from coral_hpc.slurm import client_for_deployment

    try:
        deployment = derived_deployment(load_deployment(models_yaml))
    except ConfigError as exc:
        fail(exc.problems + [f"{models_yaml}: {len(exc.problems)} problem(s)"])
    if deployment.engine.kind != "vllm":
        fail(f"{models_yaml}: engine.kind is {deployment.engine.kind!r}; profiling measures the "
             "real engine: set engine.kind: vllm")
    try:
        if roles and (stage_lists or any(pp > 1 for pp in pp_degrees)):
            raise ProfileError("--roles measures one-stage replicas: it takes no --stages and "
                               "no --pp above 1")
        if stage_lists:
            if len(models) != 1 or partitions or pp_degrees:
                raise ProfileError("--stages takes exactly one --model and no --partition or "
                                   "--pp (the stages name the partitions and the degree)")
            tasks = [pipeline_task(deployment, models[0], [p.strip() for p in s.split(",")])
                     for s in stage_lists]
        else:
            tasks = profile_tasks(deployment, partitions, models, pp_degrees or (1,))
    except ProfileError as exc:
        fail(f"{models_yaml}: {exc}")
    if not tasks:
        fail(f"{models_yaml}: nothing to profile for the partitions and models asked")
    client = client_for_deployment(deployment)
    err_console.print(f"profiling {len(tasks)} task(s); results in "
                      f"{deployment.measured_profiles_path}", highlight=False)
    try:
        written = run_profiles(deployment, tasks, client, force=force, roles=roles,
                               phase_s=PHASE_S if phase_s is None else phase_s,
                               progress=lambda m: err_console.print(m, highlight=False))
    except TransientError as exc:
        fail(f"Slurm is unreachable, try again later: {exc}", status=EXIT_UNAVAILABLE)
    except EngineFailed as exc:
        fail(f"coral-hpc profile: the engine failed: {exc}", status=EXIT_ENGINE_FAILED)
    except ProfileError as exc:
        fail(f"coral-hpc profile: {exc}", status=EXIT_INTERNAL)
    if as_json:
        print_json({"profiles": [str(p) for p in written]})
