"""Hyperparameter tuning with Optuna: search spaces, one trial as a recipe run, and the best trial as a preset.

A search space maps option names (as the recipe's flags: ``gae_lambda`` for ``--gae-lambda``) to a range
``{low, high[, log][, step]}`` (integers when both bounds are) or ``{choices: [...]}``; the recipes' spaces are
``recipes/presets/search_spaces.toml``. A trial samples every option of the space, sets them on a fresh config of
the recipe as a user would (the env's preset fills in the rest), trains for the trial's frames with periodic
evaluations reported to the trial (:class:`ReportEvaluations`, which stops a run its pruner gives up on), and
scores the run by the mean return of its last evaluation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from errors import InputError
from training.callbacks import Callback
from training.presets import convert, json_ready, option_paths, option_type, read_tables

SEARCH_SPACES = Path(__file__).resolve().parents[1] / "recipes" / "presets" / "search_spaces.toml"


def read_search_space(algorithm: str, path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The search space of ``algorithm``: the recipe's table of :data:`SEARCH_SPACES`, or the whole of ``path``
    (TOML, or JSON when named ``*.json``; a file with a table named after the recipe gives that table).

    Raises:
        InputError: a file that cannot be read, a recipe without a space, or a malformed entry.
    """
    source = path or SEARCH_SPACES
    tables = read_tables(source, "search space")
    space = tables.get(algorithm) if path is None or isinstance(tables.get(algorithm), dict) else tables
    if not space:
        raise InputError(
            f"{source} has no search space for recipes.{algorithm}; give one with --search-space FILE."
        )
    if space is tables and all(
        isinstance(entry, dict) and not {"low", "high", "choices"} & set(entry) for entry in space.values()
    ):  # tables of other recipes' spaces only
        raise InputError(
            f"{source} has no search space for recipes.{algorithm} (its tables are for {', '.join(sorted(space))}); "
            f"add a [{algorithm}] table or give its options at the top level."
        )
    for name, entry in space.items():
        check_entry(name, entry, source)
    return space


def check_entry(name: str, entry: Any, source: Path) -> None:
    """Raise :class:`InputError` unless ``entry`` is a range or a list of choices."""
    if not isinstance(entry, dict):
        raise InputError(f"{source}: {name} must be a table with low/high or choices, got {entry!r}.")
    if "choices" in entry:
        if set(entry) != {"choices"} or not isinstance(entry["choices"], list) or not entry["choices"]:
            raise InputError(
                f"{source}: {name} = {{choices = [...]}} takes a non-empty list and nothing else."
            )
        return
    low, high = entry.get("low"), entry.get("high")
    numbers = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (low, high))
    if (
        not set(entry) <= {"low", "high", "log", "step"}
        or not numbers
        or not (_finite(low) and _finite(high))
        or low >= high
    ):
        raise InputError(
            f"{source}: {name} needs finite low < high (and optionally log, step) or choices; got {entry!r}."
        )
    if not isinstance(entry.get("log", False), bool):
        raise InputError(f"{source}: {name}'s log must be true or false, got {entry['log']!r}.")
    step = entry.get("step")
    integers = isinstance(low, int) and isinstance(high, int)
    if step is not None and (
        isinstance(step, bool)
        or not isinstance(step, int if integers else (int, float))
        or not _finite(step)
        or step <= 0
    ):
        kind = "a positive integer (low and high are integers)" if integers else "a positive number"
        raise InputError(f"{source}: {name}'s step must be {kind}, got {step!r}.")
    if entry.get("log") and low <= 0:
        raise InputError(f"{source}: {name} samples on a log scale, so low must be above 0; got {low}.")


def _finite(value: float) -> bool:
    """``math.isfinite``, False for an integer too large for a float (hundreds of digits)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_space_fits(space: dict[str, dict[str, Any]], config: Any, source: str) -> None:
    """Raise :class:`InputError` for an option the recipe does not have or a choice it cannot hold."""
    paths = option_paths(config)
    for name, entry in space.items():
        if name not in paths or paths[name][0] == "run":
            raise InputError(f"{source}: {name} is not a hyperparameter of this recipe.")
        for value in entry.get("choices", [entry.get("low"), entry.get("high")]):
            try:
                convert(option_type(config, paths[name]), value)
            except ValueError as error:
                raise InputError(f"{source}: {name} cannot be {error}.") from None


def distribution(name: str, entry: dict[str, Any]) -> Any:
    """The Optuna distribution ``entry`` samples from (choices that Optuna cannot store, lists, as their JSON);
    :class:`InputError` for a range Optuna cannot sample (a log scale with a step)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    try:
        if "choices" in entry:
            return CategoricalDistribution(
                [json.dumps(choice) if isinstance(choice, list) else choice for choice in entry["choices"]]
            )
        low, high, log = entry["low"], entry["high"], entry.get("log", False)
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log, step=entry.get("step", 1))
        return FloatDistribution(low, high, log=log, step=entry.get("step"))
    except ValueError as error:
        raise InputError(f"The search space's {name} cannot be sampled: {error}") from None


