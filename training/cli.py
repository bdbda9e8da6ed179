"""The command line of every recipe: flags parsed into the recipe's config, the run, and exit codes (0 done, 1 a
failed run, 2 bad input, 128 + N stopped by signal N)."""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tyro

from errors import InputError, Interrupted, NonFiniteError, WriteError
from training.config import ConfigT
from training.presets import apply_preset, describe, mark_given, preset_settings, read_presets
from training.resume import RESUME_FILE, explicit_options, resumed_config

ASYNC_ALIASES = {"--async": "--no-sync"}  # gradient workers: --sync (the default) or --async
SCIENTIFIC = re.compile(r"[0-9]+(\.[0-9]+)?[eE]\+?[0-9]+")  # 1e6, 2.5e5: how budgets are written in RL


def integral_notation(token: str) -> str:
    """``token`` with a whole number in scientific notation (``1e6``, ``--total-frames=2.5e5``) written out in
    digits, so that integer options take it as float ones always did; anything else unchanged."""
    option, equals, value = token.rpartition("=") if token.startswith("--") else ("", "", token)
    if not SCIENTIFIC.fullmatch(value) or not float(value).is_integer() or float(value) >= 2**63:
        return token
    return f"{option}{equals}{int(float(value))}"


def quiet_torchrl_info() -> None:
    """Keep TorchRL's INFO lines (on stdout, such as "Initialized LazyTensorStorage with ... shape" at every
    off-policy run's start) out of a command's output; its warnings stay, and ``RL_LOGGING_LEVEL``, TorchRL's own
    setting, wins where the user gives it."""
    if "RL_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("torchrl").setLevel(logging.WARNING)


def run_cli(
    main: Callable[[ConfigT], dict[str, Any]],
    config_type: type[ConfigT],
    description: str,
    presets: Path | None = None,
    adjust: Callable[[ConfigT, set[str]], ConfigT] | None = None,
) -> None:
    """Parse the command line into ``config_type`` (flat flags), run ``main`` and report where results are.

    ``presets`` is the recipe's preset file: ``--list-presets`` prints it, and the env's preset fills in the
    options not given on the command line (``training.presets``); the run starts with a line saying what it set.
    ``adjust(config, given)`` may change the parsed config first, knowing the option names given on the command
    line. Bad input ends with a one-line ``error: ...`` on stderr and exit status 2.
    """
    if presets is not None:
        description += "\n\n--list-presets prints the recipe's presets (hyperparameters per env) and exits."
        if "--list-presets" in sys.argv[1:]:
            try:
                print(list_presets(presets, preset_file_argument(sys.argv[1:]), config_type()))
            except InputError as error:
                print(f"error: {error}", file=sys.stderr)
                raise SystemExit(2) from None
            return
    argv = [integral_notation(ASYNC_ALIASES.get(token, token)) for token in sys.argv[1:]]
    config = tyro.cli(config_type, args=argv, description=description, config=(tyro.conf.OmitArgPrefixes,))
    given = explicit_options(argv)
    mark_given(config, given)  # tyro passed every field: the user's are the command line's
    if adjust is not None and config.run.resume is None:
        config = adjust(config, given)
    warnings.filterwarnings("ignore", module="pygame")
    quiet_torchrl_info()
    status = 0
    try:
        if config.run.resume is not None:
            config = resumed_config(config_type, config)
        elif presets is not None:
            print(describe(apply_preset(config, presets)), flush=True)
        summary = main(config)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        status = 2
    except Interrupted as error:
        print(f"error: {error}", file=sys.stderr)
        status = 128 + signal.Signals[error.signal_name].value
    except (
        KeyboardInterrupt
    ):  # before the training loop took SIGINT over (envs, workers starting) or after it
        print(
            "error: stopped by SIGINT outside the training loop (while the run was being set up or finished); "
            "what it had written is kept.",
            file=sys.stderr,
        )
        status = 128 + signal.SIGINT.value
    except (NonFiniteError, WriteError) as error:
        print(f"error: {error}", file=sys.stderr)
        status = 1
    except Exception:  # noqa: BLE001 - an env's or a worker's own error: its traceback, then a prompt exit
        traceback.print_exc()
        status = 1
    if status:
        # Free the failed run's objects while the interpreter is fully alive: left to its exit, the clean-up of
        # TorchRL's multi-process collectors can deadlock (it starts a thread to stop its workers).
        gc.collect()
        raise SystemExit(status)
    report(summary)


