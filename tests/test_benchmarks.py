"""The benchmarks' own runs of this toolkit (the SB3 sides need the bench extra and are not run here)."""

import json

import pytest
import torch

from benchmarks import (
    dqn_vs_sb3,
    ppo_hopper_vs_sb3,
    ppo_vs_sb3,
    sac_halfcheetah_vs_sb3,
    td3_halfcheetah_vs_sb3,
)
from training.seeding import set_matmul_precision


@pytest.mark.parametrize(
    "module", [ppo_vs_sb3, dqn_vs_sb3, ppo_hopper_vs_sb3, sac_halfcheetah_vs_sb3, td3_halfcheetah_vs_sb3]
)  # the budgets they take from TOTAL_FRAMES
def test_a_benchmark_side_runs_again_in_the_same_folder(module, tmp_path, monkeypatch):
    """Each side writes runs/bench-...-SEED: a second benchmark run replaces it instead of stopping with an error."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "TOTAL_FRAMES", 256, raising=False)
    monkeypatch.setattr(module, "EVAL_EPISODES", 1, raising=False)
    monkeypatch.setattr(module, "LEARNING_STARTS", 128, raising=False)
    for _ in range(2):
        row = module.run_ours(0, zoo=True)
    assert row["frames"] >= 256 and row["wall_time_s"] > 0


def test_the_gradient_worker_scaling_model_splits_compute_not_the_learners_costs():
    from benchmarks.gradient_workers import predict_sync

    one_worker = {
        "worker_collect_s": 0.01,
        "worker_gradient_s": 0.09,
        "learner_wait_s": 0.11,  # 10 ms of round trip
        "learner_apply_s": 0.002,
        "learner_weights_s": 0.003,
    }
    assert predict_sync(one_worker, 1, cores=2) == pytest.approx(0.115)
    assert predict_sync(one_worker, 2, cores=2) == pytest.approx(0.065)
    assert predict_sync(one_worker, 4, cores=2) == pytest.approx(0.065)  # no more cores: no more speed


def test_the_bf16_side_runs_with_reduced_precision_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ppo_vs_sb3, "TOTAL_FRAMES", 256)
    try:
        ppo_vs_sb3.run_ours(0, zoo=True, matmul_precision="medium")
    finally:
        set_matmul_precision("highest")
    config = json.loads((tmp_path / "runs" / "bench-ppo-zoo-bf16-0" / "config.json").read_text())
    assert config["run"]["matmul_precision"] == "medium"
    assert not (tmp_path / "runs" / "bench-ppo-zoo-0").exists()


def test_the_ieee_side_keeps_gradual_underflow_in_a_folder_of_its_own(tmp_path, monkeypatch):
    from benchmarks.common import side_options

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dqn_vs_sb3, "TOTAL_FRAMES", 256)
    try:
        dqn_vs_sb3.run_ours(0, zoo=True, **side_options("ours-zoo-ieee"))
        assert (torch.tensor([1e-39]) * 1.0).item() > 0.0  # not flushed
    finally:
        torch.set_flush_denormal(False)
    config = json.loads((tmp_path / "runs" / "bench-dqn-zoo-ieee-0" / "config.json").read_text())
    assert config["run"]["flush_denormal"] is False
    assert not (tmp_path / "runs" / "bench-dqn-zoo-0").exists()
    assert side_options("ours-zoo")["flush_denormal"] and not side_options("ours-zoo")["compile"]


def test_the_one_thread_sides_run_on_one_thread_in_a_folder_of_their_own(tmp_path, monkeypatch):
    from benchmarks.common import side_options

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ppo_vs_sb3, "TOTAL_FRAMES", 256)
    threads = torch.get_num_threads()
    try:
        ppo_vs_sb3.run_ours(0, zoo=True, **side_options("ours-zoo-1t"))
    finally:
        torch.set_num_threads(threads)
    config = json.loads((tmp_path / "runs" / "bench-ppo-zoo-1t-0" / "config.json").read_text())
    assert config["run"]["threads"] == 1
    assert not (tmp_path / "runs" / "bench-ppo-zoo-0").exists()
    assert "threads" not in side_options("ours-zoo") and "threads" not in side_options("ours-zoo-mkl")
