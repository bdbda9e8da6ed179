"""Evolution Strategies: the population network, fitness shaping, the gradient estimate, episode bookkeeping,
and the recipe's outputs and bad input."""

import copy
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from run_helpers import tiny_es
from tensordict import TensorDict

from agents import Agent
from agents.es import (
    PopulationNetwork,
    antithetic_gradient,
    centered_ranks,
    first_episodes,
    make_es_policy,
    make_population_policy,
)
from envs import make_env
from envs.specs import space_to_spec
from errors import InputError
from recipes import es
from training import quiet


def test_population_network_uses_one_parameter_set_per_block_of_rows():
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    population = PopulationNetwork(network)
    flat = torch.randn(4, population.num_parameters)
    population.set_population(flat)
    inputs = torch.randn(4 * 3, 3)  # 4 members, 3 rows each
    outputs = population(inputs)
    for member in range(4):
        reference = copy.deepcopy(network)
        torch.nn.utils.vector_to_parameters(flat[member], reference.parameters())
        rows = slice(3 * member, 3 * member + 3)
        torch.testing.assert_close(outputs[rows], reference(inputs[rows]))
    # the network itself is untouched, and a batch that does not split into the members is refused
    assert not torch.equal(network(inputs[:3]), outputs[:3])
    with pytest.raises(ValueError, match="does not split"):
        population(torch.randn(5, 3))


def test_population_network_without_a_population_is_the_network():
    network = torch.nn.Linear(3, 2)
    inputs = torch.randn(6, 3)
    torch.testing.assert_close(PopulationNetwork(network)(inputs), network(inputs))


def test_population_policy_acts_like_the_policy_with_theta_in_every_row():
    env = make_env("Pendulum-v1", num_envs=4)
    policy = make_es_policy(env.observation_spec["observation"], env.action_spec)
    population_policy, population_network = make_population_policy(policy)
    theta = torch.nn.utils.parameters_to_vector(policy.parameters())
    population_network.set_population(theta.expand(4, -1))
    observation = env.reset()
    torch.testing.assert_close(
        population_policy(observation.clone())["action"], policy(observation.clone())["action"]
    )
    env.close()


def test_es_policy_actions_are_valid_for_discrete_and_asymmetric_box():
    discrete = make_es_policy(
        space_to_spec(gym.spaces.Box(-1, 1, (3,)), 5), space_to_spec(gym.spaces.Discrete(4), 5)
    )
    actions = discrete(TensorDict({"observation": torch.randn(5, 3)}, batch_size=[5]))["action"]
    assert actions.dtype == torch.int64 and actions.shape == (5,) and ((0 <= actions) & (actions < 4)).all()
    box = gym.spaces.Box(np.array([-3.0, 0.0]), np.array([1.0, 5.0]))
    continuous = make_es_policy(
        space_to_spec(gym.spaces.Box(-1, 1, (3,)), 5), space_to_spec(box, 5), hidden_sizes=(8,)
    )
    with torch.no_grad():
        for parameter in continuous.parameters():
            parameter.mul_(100)  # saturate the tanh
    actions = continuous(TensorDict({"observation": torch.randn(5, 3)}, batch_size=[5]))["action"]
    assert actions.shape == (5, 2)
    assert (actions >= torch.tensor([-3.0, 0.0])).all() and (actions <= torch.tensor([1.0, 5.0])).all()
    with pytest.raises(InputError, match="Discrete and one-dimensional Box"):
        make_es_policy(
            space_to_spec(gym.spaces.Box(-1, 1, (3,)), 5), space_to_spec(gym.spaces.MultiDiscrete([2, 3]), 5)
        )


def test_centered_ranks_span_minus_half_to_half_and_ties_share_a_rank():
    torch.testing.assert_close(
        centered_ranks(torch.tensor([10.0, -5.0, 3.0])), torch.tensor([0.5, -0.5, 0.0])
    )
    ranks = centered_ranks(torch.tensor([500.0, 20.0, 500.0, 500.0, 7.0]))
    torch.testing.assert_close(ranks, torch.tensor([0.25, -0.25, 0.25, 0.25, -0.5]))
    assert ranks.sum().abs() < 1e-6  # centred


