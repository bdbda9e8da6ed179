"""The lean collection policy: the same entries from the same random draws as the ProbabilisticActor it runs."""

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, IndependentNormal, TanhNormal
from torchrl.modules.distributions.utils import sample_and_log_prob

from agents import make_actor, make_deterministic_actor, make_gsde_actor, make_q_actor, without_log_prob
from agents.fast_paths import (
    LeanActor,
    LeanDeterministicPolicy,
    LeanQPolicy,
    _categorical_draw,
    _categorical_entropy,
    _categorical_log_pmf,
    _categorical_log_prob,
    _gaussian_entropy,
    _gaussian_log_prob,
    _gaussian_sample,
    flat_select,
    lean_policy,
    tanh_normal_arguments,
    tanh_normal_sample,
    unrolled,
)
from agents.normalization import ObservationNormalizer
from envs import make_env
from training import RunConfig
from training.collectors import make_collector

ACTORS = {
    "categorical": ("CartPole-v1", {}),
    "tanh-normal": ("Pendulum-v1", {}),
    "state-dependent tanh-normal": ("Pendulum-v1", {"state_dependent_scale": True}),
    "unsquashed normal, normalised observations": ("Pendulum-v1", {"squash": False, "normalize_obs": True}),
}


@pytest.mark.parametrize("log_prob", [True, False])
@pytest.mark.parametrize("name", ACTORS)
def test_the_lean_actor_writes_what_the_actor_writes_from_the_same_draws(name, log_prob):
    env_id, options = ACTORS[name]
    env = make_env(env_id, num_envs=4, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, **options)
    if not log_prob:  # the same network and draws, without the log-probability
        full, actor = actor, without_log_prob(actor)
        assert list(actor.parameters()) == list(full.parameters())
        assert actor.out_keys == [key for key in full.out_keys if key != full.module[1].log_prob_key]
        assert without_log_prob(actor) is actor
    lean = lean_policy(actor)
    assert isinstance(lean, LeanActor)
    assert lean.out_keys == actor.out_keys and lean.in_keys == actor.in_keys
    step = env.reset()
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        torch.manual_seed(5)
        expected = actor(step.clone())
        torch.manual_seed(5)
        result = lean(step.clone())
        assert not torch.equal(lean(step.clone())["action"], result["action"])  # a new draw each call
    assert set(result.keys(True)) == set(expected.keys(True))
    for key in expected.keys(True, True):
        assert torch.equal(result[key], expected[key]), key
    if not log_prob:  # the full actor's action from the same draw
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            torch.manual_seed(5)
            assert torch.equal(full(step.clone())["action"], result["action"])
    with set_exploration_type(ExplorationType.DETERMINISTIC):  # not collection: the actor itself answers
        assert torch.equal(lean(step.clone())["action"], actor(step.clone())["action"])
    assert list(lean.parameters()) == list(actor.parameters())  # shared, not copied
    env.close()


