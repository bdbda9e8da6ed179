"""The run plumbing's own parts: range checks, the quiet helper, the evaluation and checkpoint schedules, and the
layering of the packages (no import circle, arrows one way)."""

import ast
from pathlib import Path

import pytest
import torch

from errors import InputError, check_ranges
from recipes import dqn, ppo
from training import quiet
from training.config import parse_env_kwargs
from training.evaluation import EVAL_SEED_OFFSET, EvaluationSchedule, evaluation_seed
from training.learner import MetricMeans, mean_metrics

ROOT = Path(__file__).parents[1]
LAYERS = {"errors": 0, "envs": 1, "agents": 2, "training": 3, "recipes": 4}


@pytest.mark.parametrize(
    "value, valid_range",
    [
        (1e-9, "> 0"),
        (0.0, ">= 0"),
        (1.0, "(0, 1]"),
        (0.0, "[0, 1]"),
        (0.5, "(0, 1)"),
        (-1.0, "< 0"),
        (None, "> 0"),
    ],
)
def test_check_ranges_accepts_values_inside(value, valid_range):
    check_ranges(option=(value, valid_range))


@pytest.mark.parametrize(
    "value, valid_range, message",
    [
        (0.0, "> 0", "--learning-rate must be > 0, got 0.0."),
        (-0.1, ">= 0", "--learning-rate must be >= 0, got -0.1."),
        (0.0, "(0, 1]", "--learning-rate must be in (0, 1], got 0.0."),
        (1.5, "[0, 1]", "--learning-rate must be in [0, 1], got 1.5."),
        (1.0, "[0, 1)", "--learning-rate must be in [0, 1), got 1.0."),
        (float("nan"), "> 0", "--learning-rate must be > 0, got nan."),
        (1e308, ">= 0", "--learning-rate is 1e+308, beyond float32 arithmetic (at most 3.4e+38)."),
    ],
)
def test_check_ranges_names_the_flag_the_range_and_the_value(value, valid_range, message):
    with pytest.raises(InputError) as error:
        check_ranges(learning_rate=(value, valid_range))
    assert str(error.value) == message


def test_check_ranges_reports_the_first_bad_option_and_refuses_unknown_range_syntax():
    with pytest.raises(InputError, match="--gamma"):
        check_ranges(lr=(1.0, "> 0"), gamma=(2.0, "(0, 1]"), tau=(5.0, "(0, 1]"))
    with pytest.raises(ValueError, match="Unknown range"):
        check_ranges(lr=(1.0, "positive"))


def test_config_validate_raises_what_main_would(tmp_path):
    config = dqn.DQNConfig()
    config.validate()
    config.buffer.beta = 2.0
    with pytest.raises(InputError, match=r"--beta must be in \[0, 1\], got 2.0"):
        config.validate()
    config = dqn.DQNConfig()
    config.run.threads = 10**6  # torch would try to start them all
    with pytest.raises(InputError, match="--threads must be 0 .* up to 1024, got 1000000"):
        config.validate()


def test_counts_beyond_64_bit_integers_are_refused():
    config = ppo.PPOConfig()
    config.optim.num_epochs = 5488135039273247178753  # a typo's epochs would run (and keep metrics) for ever
    with pytest.raises(InputError, match="--num-epochs is 5488135039273247178753, beyond 64-bit integers"):
        config.validate()
    config = ppo.PPOConfig()
    config.run.total_frames = 2**63
    with pytest.raises(InputError, match="--total-frames is 9223372036854775808, beyond 64-bit"):
        config.validate()
    config.run.total_frames = 2**63 - 1
    config.validate()