def test_antithetic_gradient_points_along_a_linear_fitness():
    """F(theta) = w . theta: the estimate's expectation is sigma * w, so many pairs align with w."""
    torch.manual_seed(0)
    dimension, pairs, sigma = 20, 4000, 0.1
    w, theta = torch.randn(dimension), torch.randn(dimension)
    noise = torch.randn(pairs, dimension)
    positive, negative = (theta + sigma * noise) @ w, (theta - sigma * noise) @ w
    gradient = antithetic_gradient(noise, positive, negative)
    torch.testing.assert_close(gradient, sigma * w, atol=0.03, rtol=0.1)
    # ranks keep the direction: monotone shaping of a linear fitness
    shaped = centered_ranks(torch.cat([positive, negative]))
    ranked = antithetic_gradient(noise, shaped[:pairs], shaped[pairs:])
    assert torch.nn.functional.cosine_similarity(ranked, w, dim=0) > 0.95


def batch(done_rows, rewards):
    """A fake collector batch: ``done_rows`` and ``rewards`` are [envs, steps] lists."""
    done = torch.tensor(done_rows, dtype=torch.bool)[..., None]
    return TensorDict(
        {
            "observation": torch.zeros(*done.shape[:2], 1),
            "next": {"done": done, "reward": torch.tensor(rewards, dtype=torch.float32)[..., None]},
        },
        batch_size=done.shape[:2],
    )


def test_first_episodes_counts_each_envs_first_episode_only():
    batches = iter(
        [
            batch([[0, 1, 0], [0, 0, 0]], [[1, 2, 100], [1, 1, 1]]),  # env 0 ends at step 2, then restarts
            batch([[1, 0, 0], [0, 1, 0]], [[100, 100, 100], [1, 5, 100]]),  # env 1 ends at its 5th step
        ]
    )
    steps, returns, lengths = first_episodes(batches, num_envs=2, max_steps=100)
    torch.testing.assert_close(returns, torch.tensor([3.0, 9.0]))
    assert lengths.tolist() == [2, 5]
    assert steps.numel() == 7


def test_first_episodes_cuts_episodes_at_the_time_limit():
    batches = iter([batch([[0, 0, 0]], [[1, 1, 1]]), batch([[0, 0, 0]], [[1, 1, 1]])])
    steps, returns, lengths = first_episodes(batches, num_envs=1, max_steps=4)
    assert returns.tolist() == [4.0] and lengths.tolist() == [4] and steps.numel() == 4


def test_es_recipe_trains_saves_loads_and_predicts(output_dir):
    config = quiet(
        es.ESConfig(), output_dir, total_frames=3_000, eval_every=1_500, eval_episodes=3, num_envs=8
    )
    config.run.env_backend = "torch"
    config.network.normalize_obs = True
    summary = es.main(config)
    assert summary["frames"] >= 3_000
    agent = Agent.load(output_dir / "agent.ckpt")
    assert agent.algorithm == "es" and agent.normalizer is not None
    assert agent.normalizer.count > 0  # statistics from the generations' episodes travel with the agent
    observation = np.zeros(4, dtype=np.float32)
    assert agent.predict(observation) == agent.predict(
        observation, deterministic=False
    )  # ES acts deterministically
    assert len(agent.evaluate(episodes=2, seed=0).returns) == 2


