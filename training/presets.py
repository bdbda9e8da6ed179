"""Presets: named sets of hyperparameters for one (algorithm, env) pair, kept as data next to the recipes.

Each recipe has one TOML file, ``recipes/presets/ALGORITHM.toml``, with a table per preset::

    ["LunarLander-v3"]                      # the preset's name: by default the env id it is for
    source = "RL Zoo, hyperparams/ppo.yml"  # where the numbers come from
    num_envs = 16                           # the recipe's options, named as its flags are (--num-envs)
    gae_lambda = 0.98

    ["LunarLanderContinuous"]
    env_id = "LunarLander-v3"               # the env, when the name is not its id ...
    env_kwargs = { continuous = true }      # ... for runs with these env kwargs only

    ["atari"]
    env_id = "ALE/*"                        # a pattern (fnmatch) covers a family of envs

``--preset auto`` (the default) picks the preset of the run's env: the table whose ``env_id`` is the run's id,
else the first pattern that matches it, among those made with exactly the run's ``--env-kwargs`` (a kwarg can
change the task: LunarLander-v3's ``continuous=true`` gets the continuous preset or none, never the discrete one;
``--preset NAME`` applies a preset to a run with other kwargs). ``--preset none`` applies none; ``--preset NAME`` applies that table whatever the env. A preset sets
only the options left at the recipe's defaults: an option given on the command line (or, from Python, set to any
value other than its default) wins, and so does the config's ``preset_skips()`` where it has one (the options no preset
sets for that config: SAC's tanh-normal head under ``--use-sde``). What was applied is recorded in ``config.run.preset_applied`` (and so in
``config.json``, the W&B config and resume checkpoints).

``--preset-file FILE`` adds the presets of another file, TOML as above or JSON of the same shape (``recipes.tune``
writes its best trial as one): they come first, for ``auto`` and for names.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from agents.files import require_regular_file
from errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

META_KEYS = {"source", "env_id", "env_kwargs"}
# The options every recipe shares (``training.config.RunConfig``) that a preset may set: the budget and how the
# learning is paced and computed. The others say what the task is (seed, wrappers, the evaluation env, episode
# limits) or where and how the run is carried out (its folder, logger, devices, workers, resuming, replacing a
# finished run): a preset file, perhaps someone else's, sets none of them; the command line does.
RUN_OPTIONS = {
    "num_envs",
    "total_frames",
    "eval_every",
    "eval_episodes",
    "stop_at_return",
    "threads",
    "env_backend",
    "vectorization",
    "normalize_obs_warmup",
    "matmul_precision",
    "linear_kernels",
    "flush_denormal",
    "compile",
}


@dataclasses.dataclass(frozen=True)
class Preset:
    """One table of a preset file."""

    name: str
    env_id: str
    env_kwargs: dict[str, Any]
    source: str
    options: dict[str, Any]

    @property
    def is_pattern(self) -> bool:
        return any(character in self.env_id for character in "*?[")

    def matches(self, env_id: str, env_kwargs: dict[str, Any]) -> bool:
        """Whether this preset is for ``env_id`` made with exactly ``env_kwargs``."""
        return fnmatch.fnmatchcase(env_id, self.env_id) and env_kwargs == self.env_kwargs


def read_tables(path: Path, what: str) -> dict[str, Any]:
    """The top-level table of a TOML file, or of a JSON file when it is named ``*.json``; :class:`InputError`
    naming ``what`` the file should hold for one that cannot be read or is not a table."""
    require_regular_file(path, what)
    try:
        text = Path(path).read_text()
        tables = json.loads(text) if Path(path).suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError, tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise InputError(f"Could not read the {what} {path}: {error}") from None
    if not isinstance(tables, dict):
        raise InputError(f"{path} is not a table: a {what} holds one.")
    return tables


def read_presets(path: Path) -> dict[str, Preset]:
    """The presets of one file (TOML, or JSON when it is named ``*.json``), by name; :class:`InputError` for a
    malformed file."""
    tables = read_tables(path, "preset file")
    if not tables:
        raise InputError(f"{path} holds no presets; a preset file has a [NAME] table of options per preset.")
    presets = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise InputError(f"{path}: {name!r} is not a table; each preset is a [NAME] table of options.")
        env_kwargs = table.get("env_kwargs", {})
        source = table.get("source")
        if not isinstance(source, str) or not source:
            raise InputError(f"{path}: preset {name!r} has no source (where its numbers come from).")
        if not isinstance(env_kwargs, dict):
            raise InputError(f"{path}: preset {name!r} has env_kwargs that are not a table.")
        env_id = table.get("env_id", name)
        if not isinstance(env_id, str):
            raise InputError(f"{path}: preset {name!r} has an env_id that is not text.")
        options = {key: value for key, value in table.items() if key not in META_KEYS}
        presets[name] = Preset(name, env_id, env_kwargs, source, options)
    return presets


def find_preset(
    presets: dict[str, Preset] | list[Preset], env_id: str, env_kwargs: dict[str, Any]
) -> Preset | None:
    """The preset ``--preset auto`` picks for a run (see the module docstring), or None. An id of Gymnasium's
    ``module:EnvId`` form gets the preset of ``EnvId`` when none is written for the whole id (the module only
    registers the env: ``gymnasium:CartPole-v1`` is CartPole-v1)."""
    for name in dict.fromkeys([env_id, env_id.partition(":")[2] or env_id]):
        for patterns in (False, True):
            candidates = [
                preset
                for preset in (presets.values() if isinstance(presets, dict) else presets)
                if preset.is_pattern == patterns and preset.matches(name, env_kwargs)
            ]
            if candidates:
                return candidates[0]
    return None


def option_paths(config: Any) -> dict[str, tuple[str | None, str]]:
    """Each option name of a recipe config -> (section, field), section None for a top-level field."""
    paths: dict[str, tuple[str | None, str]] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                paths[inner.name] = (field.name, inner.name)
        else:
            paths[field.name] = (None, field.name)
    return paths


def get_option(config: Any, path: tuple[str | None, str]) -> Any:
    section, name = path
    return getattr(config if section is None else getattr(config, section), name)


def set_option(config: Any, path: tuple[str | None, str], value: Any) -> None:
    """Set an option as a preset does: not counted as assigned by the user (``agents.options.Options``)."""
    section, name = path
    owner = config if section is None else getattr(config, section)
    if hasattr(owner, "assign"):
        owner.assign(name, value)
    else:
        setattr(owner, name, value)


def mark_given(config: Any, names: Collection[str]) -> None:
    """Count exactly the options ``names`` as set by the user (e.g. those on the command line, when a parser
    passed every field to the constructor)."""
    config.forget_assignments()
    for name, (section, field) in option_paths(config).items():
        if name in names:
            owner = config if section is None else getattr(config, section)
            owner.__dict__["_assigned"].add(field)


def assigned_options(config: Any) -> set[str]:
    """The option names assigned in Python since the config was made (``config.optim.lr = ...``)."""
    names = set(getattr(config, "assigned", ()))
    for field in dataclasses.fields(config):
        names |= set(getattr(getattr(config, field.name), "assigned", ()))
    return names


def option_type(config: Any, path: tuple[str | None, str]) -> Any:
    section, name = path
    owner = config if section is None else getattr(config, section)
    return typing.get_type_hints(type(owner))[name]


def convert(hint: Any, value: Any) -> Any:
    """``value`` (read from TOML) as the option of type ``hint`` holds it; ValueError if it cannot."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in arguments:
            if option is type(None):
                continue
            try:
                return convert(option, value)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError(errors[0] if errors else f"{value!r} is not allowed")
    if origin is Literal:
        if value not in arguments:
            raise ValueError(f"{value!r} is not one of {', '.join(map(repr, arguments))}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not a list")
        return tuple(convert(arguments[0], item) for item in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{value!r} is not a number")
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits
            raise ValueError(
                f"{str(value)[:20]}... ({len(str(value))} digits) is beyond the float range"
            ) from None
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not text")
        return value
    raise ValueError(f"options of type {hint} cannot be set by a preset")


def preset_settings(config: Any, preset: Preset, path: Path) -> dict[str, Any]:
    """The options ``preset`` sets, converted to the config's types; :class:`InputError` naming the file for an
    option the recipe does not have or a value it cannot hold."""
    paths = option_paths(config)
    settings = {}
    for name, value in preset.options.items():
        if name not in paths:
            raise InputError(
                f"{path}: preset {preset.name!r} sets {name!r}, which is not an option of this recipe."
            )
        if paths[name][0] == "run" and name not in RUN_OPTIONS:
            raise InputError(
                f"{path}: preset {preset.name!r} sets {name!r}, which says what the task is or how the run is "
                f"carried out, not how it learns; a preset cannot set it: give --{name.replace('_', '-')} on the "
                "command line and remove it from the preset."
            )
        try:
            settings[name] = convert(option_type(config, paths[name]), value)
        except ValueError as error:
            raise InputError(f"{path}: preset {preset.name!r} sets {name}: {error}.") from None
    return settings


def apply_preset(config: Any, path: Path, given: Collection[str] | None = None) -> dict[str, Any]:
    """Apply the preset that ``config.run.preset`` asks for to ``config`` (in place) and record it in
    ``config.run.preset_applied``; returns that record.

    Args:
        config: a recipe's config dataclass.
        path: the recipe's preset file.
        given: option names set explicitly (the command line's); the preset leaves them alone, as it leaves the
            options assigned in Python since the config was made and those whose value differs from the
            recipe's default.

    A config already resolved for the same env, env kwargs and ``--preset`` is left as it is; one resolved for
    another (a config reused for a second env) first gets back the defaults of the options its preset had set.
    """
    run = config.run
    preset_file = getattr(run, "preset_file", None)
    request = [run.env_id, sorted(run.env_options.items()), run.preset] + (
        [str(preset_file)] if preset_file else []
    )
    previous = run.preset_applied
    if previous is not None and not (
        isinstance(previous, dict) and isinstance(previous.get("set"), dict) and "for" in previous
    ):
        raise InputError(
            f"run.preset_applied holds {previous!r:.80}, not a record of a preset (leave it to the recipe: None)."
        )
    if previous is not None and previous.get("for") == json_ready(request):
        return previous
    defaults = type(config)()
    paths = option_paths(config)
    if previous is not None:  # undo what the last preset set and nobody changed since
        user_set = assigned_options(config)
        for name, value in previous.get("set", {}).items():
            if (
                name in paths
                and name not in user_set
                and json_ready(get_option(config, paths[name])) == value
            ):
                set_option(config, paths[name], get_option(defaults, paths[name]))
    # the file's presets first, then the recipe's: a table of the file named as one of the recipe's wins for that
    # name, and the recipe's stays there for --preset auto when the file's is for another env
    first = read_presets(preset_file) if preset_file is not None else {}
    builtin = read_presets(path)
    if run.preset == "none":
        preset = None
    elif run.preset == "auto":
        preset = find_preset([*first.values(), *builtin.values()], run.env_id, run.env_options)
    elif run.preset in first or run.preset in builtin:
        preset = first.get(run.preset) or builtin[run.preset]
    else:
        raise InputError(
            f"--preset {run.preset!r} is not a preset of this recipe; use auto, none or one of: "
            + ", ".join(sorted({*first, *builtin}))
            + " (--list-presets shows them)."
        )
    kept = (
        set(given or ())
        | assigned_options(config)
        | set(getattr(config, "preset_skips", set)())  # what no preset sets for this config (the recipe says)
        | {
            name
            for name, option in paths.items()
            if get_option(config, option) != get_option(defaults, option)
        }
    )
    applied: dict[str, Any] = {}
    if preset is not None:
        source = preset_file if preset is first.get(preset.name) else path  # the file that holds it
        for name, value in preset_settings(config, preset, Path(source)).items():
            if name not in kept:
                set_option(config, paths[name], value)
                applied[name] = value
    record = {
        "name": None if preset is None else preset.name,
        "source": None if preset is None else preset.source,
        "set": json_ready(applied),
        "for": json_ready(request),
    }
    run.preset_applied = record
    return record


def preset_note(run: Any, *names: str) -> str:
    """``"; the preset NAME set --a, --b"`` for those of the options ``names`` that the run's preset set (for an
    error about them, so that a user who never typed them sees where they came from), else ``""``."""
    applied = run.preset_applied or {}
    set_here = [f"--{name.replace('_', '-')}" for name in names if name in applied.get("set", {})]
    return f"; the preset {applied.get('name')} set {', '.join(set_here)}" if set_here else ""


def json_ready(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists), for comparisons with a saved record."""
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def describe(record: dict[str, Any]) -> str:
    """One line for the start of a run: which preset applied and what it set."""
    if record["name"] is None:
        return "preset: none (the recipe's defaults and the options given)"
    settings = ", ".join(f"{name}={value}" for name, value in record["set"].items()) or "nothing (all given)"
    return f"preset {record['name']} ({record['source']}): {settings}"