@pytest.mark.parametrize(
    ("assign", "message"),
    [
        (
            lambda c: setattr(c.optim, "learning_rate", 1e-2),
            r"OptimConfig has no option 'learning_rate'; its options: lr,",
        ),
        (
            lambda c: setattr(c.run, "total_frame", 10),
            r"RunConfig has no option 'total_frame' \(did you mean total_frames",
        ),
        (
            lambda c: setattr(c.optim, "num_epochs", 1.5),
            r"OptimConfig.num_epochs takes an integer, got 1.5 \(float\)",
        ),
        (
            lambda c: setattr(c.run, "total_frames", "2000"),
            r"RunConfig.total_frames takes an integer, got '2000'",
        ),
        (lambda c: setattr(c.run, "video", "False"), r"RunConfig.video takes True or False, got 'False'"),
        (lambda c: setattr(c.run, "seed", None), r"RunConfig.seed takes an integer, got None"),
        (
            lambda c: setattr(c.network, "hidden_sizes", 64),
            r"hidden_sizes takes a list, each item an integer, got 64",
        ),
        (lambda c: setattr(c.run, "output_dir", 5), r"RunConfig.output_dir takes a path or None, got 5"),
        (lambda c: setattr(c.run, "logger", 3), r"RunConfig.logger takes one of 'wandb', 'csv'"),
        (lambda c: setattr(c, "optim", {"lr": 1e-3}), r"PPOConfig.optim takes OptimConfig, got \{'lr'"),
        (lambda c: ppo.OptimConfig(num_epochs="4"), r"OptimConfig.num_epochs takes an integer, got '4'"),
    ],
)
def test_a_typo_or_a_value_of_the_wrong_type_in_a_config_is_refused_where_it_is_set(assign, message):
    config = ppo.PPOConfig()
    with pytest.raises(InputError, match=message):
        assign(config)
    config.validate()  # nothing was set


def test_configs_take_numpy_numbers_lists_for_tuples_and_text_for_paths():
    import numpy as np

    config = ppo.PPOConfig()
    config.run.total_frames, config.optim.lr, config.run.video = np.int64(4096), np.float32(1e-3), np.True_
    config.network.hidden_sizes, config.run.output_dir = [32, 32], "runs/x"
    config.run.stop_at_return = 5  # an integer where a number goes
    config.validate()


def test_the_default_target_is_the_evaluation_envs_and_only_where_episodes_can_reach_it():
    from training import RunConfig

    assert RunConfig().target_return == 475.0
    assert RunConfig(eval_env_id="CartPole-v0").target_return == 195.0  # 200-step episodes
    assert RunConfig(max_total_reward=100.0).target_return is None
    assert RunConfig(stop_at_return=float("inf")).target_return is None
    with pytest.raises(InputError, match="--stop-at-return -inf would stop at the first evaluation"):
        RunConfig(stop_at_return=-float("inf")).validate()


def test_more_threads_than_cores_warn():
    import os

    from training import RunConfig

    with pytest.warns(UserWarning, match=r"--threads \d+ is more than this machine's \d+ CPU cores"):
        RunConfig(threads=(os.cpu_count() or 1) + 1).validate()


def test_more_worker_processes_than_memory_holds_are_refused_and_more_than_cores_warn():
    import os

    from training import RunConfig
    from training.machine import WORKER_PROCESS_BYTES

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    too_many = memory // WORKER_PROCESS_BYTES + 1
    config = RunConfig(collector_backend="multiprocess", num_workers=too_many, num_envs=too_many)
    with pytest.raises(
        InputError, match=rf"--num-workers {too_many} would start {too_many} processes .* use at most"
    ):
        config.validate()
    cores = os.cpu_count() or 1
    with pytest.warns(
        UserWarning, match=rf"--num-workers {cores + 1} is more than this machine's {cores} CPU cores"
    ):
        RunConfig(collector_backend="multiprocess", num_workers=cores + 1, num_envs=cores + 1).validate()


def test_quiet_silences_a_config_and_sets_run_options(tmp_path):
    config = quiet(dqn.DQNConfig(), tmp_path, seed=7, num_envs=2)
    run = config.run
    assert (run.output_dir, run.logger, run.video, run.progress) == (tmp_path, "none", False, False)
    assert (run.seed, run.num_envs) == (7, 2)