@pytest.mark.parametrize(
    "option,value,expected",
    [
        ("max_episode_steps", 1_000, 1_000),  # above CartPole's registered 500
        ("env_kwargs", ("max_episode_steps=40",), 40),
        (None, None, 500),  # the registered limit
    ],
)
def test_es_cuts_episodes_at_the_time_limit_given(option, value, expected, output_dir, monkeypatch):
    limits = []

    class Recording(es.PopulationEvaluator):
        def __init__(self, env, policy, steps_per_env, max_steps, device):
            limits.append(max_steps)
            super().__init__(env, policy, steps_per_env, max_steps, device)

    monkeypatch.setattr(es, "PopulationEvaluator", Recording)
    config = quiet(
        es.ESConfig(), output_dir, total_frames=200, eval_every=10_000, eval_episodes=1, num_envs=2
    )
    config.run.env_backend = "torch"
    if option is not None:
        setattr(config.run, option, value)
    es.main(config)
    assert limits == [expected]


def test_es_on_ray_builds_its_workers_envs_as_the_options_say(output_dir, monkeypatch):
    built = {}

    class Recording:  # stands in for the Ray evaluator: records what each worker would build
        def __init__(self, num_workers, address, timeout_s, **options):
            built.update(options)
            raise InputError("recorded")

    monkeypatch.setattr(es, "RayPopulationEvaluator", Recording)
    config = quiet(es.ESConfig(), output_dir, total_frames=200, num_envs=4, collector_backend="ray")
    config.run.vectorization, config.run.env_kwargs = "async", ("sutton_barto_reward=true",)
    with pytest.raises(InputError, match="recorded"):
        es.main(config)
    assert built["env_options"]["vectorization"] == "async"
    assert built["env_options"]["env_kwargs"] == {"sutton_barto_reward": True}


def test_es_generations_move_theta_and_are_reproducible(output_dir, tmp_path):
    def train(directory):
        config = quiet(
            es.ESConfig(), directory, total_frames=2_000, eval_every=10_000, eval_episodes=1, num_envs=8
        )
        config.run.env_backend = "torch"
        es.main(config)
        return torch.nn.utils.parameters_to_vector(Agent.load(directory / "agent.ckpt").policy.parameters())

    first, second = train(output_dir), train(tmp_path / "again")
    torch.testing.assert_close(first, second)
    torch.manual_seed(0)
    fresh = es.ESConfig()
    env = make_env("CartPole-v1", num_envs=2)
    untrained = make_es_policy(
        env.observation_spec["observation"], env.action_spec, fresh.network.hidden_sizes
    )
    env.close()
    assert not torch.allclose(first, torch.nn.utils.parameters_to_vector(untrained.parameters()))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"run.num_envs": 7}, "must be even"),
        ({"search.sigma": 0.0}, "--sigma must be in .0, inf."),
        ({"optim.lr": -1.0}, "--lr must be in .0, inf."),
        ({"optim.weight_decay": -0.1}, r"--weight-decay must be in \[0, inf\)"),
        ({"optim.weight_decay": float("inf")}, r"--weight-decay must be in \[0, inf\), got inf"),
        ({"search.episodes_per_member": 0}, "--episodes-per-member must be a positive integer"),
        ({"run.collector_backend": "ray", "run.num_workers": 3}, "must split evenly over --num-workers 3"),
        ({"run.collector_backend": "multiprocess"}, "multiprocess is not offered"),
        ({"workers.worker_restarts": -1}, "--worker-restarts >= 0"),
    ],
)
def test_es_bad_input(change, message, output_dir):
    config = quiet(es.ESConfig(), output_dir)
    for path, value in change.items():
        group, name = path.split(".")
        setattr(getattr(config, group), name, value)
    with pytest.raises(InputError, match=message):
        es.main(config)


def test_a_budget_below_one_generation_says_how_many_frames_it_collects(tmp_path):
    with pytest.warns(
        UserWarning, match=r"--total-frames 10 is less than one generation: .* \(8 members x 1 episodes\)"
    ):
        summary = es.main(tiny_es(tmp_path / "short", total_frames=10, eval_every=10))
    assert summary["frames"] > 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        es.main(tiny_es(tmp_path / "long", total_frames=2_000, eval_every=2_000))
    assert not [warning for warning in caught if "less than one generation" in str(warning.message)]