def report(summary: dict[str, Any]) -> None:
    """Print where a finished run's results are; exit 128 + N if signal N stopped it."""
    solved, episodes = summary["solved_at_frames"], summary["eval_episodes"]
    evaluated_on = summary.get("eval_env_id")
    evaluated_on = f" (evaluated on {evaluated_on})" if evaluated_on not in (None, summary["env_id"]) else ""
    print(
        f"{summary['algorithm']} on {summary['env_id']}{evaluated_on}: evaluation return {summary['eval_return_mean']:.1f} "
        f"± {summary['eval_return_std']:.1f} over {episodes} episode{'' if episodes == 1 else 's'} after "
        f"{summary['frames']} frames "
        f"in {summary['wall_time_s']:.1f} s"
        + (f"; reached the target at {solved} frames ({summary['solved_at_s']:.1f} s)" if solved else "")
    )
    output_dir = Path(summary["output_dir"])
    print(
        f"results in {output_dir}/ (summary.json, learning_curve.png, agent.ckpt"
        + (", video.mp4" if (output_dir / "video.mp4").exists() else "")
        + ")"
    )
    if "wandb_offline_run" in summary:
        print(
            f"W&B offline run: {summary['wandb_offline_run']} (upload it with: wandb sync {summary['wandb_offline_run']})"
        )
    if summary["interrupted_by"] is not None:
        resumable = (output_dir / RESUME_FILE).exists()
        saved = "agent.ckpt and resume.ckpt" if resumable else "agent.ckpt"
        print(f"stopped by {summary['interrupted_by']} after {summary['frames']} frames; {saved} saved")
        if resumable:
            print(f"continue with: --resume {summary['output_dir']}")
        raise SystemExit(128 + signal.Signals[summary["interrupted_by"]].value)


def preset_file_argument(argv: list[str]) -> Path | None:
    """The ``--preset-file`` of a command line (``--preset-file F`` or ``--preset-file=F``), or None."""
    for index, token in enumerate(argv):
        if token == "--preset-file" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if token.startswith("--preset-file="):
            return Path(token.split("=", 1)[1])
    return None


def run_command(main: Callable[[ConfigT], dict[str, Any]], config_type: type[ConfigT], description: str):
    """Parse a tool's command line (``recipes.evaluate``, ``export``, ``tune``) into ``config_type``, run ``main``
    and print its summary as JSON; bad input ends with one ``error: ...`` line and exit status 2, a failed write
    with exit status 1. Returns the parsed config and the summary."""
    import json

    argv = [integral_notation(token) for token in sys.argv[1:]]
    config = tyro.cli(config_type, args=argv, description=description)
    quiet_torchrl_info()  # the summary on stdout stays JSON
    try:
        summary = main(config)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except WriteError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print(json.dumps(summary, indent=2, default=str))
    return config, summary


def list_presets(path: Path, preset_file: Path | None = None, config: Any = None) -> str:
    """Every preset of a file (and of ``--preset-file``, first), for ``--list-presets``; with the recipe's
    ``config``, a preset it would refuse says why."""
    lines = []
    if preset_file is not None:
        lines += [
            f"presets in {preset_file} (--preset-file, looked up first):",
            *_listing(preset_file, config),
            "",
        ]
    lines += [
        f"presets in {path} (applied by env id; --preset NAME for another env, --preset none for none):"
    ]
    return "\n".join(lines + _listing(path, config))


def _listing(path: Path, config: Any) -> list[str]:
    lines = []
    for preset in read_presets(path).values():
        target = preset.env_id + "".join(f" {key}={value}" for key, value in preset.env_kwargs.items())
        lines.append(f"\n{preset.name}" + ("" if target == preset.name else f"  [{target}]"))
        lines.append(f"  source: {preset.source}")
        lines.append("  " + " ".join(flag(name, value) for name, value in preset.options.items()))
        if config is not None:
            try:
                preset_settings(config, preset, path)
            except InputError as error:
                lines.append(f"  REFUSED (a run with it stops): {error}")
    return lines


def flag(name: str, value: Any) -> str:
    """A preset's option as it reads on the command line: ``--hidden-sizes 256 256``, ``--no-anneal-lr``."""
    option = name.replace("_", "-")
    if value is True:
        return f"--{option}"
    if value is False:
        return f"--no-{option}"
    if isinstance(value, (list, tuple)):
        return f"--{option} " + " ".join(map(str, value))
    return f"--{option} {value}"