def test_evaluation_schedule_skips_evaluations_a_large_batch_jumped_over(tmp_path):
    schedule = EvaluationSchedule(None, 100, 1, 0, None, tmp_path / "evaluations.csv", lambda metrics: None)
    assert [frames for frames in (50, 100, 150, 420, 450, 500) if schedule.due(frames)] == [100, 420, 500]
    assert evaluation_seed(3) == 3 + EVAL_SEED_OFFSET


def imports_of(path: Path) -> set[str]:
    """The project modules a file imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def project_modules() -> dict[str, Path]:
    modules = {"errors": ROOT / "errors.py"}
    for package in ("envs", "agents", "training", "recipes"):
        for path in (ROOT / package).glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def test_no_import_circle_and_no_import_against_the_layers():
    modules = project_modules()
    graph = {name: imports_of(path) & set(modules) for name, path in modules.items()}
    upward = [
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if LAYERS[target.split(".")[0]] > LAYERS[name.split(".")[0]]
    ]
    assert not upward, (
        f"imports against the layering errors <- envs <- agents <- training <- recipes: {upward}"
    )
    visiting, done = set(), set()

    def visit(name, path):
        if name in visiting:
            raise AssertionError(f"import circle: {' -> '.join([*path, name])}")
        if name in done:
            return
        visiting.add(name)
        for target in sorted(graph[name]):
            visit(target, [*path, name])
        visiting.discard(name)
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_plumbing_modules_stay_small():
    sizes = {path.name: len(path.read_text().splitlines()) for path in (ROOT / "training").glob("*.py")}
    assert max(sizes.values()) <= 400, sizes


def test_env_kwargs_are_parsed_as_json_where_they_parse():
    assert parse_env_kwargs(("continuous=true", "gravity=-9.5", "map_name=8x8", "sizes=[1, 2]", "name=")) == {
        "continuous": True,
        "gravity": -9.5,
        "map_name": "8x8",
        "sizes": [1, 2],
        "name": "",
    }
    for bad, message in (("continuous", "KEY=VALUE"), ("1x=2", "KEY=VALUE"), ("a=1 a=2", None)):
        items = tuple(bad.split()) if message is None else (bad,)
        with pytest.raises(InputError, match=message or "gives a twice"):
            parse_env_kwargs(items)
    for number in ("-1e400", "NaN", "Infinity", "[1, -Infinity]", '{"g": NaN}'):
        with pytest.raises(InputError, match=r"--env-kwargs g=.*is not a finite number"):
            parse_env_kwargs((f"g={number}",))
    assert parse_env_kwargs(('g="NaN"', "h=1e308")) == {"g": "NaN", "h": 1e308}


@pytest.mark.parametrize("value", ["-1", "0", "true", "2.5", '"100"'])
def test_a_time_limit_in_env_kwargs_is_a_whole_number_of_steps(value):
    from training import RunConfig

    with pytest.raises(
        InputError, match=r"--env-kwargs max_episode_steps=.*a whole number of steps, at least 1"
    ):
        RunConfig(env_id="CartPole-v1", env_kwargs=(f"max_episode_steps={value}",)).validate()
    with pytest.raises(InputError, match="gymnasium.make's disable_env_checker is true, false or null"):
        RunConfig(env_id="CartPole-v1", env_kwargs=("disable_env_checker=1",)).validate()
    RunConfig(env_id="CartPole-v1", env_kwargs=("max_episode_steps=7", "disable_env_checker=true")).validate()
    RunConfig(env_id="CartPole-v1", env_kwargs=("disable_env_checker=null",)).validate()


def test_env_kwargs_reach_the_training_envs_the_workers_and_the_saved_agent(tmp_path):
    from agents import Agent
    from recipes import qlearning, sac

    config = quiet(
        sac.SACConfig(), tmp_path / "sac", env_id="LunarLander-v3", env_kwargs=("continuous=true",)
    )
    config.run.total_frames, config.run.eval_every, config.run.eval_episodes = 300, 300, 1
    config.collector.learning_starts = 100
    sac.main(config)
    agent = Agent.load(tmp_path / "sac")
    assert agent.env_kwargs == {"continuous": True} and agent.action_space.shape == (2,)
    assert agent.evaluate(episodes=1, seed=0).returns.shape == (1,)  # its own env is made continuous again
    config = quiet(
        qlearning.QLearningConfig(),
        tmp_path / "q",
        env_id="FrozenLake-v1",
        env_kwargs=("map_name=8x8",),
        collector_backend="multiprocess",
        num_envs=4,
        total_frames=512,
        eval_every=512,
        eval_episodes=2,
    )
    qlearning.main(config)
    assert Agent.load(tmp_path / "q").observation_space.n == 64  # the 8x8 map, on both worker processes


@pytest.mark.parametrize("length, size, batches", [(256, 256, 3), (100, 32, 10), (64, 64, 1)])
def test_epoch_minibatches_match_torchrl_sampler_without_replacement(length, size, batches):
    # the same minibatches, from the same draws, as a replay buffer refilled with each batch
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer

    from training import EpochMinibatches

    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(length), sampler=SamplerWithoutReplacement(drop_last=True), batch_size=size
    )
    minibatches = EpochMinibatches(size)
    count = 3 * (length // size)
    for batch_index in range(batches):
        items = TensorDict({"x": torch.arange(length) + 1000 * batch_index}, [length])
        torch.manual_seed(batch_index)
        buffer.extend(items)
        expected = [buffer.sample()["x"] for _ in range(count)]
        torch.manual_seed(batch_index)
        got = [minibatch["x"] for minibatch in minibatches(items, count)]
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
        for epoch in range(3):  # each epoch draws every item at most once
            drawn = torch.cat(got[epoch * (length // size) : (epoch + 1) * (length // size)])
            assert len(drawn.unique()) == len(drawn) == size * (length // size)


@pytest.mark.parametrize("shape", [(48,), (48, 2)])
def test_epoch_minibatches_are_what_indexing_the_items_gives(shape):
    import math

    import torch
    from tensordict import TensorDict

    from training import EpochMinibatches

    items = TensorDict(
        {
            "x": torch.randn(*shape, 3),
            "flag": torch.rand(*shape, 1) < 0.5,
            "nested": TensorDict({"y": torch.arange(2 * math.prod(shape)).reshape(*shape, 2)}, shape),
        },
        shape,
    )
    lazy = TensorDict.lazy_stack(list(items.unbind(0)))  # not plain: TensorDict's own indexing
    for source in (items, lazy):
        torch.manual_seed(3)
        minibatches = list(EpochMinibatches(16)(source, 6))
        torch.manual_seed(3)
        permutations = [torch.randperm(shape[0]) for _ in range(3)]
        for number, minibatch in enumerate(minibatches):
            index = permutations[number // 3][(number % 3) * 16 : (number % 3 + 1) * 16]
            expected = items[index]
            assert minibatch.batch_size == expected.batch_size
            assert set(minibatch.keys(True, True)) == set(expected.keys(True, True))
            for key in expected.keys(True, True):
                assert torch.equal(minibatch[key], expected[key]), key


def test_epoch_minibatches_resume_where_they_stopped_and_refuse_bad_state():
    import torch
    from tensordict import TensorDict

    from training import EpochMinibatches

    items = TensorDict({"x": torch.arange(96)}, [96])
    torch.manual_seed(0)
    whole = EpochMinibatches(32)
    expected = [m["x"] for m in whole(items, 4)] + [m["x"] for m in whole(items, 4)]
    torch.manual_seed(0)
    first = EpochMinibatches(32)
    got = [m["x"] for m in first(items, 4)]
    state, rng = first.state_dict(), torch.get_rng_state()
    resumed = EpochMinibatches(32)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    got += [m["x"] for m in resumed(items, 4)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    with pytest.raises(ValueError, match="permutation"):
        resumed.load_state_dict({"pending": torch.zeros(200, dtype=torch.int64), "length": 96})
    with pytest.raises(ValueError, match="cannot fill"):
        next(iter(EpochMinibatches(128)(items, 1)))


def test_mean_metrics_averages_each_metric_over_the_steps():
    steps = [{"loss": torch.tensor(float(i)), "alpha": torch.tensor(0.5 * i)} for i in range(1, 4)]
    assert mean_metrics(steps, "train/") == {"train/loss": 2.0, "train/alpha": 1.0}
    assert mean_metrics(steps[:1]) == {"loss": 1.0, "alpha": 0.5}
    # a metric of several values (an add-on's): the mean of all of them, as before
    vector = [{"loss": torch.tensor(1.0), "error": torch.tensor([1.0, 3.0])} for _ in range(2)]
    assert mean_metrics(vector) == {"loss": 1.0, "error": 2.0}
    assert mean_metrics([]) == {}


def test_metric_means_keep_one_running_total_and_start_afresh_after_each_result():
    means = MetricMeans("train/")
    assert means.result() == {}
    for i in range(1, 10_001):  # a batch of many gradient steps: the total, not the steps, is kept
        means.add({"loss": torch.tensor(float(i)), "error": torch.tensor([0.0, 2.0 * i])})
    assert means._count == 10_000 and means._total.shape == (2,)
    assert means.result() == pytest.approx({"train/loss": 5000.5, "train/error": 5000.5})
    means.add({"loss": torch.tensor(3.0), "error": torch.tensor([1.0])})
    assert means.result() == {"train/loss": 3.0, "train/error": 1.0}
    assert means.result() == {}


@pytest.fixture
def torch_threads():
    """The test may change torch's thread count and the record of the count before any run: both come back."""
    import training.seeding

    before, recorded = torch.get_num_threads(), training.seeding._threads_before_runs
    yield
    torch.set_num_threads(before)
    training.seeding._threads_before_runs = recorded