@pytest.mark.parametrize(
    ("loc_shape", "scale_shape", "event_dims"),
    [((5, 3), (5, 3), 1), ((1, 3), (1, 3), 1), ((4, 3), (3,), 1), ((2, 4, 3), (2, 4, 3), 2)],
)
def test_the_direct_gaussian_draw_is_independent_normal_s(loc_shape, scale_shape, event_dims):
    generator = torch.Generator().manual_seed(1)
    loc = torch.randn(loc_shape, generator=generator, requires_grad=True)
    scale = torch.rand(scale_shape, generator=generator).add(0.1).requires_grad_()
    torch.manual_seed(3)
    expected = sample_and_log_prob(IndependentNormal(loc, scale, event_dim=event_dims), reparameterize=True)
    torch.manual_seed(3)
    result = _gaussian_sample(loc, scale, event_dims)
    for got, want in zip(result, expected, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    value = torch.randn(torch.broadcast_shapes(loc_shape, scale_shape), generator=generator)
    torch.testing.assert_close(
        _gaussian_log_prob(loc, scale, value, event_dims),
        IndependentNormal(loc, scale, event_dim=event_dims).log_prob(value),
        rtol=0,
        atol=0,
    )
    gradients = [
        torch.autograd.grad(sum(part.sum() for part in pair), (loc, scale)) for pair in (result, expected)
    ]
    for got, want in zip(*gradients, strict=True):  # reparameterised: gradients reach loc and scale alike
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("loc_shape", "event_dims", "bounds"),
    [
        ((5, 3), 1, None),
        ((1, 6), 1, ([-2.0] * 6, [2.0] * 6)),
        ((4, 3), 1, ([-1.0, 0.0, -3.0], [1.0, 5.0, -2.0])),
        ((2, 4, 3), 2, ([-0.5] * 3, [0.5] * 3)),
    ],
)
def test_the_direct_tanh_normal_draw_is_tanh_normal_s(loc_shape, event_dims, bounds):
    generator = torch.Generator().manual_seed(2)
    loc = (
        torch.randn(loc_shape, generator=generator) * 3
    ).requires_grad_()  # some draws in tanh's flat tails
    scale = torch.rand(loc_shape, generator=generator).add(0.1).requires_grad_()
    kwargs = {} if bounds is None else {"low": torch.tensor(bounds[0]), "high": torch.tensor(bounds[1])}
    torch.manual_seed(3)
    expected = sample_and_log_prob(
        TanhNormal(loc, scale, event_dims=event_dims, **kwargs), reparameterize=True
    )
    affine = (
        None
        if bounds is None
        else ((kwargs["high"] + kwargs["low"]) / 2, (kwargs["high"] - kwargs["low"]) / 2)
    )
    torch.manual_seed(3)
    result = tanh_normal_sample(loc, scale, event_dims, affine)
    with torch.no_grad():  # as in collection: the safe tanh's forward without its autograd function
        torch.manual_seed(3)
        without_grad = tanh_normal_sample(loc, scale, event_dims, affine)
    for got, got_without_grad, want in zip(result, without_grad, expected, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got_without_grad, want, rtol=0, atol=0)
    gradients = [
        torch.autograd.grad(sum(part.sum() for part in pair), (loc, scale)) for pair in (result, expected)
    ]
    for got, want in zip(*gradients, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(5, 3), (1, 2), (2, 4, 6)])
def test_the_direct_categorical_draw_and_scores_are_categorical_s(shape):
    generator = torch.Generator().manual_seed(4)
    logits = (torch.randn(shape, generator=generator) * 4).requires_grad_()
    masked = logits.detach().clone()
    masked[..., 0] = float("-inf")  # a masked action: the entropy clamps its logit, the draw never takes it
    for values in (logits, masked):
        distribution = torch.distributions.Categorical(logits=values)
        torch.manual_seed(3)
        expected = sample_and_log_prob(distribution)
        torch.manual_seed(3)
        log_pmf = _categorical_log_pmf(values)
        action = _categorical_draw(log_pmf)
        assert action.dtype == torch.long and action.shape == shape[:-1]
        torch.testing.assert_close(action, expected[0], rtol=0, atol=0)
        torch.testing.assert_close(_categorical_log_prob(log_pmf, action), expected[1], rtol=0, atol=0)
        torch.testing.assert_close(_categorical_entropy(log_pmf), distribution.entropy(), rtol=0, atol=0)
        torch.testing.assert_close(  # a float action, as a replay buffer may hold it
            _categorical_log_prob(log_pmf, action.float()), distribution.log_prob(action), rtol=0, atol=0
        )
    assert not (_categorical_draw(_categorical_log_pmf(masked.expand(50, *shape))) == 0).any()
    # gradients: the log-probability and the entropy together, as a loss takes them
    action = torch.randint(shape[-1], shape[:-1], generator=generator)
    log_pmf = _categorical_log_pmf(logits)
    ours = torch.autograd.grad(
        (_categorical_log_prob(log_pmf, action) + _categorical_entropy(log_pmf)).sum(), logits
    )
    distribution = torch.distributions.Categorical(logits=logits)
    theirs = torch.autograd.grad((distribution.log_prob(action) + distribution.entropy()).sum(), logits)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_the_lean_categorical_actor_scores_actions_as_its_distribution_does():
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    actor = lean_policy(make_actor(env.observation_spec["observation"], env.action_spec))
    env.close()
    assert actor._categorical
    observation = torch.randn(6, 4)
    distribution = actor.distribution(observation)
    assert type(distribution) is torch.distributions.Categorical
    action = torch.tensor([0, 1, 1, 0, 1, 0])
    log_prob, entropy = actor.log_prob_and_entropy(observation, action)
    torch.testing.assert_close(log_prob, distribution.log_prob(action), rtol=0, atol=0)
    torch.testing.assert_close(entropy, distribution.entropy(), rtol=0, atol=0)
    torch.testing.assert_close(actor.log_prob(observation, action), log_prob, rtol=0, atol=0)
    # actions of another shape broadcast against the batch, as Categorical.log_prob broadcasts them
    broadcast = torch.tensor([[0], [1]])
    torch.testing.assert_close(
        actor.log_prob(observation, broadcast), distribution.log_prob(broadcast), rtol=0, atol=0
    )
    log_prob, returned = actor.log_prob_and_entropy(observation, broadcast)
    torch.testing.assert_close(log_prob, distribution.log_prob(broadcast), rtol=0, atol=0)
    assert isinstance(returned, torch.distributions.Categorical)
    # a Gaussian's entropy directly too; other policies hand back their distribution, whose entropy the loss takes
    # as the parent takes it
    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    spec = env.observation_spec["observation"]
    gaussian = lean_policy(make_actor(spec, env.action_spec, squash=False))
    squashed = lean_policy(make_actor(spec, env.action_spec))
    env.close()
    observation, action = torch.randn(3, 3), torch.randn(3, 1)
    log_prob, entropy = gaussian.log_prob_and_entropy(observation, action)
    distribution = gaussian.distribution(observation)
    assert isinstance(distribution, IndependentNormal) and not gaussian._categorical
    torch.testing.assert_close(log_prob, distribution.log_prob(action), rtol=0, atol=0)
    torch.testing.assert_close(entropy, distribution.entropy(), rtol=0, atol=0)
    log_prob, returned = squashed.log_prob_and_entropy(observation, action.tanh())
    assert isinstance(returned, TanhNormal) and log_prob.shape == (3,)


