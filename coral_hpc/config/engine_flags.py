"""Engine arguments and variables a config may not set: the ones the planner or launcher owns
(vLLM's argparse keeps the last value, so one would silently override the plan) and the ones that
would carry a secret into argv or rendered scripts."""

from __future__ import annotations

#: Flags the planner or launcher sets on every engine, and why a config may not set them: vLLM's
#: argparse keeps the last value, so one in ``vllm_args`` would silently override the plan.
PLANNER_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "the planner chooses tensor parallelism per layout",
    "--pipeline-parallel-size": "the planner chooses pipeline stages per layout",
    "--sim-layers": "the planner chooses the layers of each pipeline stage",
    "--kv-transfer-config": "the launcher sets it from engine.kv_connector",
    "--served-model-name": "the gateway routes by the model's name, which the launcher sets",
    "--host": "the launcher binds the engine and reports where",
    "--port": "the launcher picks the port and reports it",
    "--uds": "the launcher binds the engine and reports where",
    "--nnodes": "the launcher sets the pipeline's nodes",
    "--node-rank": "the launcher sets the pipeline's nodes",
    "--master-addr": "the launcher sets the pipeline's nodes",
    "--master-port": "the launcher sets the pipeline's nodes",
    "--headless": "the launcher sets the pipeline's nodes",
    "--runner": "set from the model's task (an embedding model runs vLLM's pooling runner)",
    "--convert": "set from the model's task (an embedding model runs vLLM's pooling runner)",
    "--task": "set from the model's task (an embedding model runs vLLM's pooling runner)",
    "--config": "a vLLM config file can set any planner-owned flag",
    "--api-key": "a secret: the replica key reaches the engine as VLLM_API_KEY, never argv",
    "--hf-token": "a secret: set engine.hf_token_file (it reaches the engine as HF_TOKEN)",
}
#: vLLM's short aliases of planner-owned flags; argparse also takes ``-tp4`` style joined values
_PLANNER_SHORT = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}
#: a word of a flag's name that marks it as carrying a secret (``--hf-token``, ``--ssl-password``);
#: whole words only, so ``--max-num-batched-tokens`` and ``--tokenizer`` stay allowed
_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "secrets", "password", "passwd",
                           "credential", "credentials"})
#: the planner-owned variables of the engine's environment (``environment.env``)
PLANNER_ENV = {"VLLM_PP_LAYER_PARTITION": "the planner chooses the layers of each pipeline stage"}


def engine_flag_problem(arg: str) -> str | None:
    """Why engine argument ``arg`` may not come from a config, or None.

    Both ``--flag value`` and ``--flag=value`` are read, underscores count as dashes (vLLM's
    parser accepts both) and a unique prefix counts as the flag it abbreviates, as argparse's
    ``allow_abbrev`` (on in vLLM) would take it: ``--tensor-parallel`` is
    ``--tensor-parallel-size``."""
    if not arg.startswith("-") or arg == "--":
        return None
    if not arg.startswith("--"):
        for short, flag in _PLANNER_SHORT.items():
            if arg.split("=", 1)[0].startswith(short):
                return f"{short} is {flag}: {PLANNER_FLAGS[flag]}"
        return None
    name = arg.split("=", 1)[0].replace("_", "-").lower()
    if name in PLANNER_FLAGS:
        return f"{name}: {PLANNER_FLAGS[name]}"
    words = set(name[2:].split("-"))
    if words & _SECRET_WORDS:
        return (f"{name} carries a secret, which would land in argv and in rendered scripts; "
                "secrets reach the engine from files (engine.hf_token_file, the replica key)")
    if len(name) > 2:
        owned = sorted(flag for flag in PLANNER_FLAGS if flag.startswith(name))
        if owned:
            return (f"{name} abbreviates {' or '.join(owned)}, which argparse accepts: "
                    f"{PLANNER_FLAGS[owned[0]]}")
    return None


def engine_args_problems(args: tuple[str, ...]) -> list[tuple[int, str]]:
    """(index, why) of every argument of ``args`` that sets a planner-owned flag or a secret."""
    return [(index, why) for index, arg in enumerate(args)
            if (why := engine_flag_problem(arg)) is not None]
