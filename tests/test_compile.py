"""--compile: the compiled loss and collection policy compute what the eager ones do, from the same random draws."""

import importlib

import pytest
import torch
from torch._inductor.exc import InvalidCxxCompiler
from torchrl.envs.utils import ExplorationType, set_exploration_type

import agents
from agents import make_actor, make_q_actor
from agents.fast_paths import LeanActor, LeanQPolicy, check_compile, lean_policy
from envs import make_env
from errors import InputError
from training import RunConfig, quiet

# recipe: (env, its config's fields for a few updates in a few hundred frames)
RUNS = {
    "ppo": (
        "Pendulum-v1",
        {"collector.steps_per_env": 32, "optim.minibatch_size": 64, "optim.num_epochs": 2},
    ),
    "a2c": ("CartPole-v1", {"collector.steps_per_env": 8}),
    "rnd_ppo": (
        "CartPole-v1",
        {"collector.steps_per_env": 32, "optim.minibatch_size": 64, "optim.num_epochs": 2},
    ),
    "reinforce": ("CartPole-v1", {}),
    "vpg": ("CartPole-v1", {}),
    "dqn": ("CartPole-v1", {"collector.learning_starts": 128, "collector.steps_per_env": 8}),
    "sac": ("Pendulum-v1", {"collector.learning_starts": 128, "network.hidden_sizes": (32, 32)}),
    "td3": ("Pendulum-v1", {"collector.learning_starts": 128, "network.hidden_sizes": (32, 32)}),
    "ddpg": ("Pendulum-v1", {"collector.learning_starts": 128, "network.hidden_sizes": (32, 32)}),
}
CONFIG_CLASSES = {"rnd_ppo": "RNDPPOConfig", "reinforce": "ReinforceConfig"}


def run(recipe: str, output_dir, compile: bool) -> None:
    module = importlib.import_module(f"recipes.{recipe}")
    config = getattr(module, CONFIG_CLASSES.get(recipe, f"{recipe.upper()}Config"))()
    env_id, fields = RUNS[recipe]
    quiet(config, output_dir, env_id=env_id, num_envs=4, total_frames=512, eval_every=512, eval_episodes=2)
    config.run.preset, config.run.compile, config.run.stop_at_return = "none", compile, float("inf")
    for path, value in fields.items():
        group, name = path.split(".")
        setattr(getattr(config, group), name, value)
    module.main(config)


def loss_terms(output) -> dict[str, torch.Tensor]:
    """The tensors a loss returns: a TensorDict's entries, or a (loss, metadata) pair's loss and metadata."""
    if isinstance(output, tuple):
        loss, metadata = output
        return {"loss": loss} | dict(metadata.items())
    return dict(output.items())


@pytest.mark.parametrize("recipe", RUNS)
def test_the_compiled_loss_of_each_recipe_returns_the_eager_losses_and_gradients(
    recipe, tmp_path, monkeypatch
):
    """Every loss call of a short --compile run is checked against the eager loss on the same batch and random
    draws: the same outputs and the same gradients of the summed loss terms; the run trains on the compiled one."""
    checked = []

    def checking(function, enabled):
        assert enabled  # the run's --compile reaches the recipe's call
        compiled_function = agents.compiled(function)
        owner = getattr(function, "__self__", function)
        parameters = [p for p in owner.parameters() if p.requires_grad]

        def call(batch):
            state = torch.get_rng_state()  # the same draws (TD3's target noise, SAC's actions) for each call
            expected = loss_terms(function(batch.clone()))
            torch.set_rng_state(state)
            result = loss_terms(compiled_function(batch.clone()))
            assert result.keys() == expected.keys()
            for key, value in expected.items():
                torch.testing.assert_close(result[key], value, rtol=1e-4, atol=1e-5)
            losses = [
                key for key, value in expected.items() if key.startswith("loss") and value.requires_grad
            ]
            gradients = [
                torch.autograd.grad(sum(terms[key] for key in losses), parameters, allow_unused=True)
                for terms in (expected, result)
            ]
            for eager_gradient, compiled_gradient in zip(*gradients, strict=True):
                if eager_gradient is None:
                    assert compiled_gradient is None
                else:
                    torch.testing.assert_close(compiled_gradient, eager_gradient, rtol=1e-4, atol=1e-5)
            checked.append(recipe)
            torch.set_rng_state(state)
            return compiled_function(batch)  # what the run trains on

        return call

    monkeypatch.setattr(f"recipes.{recipe}.compiled", checking)
    run(recipe, tmp_path, compile=True)
    assert len(checked) >= 2


@pytest.mark.parametrize("squash", [False, True])  # the direct Gaussian draw, the direct tanh-normal draw
def test_the_compiled_lean_actor_samples_what_the_eager_one_samples(squash):
    env = make_env("Pendulum-v1", num_envs=4, seed=0)
    actor = make_actor(
        env.observation_spec["observation"], env.action_spec, squash=squash, normalize_obs=True
    )
    eager, compiled = lean_policy(actor), lean_policy(actor, compile=True)
    assert isinstance(compiled, LeanActor) and list(compiled.parameters()) == list(actor.parameters())
    step = env.reset()
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        for _ in range(2):  # the second call runs the compiled code without compiling
            seed = torch.seed()
            expected = eager(step.clone())
            torch.manual_seed(seed)
            result = compiled(step.clone())
            for key in expected.keys(True, True):
                torch.testing.assert_close(result[key], expected[key], msg=key)
    env.close()


def test_the_compiled_lean_q_policy_explores_as_the_eager_one():
    env = make_env("CartPole-v1", num_envs=64, seed=0)
    policy = make_q_actor(env.observation_spec["observation"], env.action_spec, epsilon=0.5)
    eager, compiled = lean_policy(policy), lean_policy(policy, compile=True)
    assert isinstance(compiled, LeanQPolicy) and compiled.state_dict().keys() == eager.state_dict().keys()
    step = env.reset()
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        seed = torch.seed()
        expected = eager(step.clone())
        torch.manual_seed(seed)
        result = compiled(step.clone())
    assert torch.equal(result["action"], expected["action"])
    torch.testing.assert_close(result["action_value"], expected["action_value"])
    env.close()


def test_compile_without_a_cpp_compiler_is_refused_in_one_line(monkeypatch):
    def no_compiler():
        raise InvalidCxxCompiler

    monkeypatch.setattr("torch._inductor.cpp_builder.get_cpp_compiler", no_compiler)
    with pytest.raises(InputError, match="needs a C\\+\\+ compiler"):
        RunConfig(compile=True).validate()
    RunConfig(compile=False).validate()


def test_compile_on_cuda_without_triton_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: False)
    with pytest.raises(InputError, match="needs Triton"):
        check_compile("cuda")
    check_compile("cpu")


def test_compiled_returns_the_function_itself_when_not_enabled():
    def function(x):
        return x

    assert agents.compiled(function, enabled=False) is function


@pytest.mark.parametrize("recipe", ["es", "qlearning"])
def test_recipes_without_a_loss_refuse_compile(recipe):
    module = importlib.import_module(f"recipes.{recipe}")
    config = getattr(module, "ESConfig" if recipe == "es" else "QLearningConfig")()
    config.run.compile = True
    with pytest.raises(InputError, match="nothing to compile"):
        config.validate()