def suggest(trial: Any, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Sample each option of ``space`` with ``trial``."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    params = {}
    for name, entry in space.items():
        sampled = distribution(name, entry)
        if isinstance(sampled, CategoricalDistribution):
            params[name] = trial.suggest_categorical(name, sampled.choices)
        elif isinstance(sampled, IntDistribution):
            params[name] = trial.suggest_int(
                name, sampled.low, sampled.high, log=sampled.log, step=sampled.step
            )
        else:
            params[name] = trial.suggest_float(
                name, sampled.low, sampled.high, log=sampled.log, step=sampled.step
            )
    return decode_params(params)


def check_space_continues(new: dict[str, Any], study: Any) -> None:
    """Raise :class:`InputError` for an option whose distribution in ``new`` (a name -> Optuna distribution, as
    :func:`distribution` builds them) Optuna cannot continue from the one the stored trials of ``study`` sampled
    it from: another kind (choices, integers, reals), other choices, or another scale (log or not). Other bounds
    or steps of a range are allowed, as Optuna allows them."""
    from optuna.distributions import CategoricalDistribution

    for trial in study.get_trials(deepcopy=False):
        for name, old in trial.distributions.items():
            if name not in new:
                continue
            same = type(old) is type(new[name]) and (
                old.choices == new[name].choices
                if isinstance(old, CategoricalDistribution)
                else old.log == new[name].log
            )
            if not same:
                raise InputError(
                    f"Study {study.study_name!r} sampled {name} from {old}, and this search space gives {new[name]}, "
                    f"which the study cannot continue with: keep the study's {name}, or give another --study-name."
                )


def decode_params(params: dict[str, Any]) -> dict[str, Any]:
    """A stored trial's parameters as options (lists were stored as their JSON)."""
    return {
        name: json.loads(value) if isinstance(value, str) and value.startswith("[") else value
        for name, value in params.items()
    }


def set_options(config: Any, options: dict[str, Any]) -> None:
    """Set ``options`` on ``config`` as the user would (so the env's preset leaves them alone)."""
    paths = option_paths(config)
    for name, value in options.items():
        section, field = paths[name]
        owner = config if section is None else getattr(config, section)
        setattr(owner, field, convert(option_type(config, paths[name]), value))


class ReportEvaluations(Callback):
    """Report each evaluation's mean return to an Optuna trial (step: ``frames_before`` plus the run's frames, so
    that a trial's later seeds continue its steps); stop the run when the trial's pruner says so (``pruned`` is
    then True)."""

    def __init__(self, trial: Any):
        self.trial = trial
        self.pruned = False
        self.frames_before = 0

    def on_evaluation(self, run: Any, evaluation: dict[str, float]) -> bool | None:
        self.trial.report(evaluation["return_mean"], step=self.frames_before + int(evaluation["frames"]))
        if self.trial.should_prune():
            self.pruned = True
            return False
        return None


def best_preset(study: Any, env_id: str, env_kwargs: dict[str, Any], name: str) -> dict[str, Any]:
    """The best completed trial of ``study`` as a preset file's content (JSON, read by ``--preset-file``): its
    sampled options over those its base preset set."""
    best = study.best_trial
    returns = best.user_attrs.get("returns", [best.value])
    seeds = (
        f" over {len(returns)} seeds ({', '.join(f'{value:.2f}' for value in returns)})"
        if len(returns) > 1
        else ""
    )
    source = (
        f"recipes.tune study {study.study_name!r}, trial {best.number}: mean evaluation return {best.value:.2f}"
        f"{seeds} after {best.user_attrs.get('frames', '?')} frames"
    )
    table = {"source": source, "env_id": env_id, **({"env_kwargs": env_kwargs} if env_kwargs else {})}
    # the options the trial's base preset set come too, and its budget: the preset reproduces the trial
    base = best.user_attrs.get("preset_set", {})
    budget = (
        {"total_frames": study.user_attrs["frames_per_trial"]}
        if "frames_per_trial" in study.user_attrs
        else {}
    )
    return {name: {**table, **base, **budget, **json_ready(decode_params(best.params))}}
