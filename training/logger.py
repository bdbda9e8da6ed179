"""The metrics logger: Weights & Biases or CSV files through TorchRL's loggers, with W&B falling back to offline,
then to CSV, rather than stopping a run."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from training.config import RunConfig


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
        )
        logger.log_hparams(config)
        return logger

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


def is_wandb(logger: Any) -> bool:
    """Whether ``logger`` is TorchRL's W&B logger (imported only when W&B is used)."""
    return type(logger).__name__ == "WandbLogger"