@pytest.mark.parametrize(
    ("loc_shape", "scale_shape", "event_dims"),
    [((5, 3), (5, 3), 1), ((4, 3), (3,), 1), ((2, 4, 3), (2, 4, 3), 2)],
)
def test_the_direct_gaussian_entropy_is_independent_normal_s(loc_shape, scale_shape, event_dims):
    generator = torch.Generator().manual_seed(6)
    loc = torch.randn(loc_shape, generator=generator, requires_grad=True)
    scale = torch.rand(scale_shape, generator=generator).add(0.1).requires_grad_()
    distribution = IndependentNormal(loc, scale, event_dim=event_dims)
    ours, theirs = _gaussian_entropy(loc, scale, event_dims), distribution.entropy()
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(
        torch.autograd.grad(ours.sum(), scale), torch.autograd.grad(theirs.sum(), scale), rtol=0, atol=0
    )


def test_the_lean_actor_draws_directly_only_for_the_distributions_it_knows():
    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    spec = env.observation_spec["observation"]
    gaussian = lean_policy(make_actor(spec, env.action_spec, squash=False))
    assert gaussian._gaussian_event_dims == 1 and gaussian._tanh_normal is None
    squashed = lean_policy(make_actor(spec, env.action_spec))
    assert squashed._gaussian_event_dims is None and squashed._tanh_normal[0] == 1
    center, half_range = squashed._tanh_normal[1]  # Pendulum's torque is in [-2, 2]
    assert torch.equal(center, torch.zeros(1)) and torch.equal(half_range, torch.full((1,), 2.0))
    # TanhNormal with options the direct draw does not follow, bounds it refuses, other distributions: theirs
    for kwargs in ({"tanh_loc": True}, {"safe_tanh": False}, {"event_dims": 0}, {"low": 1.0, "high": 1.0}):
        assert tanh_normal_arguments(TanhNormal, kwargs) is None, kwargs
    assert tanh_normal_arguments(IndependentNormal, {}) is None
    assert tanh_normal_arguments(TanhNormal, {"upscale": 3.0, "event_dims": 2}) == (2, None)
    env.close()


@pytest.mark.parametrize("dueling", [False, True])
def test_the_lean_q_policy_explores_as_the_epsilon_greedy_policy_does(dueling, torch_linear_kernels):
    env = make_env("CartPole-v1", num_envs=64, seed=0)
    policy = make_q_actor(env.observation_spec["observation"], env.action_spec, dueling=dueling, epsilon=0.5)
    lean = lean_policy(policy)
    assert isinstance(lean, LeanQPolicy) and lean.out_keys == policy.out_keys
    step = env.reset()
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        for _ in range(2):  # the second call: the cached batch-shaped spec
            seed = torch.seed()
            expected = policy(step.clone())
            torch.manual_seed(seed)
            result = lean(step.clone())
            assert set(result.keys(True, True)) == set(expected.keys(True, True))
            for key in expected.keys(True, True):
                assert torch.equal(result[key], expected[key]), key
        greedy = expected["action_value"].argmax(-1)
        assert 0 < (expected["action"] != greedy).sum() < 64  # some actions explored, some greedy
        policy[1].eps.fill_(0.0)  # the policy's own epsilon buffer, annealed by the recipe
        assert torch.equal(lean(step.clone())["action"], greedy)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert torch.equal(lean(step.clone())["action"], policy(step.clone())["action"])
    env.close()