def test_threads_0_gives_torchs_count_back_after_a_one_thread_run_in_the_same_process(torch_threads):
    import training.seeding
    from training.seeding import set_threads

    training.seeding._threads_before_runs = None
    torch.set_num_threads(2)  # the process's own count
    set_threads(1)
    assert torch.get_num_threads() == 1
    set_threads(0)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(2)
    training.seeding._threads_before_runs = None
    set_threads(0)  # no run set a count: left alone
    assert torch.get_num_threads() == 2


def test_image_observations_take_torchs_threads_unless_the_count_was_chosen(torch_threads):
    from torchrl.data import Bounded, Composite

    import training.seeding
    from training.seeding import set_threads, threads_for_observations

    training.seeding._threads_before_runs = None
    torch.set_num_threads(2)  # the process's own count
    image = Bounded(0, 255, (4, 36, 40, 3), dtype=torch.uint8)  # four envs' channels-last frames
    vector = Bounded(-1.0, 1.0, (4, 3))
    cases = [  # observation spec, who chose the threads, threads the run ends with
        (image, None, 0),
        (Composite(pixels=image, position=vector, shape=(4,)), None, 0),  # a Dict holding an image
        (vector, None, 1),  # small vector networks: the recipe's one thread
        (image, "given", 1),  # --threads 1 on the command line or in Python
        (image, "preset", 1),
    ]
    for spec, chosen_by, expected in cases:
        config = ppo.PPOConfig()
        if chosen_by == "given":
            config.run.threads = 1
        if chosen_by == "preset":
            config.run.preset_applied = {"name": "x", "source": "y", "set": {"threads": 1}, "for": []}
        set_threads(config.run.threads)
        threads_for_observations(config.run, spec)
        assert config.run.threads == expected, (spec, chosen_by)
        assert torch.get_num_threads() == (2 if expected == 0 else 1)
        assert ("threads" in config.run.assigned) == (chosen_by == "given")  # the rule's count is no user's
