"""The metrics logger: Weights & Biases, CSV files or TensorBoard through TorchRL's loggers, with W&B falling back
to offline, then to CSV, rather than stopping a run; videos go to the loggers that show them."""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

from training.config import RunConfig

# this process's W&B loggers whose run has not finished: a run that failed leaves one, which the next run finishes
# (else W&B would hand that next run the failed one's record)
_OPEN_WANDB_LOGGERS: list[Any] = []


def make_logger(
    run: RunConfig, algorithm: str, output_dir: Path, config: dict[str, Any], wandb_id: str | None = None
):
    """Build the TorchRL logger chosen by ``run.logger`` (None for 'none') and log the config to it.

    W&B that fails to start or to take the config never stops training: online -> offline -> CSV files, each
    step with a warning. ``wandb_id`` continues that W&B run (a resumed run).
    """
    from torchrl.record.loggers import CSVLogger

    if run.logger == "none":
        return None

    def csv_logger():
        logger = CSVLogger(exp_name="csv", log_dir=str(output_dir))
        logger.log_hparams(config)
        return logger

    if run.logger == "csv":
        return csv_logger()
    if run.logger == "tensorboard":
        return tensorboard_logger(output_dir, config)
    from torchrl.record.loggers import WandbLogger

    # wandb advertises Weave (LLM tracing) when a module named like an LLM library is imported, and our top-level
    # `agents` package is named like OpenAI's Agents SDK. Weave has nothing to trace here; a user's own
    # WANDB_DISABLE_WEAVE setting is kept.
    os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")

    def wandb_logger(offline: bool):
        logger = WandbLogger(
            exp_name=output_dir.name,
            offline=offline,
            save_dir=str(output_dir),
            project=run.wandb_project,
            config=config,
            group=algorithm,
            log_env_packages=False,
            settings={"silent": True},
            id=wandb_id,
            # explicit: TorchRL marks offline only through WANDB_MODE, which a failed online attempt's cached
            # settings override and which stays set for a later online run in the same process
            mode="offline" if offline else "online",
        )
        _OPEN_WANDB_LOGGERS.append(logger)
        try:
            logger.log_hparams(config)
        except Exception:
            close_logger(logger, failed=True)  # before the next attempt opens its own
            raise
        return logger

    while _OPEN_WANDB_LOGGERS:  # close_logger takes each off the list first, so this ends even if it raises
        try:
            close_logger(_OPEN_WANDB_LOGGERS[0], failed=True)
        except Exception as error:  # noqa: BLE001 - an earlier run's record is not worth this run
            warnings.warn(f"An earlier failed run's W&B run could not be finished ({error!r}).", stacklevel=2)
    attempts = [("online W&B", False)] if run.wandb_online else []
    attempts.append(("offline W&B", True))
    for index, (name, offline) in enumerate(attempts):
        try:
            return wandb_logger(offline)
        except Exception as error:  # noqa: BLE001 - wandb raises many kinds (network, auth, filesystem)
            fallback = attempts[index + 1][0] if index + 1 < len(attempts) else "CSV"
            warnings.warn(
                f"{name} failed to start ({error!r}); training goes on with {fallback} logging.", stacklevel=2
            )
    return csv_logger()


def close_logger(logger: Any, failed: bool = False) -> None:
    """Finish ``logger``'s W&B run (with exit code 1 when the run ``failed``) or close TensorBoard's writer."""
    if is_wandb(logger):
        if logger in _OPEN_WANDB_LOGGERS:
            _OPEN_WANDB_LOGGERS.remove(logger)
        logger.experiment.finish(exit_code=int(failed))
    elif logger is not None and hasattr(logger.experiment, "close"):  # TensorBoard's writer
        logger.experiment.close()


def is_wandb(logger: Any) -> bool:
    """Whether ``logger`` is TorchRL's W&B logger (imported only when W&B is used)."""
    return type(logger).__name__ == "WandbLogger"


def tensorboard_logger(output_dir: Path, config: dict[str, Any]):
    """TorchRL's TensorBoard logger writing to ``output_dir/tensorboard``, with the config as hyperparameters
    (flattened to ``group.option``) and as JSON text."""
    from torchrl.record.loggers import TensorboardLogger

    logger = TensorboardLogger(exp_name="tensorboard", log_dir=str(output_dir))
    flat = flatten_config(config)
    logger.experiment.add_hparams(
        flat, {}, run_name="."
    )  # ".": beside the metrics, not in a folder of its own
    logger.experiment.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")
    return logger


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{"run": {"seed": 0, "env_kwargs": []}}`` -> ``{"run.seed": 0, "run.env_kwargs": "[]"}``: the scalar
    values TensorBoard's hyperparameters take (anything else as its JSON text)."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value)
    return flat


def log_video(logger: Any, path: Path, frames: int, max_frames: int = 300) -> None:
    """Log the MP4 at ``path`` under ``video/eval`` at step ``frames``: W&B gets the file, TensorBoard an animated
    GIF of at most ``max_frames`` frames (every k-th frame of a longer episode, played back in the same time);
    the CSV logger keeps none (the file stays in the run folder)."""
    if logger is None:
        return
    if is_wandb(logger):
        import wandb

        logger.log_metrics({"video/eval": wandb.Video(str(path), format="mp4")}, step=frames)
    elif type(logger).__name__ == "TensorboardLogger":
        from torch.utils.tensorboard.summary import Summary

        height, width, gif = _gif(path, max_frames)
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
        summary = Summary(value=[Summary.Value(tag="video/eval", image=image)])
        logger.experiment._get_file_writer().add_summary(summary, frames)


def _gif(path: Path, max_frames: int) -> tuple[int, int, bytes]:
    import imageio.v2 as imageio

    with imageio.get_reader(path, format="FFMPEG") as reader:
        fps = reader.get_meta_data().get("fps", 30) or 30
        stride = max(1, -(-reader.count_frames() // max_frames))
        video = [frame for index, frame in enumerate(reader) if index % stride == 0]  # only the kept ones
    buffer = io.BytesIO()
    imageio.mimwrite(buffer, video, format="GIF", duration=1000 * stride / fps, loop=0)
    height, width = video[0].shape[:2]
    return height, width, buffer.getvalue()