@pytest.mark.parametrize(
    "env_id, sigma, normalize_obs",
    [("Pendulum-v1", 0.1, False), ("MountainCarContinuous-v0", 1.5, True)],  # wide noise: projected often
)
def test_the_lean_deterministic_policy_adds_the_noise_the_gaussian_module_adds(
    env_id, sigma, normalize_obs, torch_linear_kernels
):
    env = make_env(env_id, num_envs=64, seed=0)
    policy = make_deterministic_actor(
        env.observation_spec["observation"], env.action_spec, noise_sigma=sigma, normalize_obs=normalize_obs
    )
    lean = lean_policy(policy)
    assert isinstance(lean, LeanDeterministicPolicy) and lean.out_keys == policy.out_keys
    step = env.reset()
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        seed = torch.seed()
        expected = policy(step.clone())
        torch.manual_seed(seed)
        result = lean(step.clone())
        assert not torch.equal(lean(step.clone())["action"], result["action"])  # a new draw each call
    assert set(result.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert torch.equal(result[key], expected[key]), key
    low, high = env.action_spec.space.low, env.action_spec.space.high
    assert (result["action"] >= low).all() and (result["action"] <= high).all()
    if sigma > 1:
        assert (result["action"] == high).any() or (result["action"] == low).any()  # projected into the Box
    with set_exploration_type(ExplorationType.DETERMINISTIC):  # no noise: the policy itself answers
        assert torch.equal(lean(step.clone())["action"], policy(step.clone())["action"])
    assert list(lean.parameters()) == list(policy.parameters())
    env.close()


def test_policies_of_other_shapes_are_left_as_they_are():
    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    gsde = make_gsde_actor(env.observation_spec["observation"], env.action_spec)
    assert lean_policy(gsde) is gsde
    discrete = make_env("CartPole-v1", num_envs=2, seed=0)
    noisy = make_q_actor(discrete.observation_spec["observation"], discrete.action_spec, noisy=True)
    assert lean_policy(noisy) is noisy  # its noise resampler has work of its own
    spec = env.observation_spec["observation"]
    ou = make_deterministic_actor(spec, env.action_spec, noise="ou")
    assert lean_policy(ou) is ou  # Ornstein-Uhlenbeck noise keeps a state in the env
    env.close()
    discrete.close()


def test_the_single_process_collector_collects_what_the_plain_actor_would():
    run = RunConfig(env_id="Pendulum-v1", num_envs=2, seed=0)
    batches = []
    for lean in (True, False):
        env = make_env("Pendulum-v1", num_envs=2, seed=0)
        torch.manual_seed(0)
        actor = make_actor(env.observation_spec["observation"], env.action_spec)
        if lean:
            collector = make_collector(run, env, actor, torch.device("cpu"), 64, 64)
            assert isinstance(collector.policy, LeanActor)
        else:  # the reference: TorchRL's collector around the actor itself
            collector = Collector(env, actor, frames_per_batch=64, total_frames=64, track_traj_ids=False)
        torch.manual_seed(1)
        batches.append(next(iter(collector)))
        collector.shutdown()
        env.close()
    lean_batch, actor_batch = batches
    assert set(lean_batch.keys(True, True)) == set(actor_batch.keys(True, True))
    for key in actor_batch.keys(True, True):
        assert torch.equal(lean_batch[key], actor_batch[key]), key


def _networks():
    normalizer = ObservationNormalizer((3,))
    normalizer.update(torch.randn(64, 3, dtype=torch.float64) * 4 + 1)
    yield "sequential", nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    yield (
        "nested, normaliser, other layers",
        nn.Sequential(
            nn.Sequential(normalizer, nn.Identity()),
            MLP(in_features=3, out_features=4, num_cells=[8, 8], activation_class=nn.ELU),
            nn.LayerNorm(4),
            nn.ReLU(inplace=True),
        ),
    )
    yield "reshaping MLP", MLP(in_features=3, out_features=(2, 2), num_cells=[8])


@pytest.mark.parametrize("name", ["sequential", "nested, normaliser, other layers", "reshaping MLP"])
def test_unrolled_computes_what_the_module_computes(name):
    torch.manual_seed(0)
    network = dict(_networks())[name]
    forward = unrolled(network)
    inputs = torch.randn(5, 3)
    expected = network(inputs)
    result = forward(inputs)
    assert torch.equal(result, expected)
    expected.square().sum().backward()
    expected_grads = [parameter.grad.clone() for parameter in network.parameters()]
    network.zero_grad()
    forward(inputs).square().sum().backward()
    for parameter, grad in zip(network.parameters(), expected_grads, strict=True):
        assert torch.equal(parameter.grad, grad)
    with torch.no_grad():  # the layers' current parameters, not copies: an update shows at once
        next(network.parameters()).add_(1.0)
    assert torch.equal(forward(inputs), network(inputs))


def test_unrolled_calls_modules_with_hooks_and_under_global_hooks():
    network = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    calls = []
    network[2].register_forward_hook(lambda module, args, output: calls.append("layer"))
    forward = unrolled(network)
    forward(torch.randn(2, 3))
    assert calls == ["layer"]
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, args, output: calls.append("global")
    )
    try:
        forward(torch.randn(2, 3))
    finally:
        handle.remove()
    assert calls.count("global") == 4  # the container and its three layers, as a module call runs them
    two_inputs = (
        torch.randn(2, 1),
        torch.randn(2, 2),
    )  # several inputs: the module itself (MLP concatenates)
    mlp = MLP(in_features=3, out_features=1, num_cells=[4])
    assert torch.equal(unrolled(mlp)(*two_inputs), mlp(*two_inputs))


