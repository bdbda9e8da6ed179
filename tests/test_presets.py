"""Presets: every table of every recipe loads and validates; the env's preset fills in what was not given; options
given on the command line or set in Python win; --preset none and --preset NAME; bad preset files and names are
one-line errors; what applied is in config.json and on the first line of the run; reward normalisation."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import interrupt_at

from agents import RewardNormalizer
from errors import InputError
from recipes import a2c, dqn, ppo, qlearning, sac
from training import quiet
from training.presets import apply_preset, find_preset, mark_given, read_presets

ROOT = Path(__file__).parents[1]
RECIPES = ["ppo", "a2c", "dqn", "sac", "td3", "ddpg", "reinforce", "vpg", "rnd_ppo", "qlearning", "es"]


def config_type(module):
    return next(
        value
        for name, value in vars(module).items()
        if name.endswith("Config")
        and getattr(value, "__module__", "") == module.__name__
        and "run" in getattr(value, "__dataclass_fields__", {})
    )


@pytest.mark.parametrize("name", RECIPES)
def test_every_preset_loads_names_its_source_and_validates(name):
    module = importlib.import_module(f"recipes.{name}")
    presets = read_presets(module.PRESETS)
    assert presets, f"{name} has no presets"
    for preset in presets.values():
        assert preset.source
        config = config_type(module)()
        config.run.preset = preset.name
        if not preset.is_pattern:
            config.run.env_id = preset.env_id
            config.run.env_kwargs = tuple(
                f"{key}={json.dumps(value)}" for key, value in preset.env_kwargs.items()
            )
        record = apply_preset(config, module.PRESETS)
        assert record["name"] == preset.name and set(record["set"]) == set(preset.options)
        config.validate()  # every value fits its option's range


def test_issue_coverage_of_presets():
    """The (recipe, env) pairs README promises a preset for."""
    wanted = {
        "ppo": ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
                "LunarLander-v3", ("LunarLander-v3", {"continuous": True}), "BipedalWalker-v3", "HalfCheetah-v5",
                "Hopper-v5", "Walker2d-v5", "Ant-v5", "ALE/Pong-v5", "ALE/Breakout-v5"],
        "a2c": ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
                "LunarLander-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"],
        "dqn": ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3", "ALE/Pong-v5", "ALE/Breakout-v5"],
        "sac": ["Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0", ("LunarLander-v3", {"continuous": True}),
                "BipedalWalker-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"],
        "td3": ["Pendulum-v1", "MountainCarContinuous-v0", ("LunarLander-v3", {"continuous": True}),
                "BipedalWalker-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"],
        "ddpg": ["Pendulum-v1", "MountainCarContinuous-v0", ("LunarLander-v3", {"continuous": True}),
                 "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"],
        "qlearning": ["Taxi-v4", "FrozenLake-v1", "CliffWalking-v1", "MountainCar-v0"],
    }  # fmt: skip
    for name, envs in wanted.items():
        presets = read_presets(importlib.import_module(f"recipes.{name}").PRESETS)
        for env in envs:
            env_id, env_kwargs = env if isinstance(env, tuple) else (env, {})
            assert find_preset(presets, env_id, env_kwargs) is not None, (name, env)


def test_ant_without_contact_forces_gets_its_own_ppo_table():
    presets = read_presets(ppo.PRESETS)
    assert find_preset(presets, "Ant-v5", {}).name == "Ant-v5"
    assert (
        find_preset(presets, "Ant-v5", {"include_cfrc_ext_in_observation": False}).name
        == "Ant-v5 without contact forces"
    )
    assert find_preset(presets, "Ant-v5", {"include_cfrc_ext_in_observation": True}) is None


def test_the_envs_preset_fills_only_the_options_the_user_left_alone(output_dir):
    config = ppo.PPOConfig(optim=ppo.OptimConfig(minibatch_size=64))  # given, at the default's value: wins
    config.run.env_id = "LunarLander-v3"
    config.optim.lr = 1e-3  # set in Python: wins
    config.loss.gamma = 0.99  # assigned, at the default's value: wins over the preset's 0.999
    record = apply_preset(config, ppo.PRESETS)
    assert record["name"] == "LunarLander-v3" and record["source"].startswith("RL Zoo")
    assert config.optim.lr == 1e-3 and config.loss.gamma == 0.99 and config.optim.minibatch_size == 64
    assert not {"lr", "gamma", "minibatch_size"} & set(record["set"])
    assert (
        config.run.num_envs == 16
        and config.collector.steps_per_env == 1024
        and config.loss.gae_lambda == 0.98
    )
    assert record["set"]["gae_lambda"] == 0.98 and record["set"]["entropy_coef"] == 0.01
    assert not config.loss.assigned - {"gamma"}  # what the preset set is not counted as the user's


def test_options_given_on_the_command_line_win_even_at_the_default_value():
    config = ppo.PPOConfig(loss=ppo.LossConfig(gamma=0.99))
    config.run.env_id = "LunarLander-v3"
    mark_given(
        config, {"env_id", "gamma"}
    )  # a parser passes every field; --gamma 0.99 was on the command line
    apply_preset(config, ppo.PRESETS)
    assert config.loss.gamma == 0.99 and config.run.num_envs == 16 and config.loss.gae_lambda == 0.98


def test_preset_none_a_named_preset_and_an_unknown_name():
    config = ppo.PPOConfig()
    config.run.env_id, config.run.preset = "LunarLander-v3", "none"
    assert apply_preset(config, ppo.PRESETS)["name"] is None
    assert config.run.num_envs == 1 and config.optim.lr == 3e-4  # the generic defaults
    config = ppo.PPOConfig()
    config.run.env_id, config.run.preset = "Acrobot-v1", "CartPole-v1"
    assert apply_preset(config, ppo.PRESETS)["name"] == "CartPole-v1" and config.optim.lr == 2e-3
    config.run.preset = "Hopper"
    with pytest.raises(InputError, match="not a preset of this recipe.*Hopper-v5"):
        apply_preset(config, ppo.PRESETS)


def test_env_kwargs_choose_the_preset_exactly():
    presets = read_presets(ppo.PRESETS)
    assert find_preset(presets, "LunarLander-v3", {}).name == "LunarLander-v3"
    assert find_preset(presets, "LunarLander-v3", {"continuous": True}).name == "LunarLanderContinuous"
    assert find_preset(presets, "LunarLander-v3", {"continuous": True, "gravity": -9.0}) is None
    assert find_preset(presets, "ALE/Breakout-v5", {}).name == "atari"  # a pattern
    assert find_preset(presets, "MyEnv-v0", {}) is None
    # Gymnasium's module:EnvId form: the module registers the env, whose preset it gets
    assert find_preset(presets, "gymnasium:LunarLander-v3", {}).name == "LunarLander-v3"
    assert find_preset(presets, "ale_py:ALE/Breakout-v5", {}).name == "atari"
    assert find_preset(presets, "mypackage:MyEnv-v0", {}) is None


def test_an_env_without_preset_gets_the_generic_defaults():
    config = sac.SACConfig()
    config.run.env_id = "InvertedPendulum-v5"
    assert apply_preset(config, sac.PRESETS)["name"] is None
    assert config.network.hidden_sizes == (256, 256) and config.optim.lr == 3e-4
    assert config.buffer.batch_size == 256 and config.collector.learning_starts == 10_000


@pytest.mark.parametrize("name", ["sac", "td3", "ddpg"])
def test_off_policy_recipes_keep_torchs_threads_for_large_networks_and_one_for_small_ones(name):
    module = importlib.import_module(f"recipes.{name}")
    threads = {}
    for env_id in ("InvertedDoublePendulum-v5", "HalfCheetah-v5", "Pendulum-v1"):  # none, 256/400x300, 64x64
        config = config_type(module)()
        config.run.env_id = env_id
        apply_preset(config, module.PRESETS)
        threads[env_id] = config.run.threads
    assert threads == {"InvertedDoublePendulum-v5": 0, "HalfCheetah-v5": 0, "Pendulum-v1": 1}
    config = config_type(module)()
    config.run.env_id, config.run.threads = "Pendulum-v1", 0  # the user's choice wins over the preset's one
    mark_given(config, {"env_id", "threads"})
    apply_preset(config, module.PRESETS)
    assert config.run.threads == 0
    if name == "sac":  # discrete SAC's 128-unit networks: one thread, on any discrete env
        assert sac.apply_discrete_settings(sac.SACConfig()).run.threads == 1
        assert sac.apply_discrete_settings(sac.SACConfig(), keep={"threads"}).run.threads == 0


def test_a_reused_config_takes_the_new_envs_preset():
    config = dqn.DQNConfig()
    apply_preset(config, dqn.PRESETS)  # CartPole-v1
    assert config.network.hidden_sizes == (128, 128)
    config.buffer.batch_size = 256  # the user's own setting survives the switch
    config.run.env_id = "MountainCar-v0"
    record = apply_preset(config, dqn.PRESETS)
    assert record["name"] == "MountainCar-v0"
    assert (
        config.network.hidden_sizes == (256, 256)
        and config.optim.lr == 4e-3
        and config.buffer.batch_size == 256
    )
    config.run.env_id = "Taxi-v4"  # no preset: CartPole's and MountainCar's settings are gone
    apply_preset(config, dqn.PRESETS)
    assert (
        config.network.hidden_sizes == (64, 64)
        and config.optim.lr == 1e-4
        and config.buffer.batch_size == 256
    )
    for forged in ({"for": ["CartPole-v1"], "set": 3}, ["CartPole-v1"], {"set": {}}):
        config.run.assign("preset_applied", forged)  # as a damaged resume.ckpt would hand it over
        with pytest.raises(InputError, match="run.preset_applied holds .*, not a record of a preset"):
            apply_preset(config, dqn.PRESETS)
    with pytest.raises(InputError, match="RunConfig.preset_applied takes dict or None, got"):
        config.run.preset_applied = ["CartPole-v1"]  # set in Python: refused where it is set


def test_qlearning_mountain_car_runs_with_nothing_but_the_env_id():
    config = qlearning.QLearningConfig()
    config.run.env_id = "MountainCar-v0"
    apply_preset(config, qlearning.PRESETS)
    assert config.table.grid_size == 20 and config.run.env_backend == "torch"
    config.validate()


def test_bad_preset_files_are_one_line_errors(tmp_path):
    config = a2c.A2CConfig()
    cases = {
        '["CartPole-v1"]\nsource = "x"\nlearning_rate = 1e-3\n': "learning_rate.*not an option",
        '["CartPole-v1"]\nsource = "x"\nlr = "fast"\n': "sets lr: 'fast' is not a number",
        '["CartPole-v1"]\nsource = "x"\nlr = 1'
        + "0" * 400
        + "\n": r"sets lr: 1000.* \(401 digits\) is beyond the float range",
        '["CartPole-v1"]\nlr = 1e-3\n': "has no source",
        '["CartPole-v1"\nsource = "x"\n': "Could not read the preset file",
        '["CartPole-v1"]\nsource = "x"\noptimizer = "sgd"\n': "not one of 'rmsprop', 'adam'",
    }
    for text, message in cases.items():
        path = tmp_path / "presets.toml"
        path.write_text(text)
        fresh = a2c.A2CConfig()
        with pytest.raises(InputError, match=message):
            apply_preset(fresh, path)
    assert config.optim.lr == a2c.A2CConfig().optim.lr


def test_config_json_and_the_first_line_say_what_the_preset_set(tmp_path):
    output_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "recipes.dqn", "--total-frames", "256", "--eval-every", "256", "--eval-episodes",
         "1", "--learning-starts", "64", "--lr", "1e-4", "--no-progress", "--no-video", "--logger", "none",
         "--output-dir", str(output_dir)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert (
        first.startswith("preset CartPole-v1 (this project's tuning") and "hidden_sizes=[128, 128]" in first
    )
    applied = json.loads((output_dir / "config.json").read_text())["run"]["preset_applied"]
    assert (
        applied["name"] == "CartPole-v1"
        and "lr" not in applied["set"]
        and "total_frames" not in applied["set"]
    )
    assert applied["set"]["batch_size"] == 128
    # the run resumes with its saved options and does not apply the preset again
    config = json.loads((output_dir / "config.json").read_text())
    assert config["optim"]["lr"] == 1e-4 and config["network"]["hidden_sizes"] == [128, 128]


def list_presets(recipe, *arguments):
    """What ``python -m recipes.RECIPE --list-presets ARGUMENTS`` prints (it must succeed)."""
    result = subprocess.run(
        [sys.executable, "-m", f"recipes.{recipe}", "--list-presets", *arguments],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_list_presets_prints_every_table_with_its_source():
    result = list_presets("sac")
    for name in read_presets(sac.PRESETS):
        assert f"\n{name}" in result.stdout
    assert "--hidden-sizes 400 300" in result.stdout and "source: RL Zoo" in result.stdout


def test_reward_normalizer_divides_by_the_std_of_the_discounted_return():
    normalizer = RewardNormalizer(num_envs=2, gamma=0.5)
    reward = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 2.0]]).unsqueeze(-1)
    done = torch.tensor([[False, True, False], [False, False, False]]).unsqueeze(-1)
    scaled = normalizer(reward, done)
    returns = torch.tensor([1.0, 1.5, 1.0, 2.0, 1.0, 2.5], dtype=torch.float64)  # reset after the done
    std = torch.sqrt(returns.var(unbiased=False) + 1e-8)
    torch.testing.assert_close(scaled, (reward / std).float())
    assert normalizer.returns.tolist() == [1.0, 2.5]  # carried into the next batch
    # statistics and running returns are buffers: they travel with the training state
    restored = RewardNormalizer(num_envs=2, gamma=0.5)
    restored.load_state_dict(normalizer.state_dict())
    torch.testing.assert_close(restored(reward, done), normalizer(reward, done))
    with pytest.raises(ValueError, match="envs=2"):
        normalizer(torch.zeros(3, 4, 1), torch.zeros(3, 4, 1, dtype=torch.bool))


def test_ppo_with_reward_normalization_and_clipped_values_resumes_exactly(output_dir, tmp_path, monkeypatch):
    """The reward statistics are part of resume.ckpt: a run split in two equals the run in one piece."""

    def config(directory):
        return quiet(
            ppo.PPOConfig(), directory, env_id="Pendulum-v1", total_frames=2_048, eval_every=1_024, eval_episodes=2,
            num_envs=4, preset="none",
        )  # fmt: skip

    def tune(config):
        config.collector.steps_per_env, config.optim.minibatch_size = 128, 128
        config.loss.normalize_reward, config.loss.clip_value, config.optim.critic_lr = True, 0.2, 1e-3
        return config

    whole = ppo.main(tune(config(tmp_path / "whole")))
    split = tune(config(output_dir))
    split.run.checkpoint_every = 1_024
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        ppo.main(split)
    resumed = tune(config(output_dir))
    resumed.run.resume = output_dir
    result = ppo.main(resumed)
    assert result["eval_return_mean"] == whole["eval_return_mean"]


def test_an_error_about_options_the_user_never_typed_names_the_preset_that_set_them(tmp_path):
    config = quiet(ppo.PPOConfig(), tmp_path, env_id="CartPole-v1", num_envs=2)  # the preset: 16 steps, 256
    with pytest.raises(InputError) as error:
        ppo.main(config)
    assert str(error.value) == (
        "--minibatch-size 256 exceeds the 32 frames per batch (--num-envs 2 x --steps-per-env 16; the preset "
        "CartPole-v1 set --minibatch-size, --steps-per-env): lower --minibatch-size or raise --num-envs or "
        "--steps-per-env."
    )
    config = quiet(ppo.PPOConfig(), tmp_path, env_id="CartPole-v1", num_envs=2, preset="none")
    config.optim.minibatch_size = 8192
    with pytest.raises(InputError, match=r"\(--num-envs 2 x --steps-per-env 2048\): lower"):
        ppo.main(config)
    config = quiet(qlearning.QLearningConfig(), tmp_path, env_id="MountainCar-v0", total_frames=600)
    with pytest.raises(
        InputError,
        match=r"--num-envs 4096 is more than --total-frames 600; the preset MountainCar-v0 set --num-envs:",
    ):
        qlearning.main(config)


def test_errors_in_a_preset_file_name_that_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('["X"]\nsource = "x"\nlrr = 1e-3\n')
    config = a2c.A2CConfig()
    config.run.preset_file, config.run.preset = path, "X"
    with pytest.raises(InputError, match=f"{path}: preset 'X' sets 'lrr', which is not an option"):
        apply_preset(config, a2c.PRESETS)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("overwrite", True),
        ("output_dir", "elsewhere"),
        ("env_wrappers", ["os.system"]),
        ("allow_wrappers", ["os"]),
        ("eval_env_id", "mymodule:Env-v0"),
        ("gradient_worker", 0),
        ("seed", 3),
        ("device", "cuda"),
        ("resume", "runs/x"),
        ("preset", "none"),
    ],
)
def test_a_preset_file_cannot_set_what_the_run_is_or_where_it_writes(tmp_path, option, value):
    path = tmp_path / "theirs.json"
    path.write_text(json.dumps({"CartPole-v1": {"source": "x", "lr": 1e-3, option: value}}))
    config = ppo.PPOConfig()
    config.run.preset_file = path
    with pytest.raises(
        InputError, match=rf"preset 'CartPole-v1' sets '{option}'.* give --{option.replace('_', '-')}"
    ):
        apply_preset(config, ppo.PRESETS)
    assert config.run.overwrite is False and config.optim.lr == ppo.PPOConfig().optim.lr


def test_the_run_options_a_preset_may_set_are_options_every_recipe_shares():
    from training.config import RunConfig
    from training.presets import RUN_OPTIONS

    assert RUN_OPTIONS < set(RunConfig.__dataclass_fields__)  # the built-in presets' use is checked above


def test_list_presets_flags_a_preset_a_run_would_refuse(tmp_path):
    path = tmp_path / "theirs.toml"
    path.write_text('["mine"]\nenv_id = "CartPole-v1"\nsource = "x"\noverwrite = true\n')
    result = list_presets("ppo", "--preset-file", str(path))
    assert "REFUSED (a run with it stops)" in result.stdout and "sets 'overwrite'" in result.stdout
    assert result.stdout.count("REFUSED") == 1  # the built-in presets are fine


def test_an_empty_preset_file_is_refused_and_an_upper_case_json_suffix_is_json(tmp_path):
    for name, text in (("empty.toml", ""), ("empty.json", "{}")):
        (tmp_path / name).write_text(text)
        with pytest.raises(InputError, match="holds no presets"):
            read_presets(tmp_path / name)
    path = tmp_path / "BEST.JSON"
    path.write_text(json.dumps({"mine": {"source": "x", "env_id": "CartPole-v1", "lr": 1e-3}}))
    assert read_presets(path)["mine"].options == {"lr": 1e-3}


def test_a_preset_file_table_named_as_a_built_in_one_hides_it_only_by_name(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('["CartPole-v1"]\nenv_id = "Acrobot-v1"\nsource = "mine"\nlr = 0.123\n')
    records = {}
    for env_id, preset in (("CartPole-v1", "auto"), ("Acrobot-v1", "auto"), ("Pendulum-v1", "CartPole-v1")):
        config = a2c.A2CConfig()
        config.run.env_id, config.run.preset, config.run.preset_file = env_id, preset, path
        records[env_id] = apply_preset(config, a2c.PRESETS)
    assert records["CartPole-v1"]["source"] != "mine"  # the recipe's own CartPole preset still applies
    assert records["Acrobot-v1"]["source"] == "mine" and records["Acrobot-v1"]["set"]["lr"] == 0.123
    assert records["Pendulum-v1"]["source"] == "mine"  # by name: the file's table


def test_a_config_s_preset_skips_are_left_alone():
    plain, gsde = sac.SACConfig(), sac.SACConfig()
    for config in (plain, gsde):
        config.run.env_id = "Hopper-v5"
    gsde.network.use_sde = True  # a gSDE policy replaces the tanh-normal head the Hopper preset shapes
    apply_preset(plain, sac.PRESETS)
    apply_preset(gsde, sac.PRESETS)
    assert plain.network.log_std_bounds == (-20.0, 2.0) and plain.loss.log_prob_epsilon == 1e-6
    assert gsde.network.log_std_bounds is None and gsde.loss.log_prob_epsilon == 0.0
    assert {"log_std_bounds", "log_prob_epsilon"}.isdisjoint(gsde.run.preset_applied["set"])
    assert gsde.run.preset_applied["set"]["learning_starts"] == 10_000
    gsde.validate()
