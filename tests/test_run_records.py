"""What a run records beyond its metrics: where it came from (version, commit), the mean return of the last 100
training episodes, a video after every evaluation (--video-every-eval) sent to W&B and TensorBoard, and TensorBoard
event files (--logger tensorboard)."""

import json
import subprocess
import time
from importlib import metadata
from pathlib import Path

import imageio.v2 as imageio
import pytest
from run_helpers import tiny_ppo
from test_recipes import wandb_history

from agents import Agent
from recipes import ppo
from training import Callback
from training.logger import flatten_config
from training.metrics import RECENT_EPISODES

ROOT = Path(__file__).resolve().parents[1]


def test_config_and_checkpoint_record_the_version_and_commit(output_dir):
    ppo.main(tiny_ppo(output_dir, total_frames=256, eval_every=256))
    source = json.loads((output_dir / "config.json").read_text())["source"]
    assert source["version"] == metadata.version("rlkit")
    git = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if git.returncode == 0:  # a git checkout (CI clones one)
        assert source["commit"] == git.stdout.strip() and isinstance(source["dirty"], bool)
    else:
        assert source["commit"] is None and source["dirty"] is None
    assert Agent.load(output_dir).config["source"] == source


class Returns(Callback):
    """Every finished training episode's return, and the recent-return metric of each batch."""

    def __init__(self):
        self.returns, self.recent = [], []

    def on_batch(self, run, batch, metrics):
        done = batch.get(("next", "done"))
        self.returns += batch.get(("next", "episode_return"))[done].tolist()
        if "train/episode_return_recent" in metrics:
            self.recent.append((len(self.returns), metrics["train/episode_return_recent"]))


def test_recent_return_is_the_mean_of_the_last_100_training_episodes(output_dir, monkeypatch):
    from run_helpers import interrupt_at

    returns = Returns()
    interrupt_at(monkeypatch, 4_096)  # the window carries over a resume too
    ppo.main(tiny_ppo(output_dir, total_frames=8_192, eval_every=8_192), callbacks=[returns])
    ppo.main(
        tiny_ppo(output_dir, total_frames=8_192, eval_every=8_192, resume=output_dir), callbacks=[returns]
    )
    assert len(returns.returns) > RECENT_EPISODES and returns.recent  # the window fills and slides
    for count, recent in returns.recent:
        window = returns.returns[max(0, count - RECENT_EPISODES) : count]
        assert recent == pytest.approx(sum(window) / len(window))


def mp4_frames(path):
    with imageio.get_reader(path, format="FFMPEG") as reader:
        return sum(1 for _ in reader)


def tensorboard_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


def test_tensorboard_logger_writes_metrics_config_and_every_evaluation_video(output_dir):
    summary = ppo.main(tiny_ppo(output_dir, logger="tensorboard", video=True, video_every_eval=True))
    videos = sorted((output_dir / "videos").iterdir())
    assert [video.name for video in videos] == [
        f"eval-{frames:09d}.mp4" for frames in (512, 1024, 1536, 2048)
    ]
    assert all(mp4_frames(video) > 1 for video in videos)
    events = tensorboard_events(output_dir / "tensorboard")
    evaluations = events.Scalars("eval/return_mean")
    assert [event.step for event in evaluations] == [512, 1024, 1536, 2048]
    assert evaluations[-1].value == pytest.approx(summary["eval_return_mean"])
    assert "train/episode_return_recent" in events.Tags()["scalars"]
    images = events.Images("video/eval")
    assert [image.step for image in images] == [
        512,
        1024,
        1536,
        2048,
        2048,
    ]  # each evaluation's, then video.mp4
    gif = imageio.mimread(images[0].encoded_image_string, format="GIF")
    assert len(gif) == mp4_frames(videos[0]) and gif[0].shape[:2] == (images[0].height, images[0].width)
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text.strip("`\n"))["run"]["logger"] == "tensorboard"


def test_long_episodes_reach_tensorboard_as_a_gif_of_at_most_300_frames(tmp_path):
    from training.logger import _gif

    path = tmp_path / "long.mp4"
    from agents.agent import write_video

    write_video(
        [__import__("numpy").full((16, 16, 3), index % 255, "uint8") for index in range(700)], path, fps=50
    )
    height, width, gif = _gif(path, max_frames=300)
    frames = imageio.mimread(gif, format="GIF")
    assert (height, width) == (16, 16) and len(frames) == 234  # every 3rd of 700


def test_wandb_gets_every_evaluation_video(output_dir):
    ppo.main(tiny_ppo(output_dir, logger="wandb", video=False, video_every_eval=True))
    run = next((output_dir / "wandb").glob("offline-run-*"))
    deadline = time.monotonic() + 30  # W&B's service process may still be writing its log
    while True:
        history = wandb_history(next(run.glob("run-*.wandb")))
        videos = [row for row in history if "video/eval/_type" in row]
        if len(videos) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [row["video/step"] for row in videos] == [512, 1024, 1536, 2048]
    assert all(row["video/eval/_type"] == "video-file" for row in videos)
    assert len(list(run.rglob("media/videos/**/*.mp4"))) == 4


def test_without_a_renderer_every_evaluation_still_runs_and_one_warning_says_why(output_dir, monkeypatch):
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    def render(self):
        raise RuntimeError("no OpenGL here")

    monkeypatch.setattr(CartPoleEnv, "render", render)
    config = tiny_ppo(output_dir, logger="tensorboard", video=True, video_every_eval=True)
    with pytest.warns(
        UserWarning, match="No eval-000000512.mp4: CartPole-v1 could not be rendered"
    ) as warnings:
        summary = ppo.main(config)
    assert summary["frames"] == 2_048 and len(summary_rows(output_dir)) == 4
    assert len([warning for warning in warnings if "rendered" in str(warning.message)]) == 1
    assert not list((output_dir / "videos").glob("*.mp4")) and not (output_dir / "video.mp4").exists()


def summary_rows(output_dir):
    return (output_dir / "evaluations.csv").read_text().splitlines()[1:]


def test_config_flattens_to_tensorboard_hyperparameters():
    config = {"run": {"seed": 0, "env_kwargs": [], "output_dir": None}, "variant": "dqn", "lr": 1e-3}
    assert flatten_config(config) == {
        "run.seed": 0,
        "run.env_kwargs": "[]",
        "run.output_dir": "null",
        "variant": "dqn",
        "lr": 1e-3,
    }


def test_the_summary_says_how_long_the_evaluations_took_and_a_resume_keeps_counting(output_dir, monkeypatch):
    from run_helpers import interrupt_at

    from training import evaluation

    original = evaluation.run_deterministic

    def slow(*args, **kwargs):  # each evaluation takes at least 0.2 s
        time.sleep(0.2)
        return original(*args, **kwargs)

    monkeypatch.setattr(evaluation, "run_deterministic", slow)
    interrupt_at(monkeypatch, 512)
    ppo.main(tiny_ppo(output_dir, total_frames=1_024, eval_every=256))  # stops after two evaluations
    summary = ppo.main(tiny_ppo(output_dir, total_frames=1_024, eval_every=256, resume=output_dir))
    evaluations = len((output_dir / "evaluations.csv").read_text().splitlines()) - 1
    assert evaluations == 4
    assert 0.2 * evaluations <= summary["eval_time_s"] < summary["wall_time_s"]