def test_unrolled_in_a_deep_copy_computes_with_the_copied_modules():
    import copy

    holder = nn.Module()
    holder.network = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    holder.network[0].register_forward_hook(
        lambda module, args, output: output * 2
    )  # a hooked layer keeps its hook
    holder.forward_fn = unrolled(holder.network)
    inputs = torch.randn(2, 3)
    assert torch.equal(holder.forward_fn(inputs), holder.network(inputs))
    copied = copy.deepcopy(holder)
    with torch.no_grad():
        copied.network[2].bias.add_(1.0)
    assert torch.equal(copied.forward_fn(inputs), copied.network(inputs))
    assert not torch.equal(copied.forward_fn(inputs), holder.forward_fn(inputs))


def collected_batch(names=None):
    """A [2 envs, 3 steps] batch as a collector gives it: root entries, a nested "next", entries of several
    shapes and dtypes."""
    return TensorDict(
        {
            "observation": torch.randn(2, 3, 4),
            "action": torch.randint(0, 5, (2, 3)),
            "action_log_prob": torch.randn(2, 3),
            "next": {
                "observation": torch.randn(2, 3, 4),
                "reward": torch.randn(2, 3, 1),
                "done": torch.rand(2, 3, 1) < 0.5,
                "episode_return": torch.randn(2, 3, 1),
            },
        },
        batch_size=[2, 3],
        names=names,
    )


@pytest.mark.parametrize(
    "keys",
    [
        ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done")),
        (
            ("next", "reward"),
            "action",
            ("observation",),
            ("next", "absent"),
            "absent",
        ),  # order, 1-tuples, missing
        ("next", "action"),  # a whole nested TensorDict
    ],
)
@pytest.mark.parametrize("names", [None, [None, "time"]])  # a collector's batches name their time dimension
def test_flat_select_is_select_then_reshape(keys, names):
    batch = collected_batch(names)
    expected, actual = batch.select(*keys, strict=False).reshape(-1), flat_select(batch, keys)
    assert type(actual) is TensorDict and actual.batch_size == expected.batch_size == torch.Size([6])
    assert actual.names == expected.names and not actual._has_names()
    assert list(actual.keys(True, True)) == list(expected.keys(True, True))
    assert actual.device == expected.device
    for key in expected.keys(True, True):
        assert actual[key].dtype == expected[key].dtype and torch.equal(actual[key], expected[key]), key
    # views of the batch, as TensorDict's reshape gives
    assert actual["action"].data_ptr() == batch["action"].data_ptr()


def test_flat_select_of_other_tensordicts_is_tensordict_s():
    deep = collected_batch()
    deep["next", "info", "cost"] = torch.ones(2, 3)
    expected = deep.select(("next", "info", "cost"), "action").reshape(-1)
    actual = flat_select(deep, (("next", "info", "cost"), "action"))
    assert list(actual.keys(True, True)) == list(expected.keys(True, True))
    assert torch.equal(actual["next", "info", "cost"], expected["next", "info", "cost"])
