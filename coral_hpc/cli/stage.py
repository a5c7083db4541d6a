"""``coral-hpc stage FILE``: download every model's weights into the site's shared Hugging Face
cache with one Slurm job, once, before serving (see :mod:`coral_hpc.launch.stage`)."""

from __future__ import annotations

import sys
import time

import click

from coral_hpc.cli._output import (
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    Column,
    console,
    err_console,
    fail,
    print_json,
    print_table,
    wide_option,
)
from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError, PermanentError, TransientError


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--partition", help="Partition whose engine environment runs the download "
                                  "[default: the first in cluster.partitions].")
@click.option("--timeout", type=float, default=4 * 3600.0, show_default=True,
              help="Seconds to wait for the job; it keeps running if this ends first.")
@click.option("--no-wait", is_flag=True, help="Submit and print the job id only.")
@click.option("--json", "as_json", is_flag=True, help="Print the job's result as JSON.")
@wide_option
def stage(file: str, partition: str | None, timeout: float, no_wait: bool, as_json: bool,
          wide: bool) -> None:
    """Download FILE's models into the shared Hugging Face cache (HF_HOME) with one Slurm job;
    models already there are not downloaded again."""
    from coral_hpc.launch.stage import (
        OK_STATUSES,
        StageError,
        keep_config_copies,
        submit_stage,
    )
    from coral_hpc.slurm import client_for_deployment

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s); nothing was submitted"])
    partition = partition or deployment.cluster.partitions[0].name
    client = client_for_deployment(deployment)
    try:
        job = submit_stage(deployment, client, partition, sys.executable)
    except StageError as exc:
        fail(f"--partition: {exc}")
    except TransientError as exc:
        fail(f"Slurm is unreachable, nothing was submitted: {exc}", status=EXIT_UNAVAILABLE)
    except PermanentError as exc:
        fail(f"Slurm refused the staging job: {exc}")
    err_console.print(f"staging job {job.job_id} on {partition}: {len(job.sources)} model(s); "
                      f"log {job.log_file}", highlight=False)
    if no_wait:
        if as_json:
            print_json({"job_id": job.job_id, "result_file": str(job.result_file)})
        return
    result = _wait(client, job, timeout)
    if result is None:
        fail(f"job {job.job_id} ended without a result; see {job.log_file}",
             status=EXIT_UNAVAILABLE)
    copies = keep_config_copies(deployment, result)
    if as_json:
        print_json({"job_id": job.job_id, **result, "config_copies": copies})
    else:
        rows = [(source, r["status"], r.get("path") or r.get("message", ""))
                for source, r in result["results"].items()]
        print_table([Column("model source", "id"), Column("status", "id"),
                     Column("path or reason")], rows, wide=wide)
        console.print(f"HF_HOME {result['hf_home']}", highlight=False)
        for source, where in copies.items():
            console.print(f"{source}: config.json for validate/plan: {where}", highlight=False)
    statuses = [r["status"] for r in result["results"].values()]
    if any(s in ("refused", "missing") for s in statuses):
        raise SystemExit(EXIT_INVALID)  # a wrong source or a token the hub refuses
    if any(s not in OK_STATUSES for s in statuses):
        raise SystemExit(EXIT_UNAVAILABLE)  # the hub or the filesystem failed: try again


def _wait(client, job, timeout: float) -> dict | None:
    """Poll the job until it ends (one batched squeue/sacct call every few seconds)."""
    from coral_hpc.launch.stage import read_stage_result

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = read_stage_result(job.result_file)
        if result is not None:
            return result
        try:
            state = client.job_states([job.job_id])[job.job_id]
        except TransientError:
            state = None
        if state is not None and state.finished:
            time.sleep(1.0)  # the shared filesystem may show the file a moment later
            return read_stage_result(job.result_file)
        time.sleep(2.0)
    fail(f"job {job.job_id} still runs after {timeout:g} s; it goes on, its result will be in "
         f"{job.result_file}", status=EXIT_UNAVAILABLE)
