"""LeanCollector: the same batches as TorchRL's Collector, value for value, and its state handed back and forth."""

import dict_env  # noqa: F401  (registers dict_env:GoalReach-v0)
import masked_env  # noqa: F401  (registers masked_env:PickAllowed-v0)
import pytest
import torch
from torchrl.collectors import Collector

from agents.continuous import make_deterministic_actor
from agents.fast_paths import lean_policy
from agents.gsde import clip_env_actions
from agents.networks import make_actor, without_log_prob
from agents.qvalue import make_q_actor
from envs.vector import make_env
from training import RunConfig
from training.collectors import WARMUP_FRAMES_PER_BATCH, make_off_policy_collector
from training.lean_collector import LeanCollector

# (policy, env id, env kwargs, envs, frames per batch, random frames): episodes that terminate and that are
# truncated inside batches, random actions before the policy's, squashed, Gaussian and epsilon-greedy policies
CASES = {
    "q-cartpole": ("q", "CartPole-v1", {}, 1, 64, 0),
    "q-cartpole-truncated": ("q", "CartPole-v1", {"max_episode_steps": 15}, 4, 48, 48),
    "squashed-pendulum": ("squashed", "Pendulum-v1", {"max_episode_steps": 25}, 2, 40, 40),
    "clipped-gaussian-mountaincar": (
        "clipped",
        "MountainCarContinuous-v0",
        {"max_episode_steps": 30},
        3,
        32,
        0,
    ),
    "gaussian-hopper": ("gaussian", "Hopper-v5", {}, 2, 64, 0),
    # SAC's collection: one env, one frame a batch after the random frames, no log-probability
    "sac-one-frame-hopper": ("squashed-no-log-prob", "Hopper-v5", {"max_episode_steps": 3}, 1, 1, 2),
    # DDPG's and TD3's policy: tanh into the bounds, Gaussian noise, projected back into them (wide noise: often)
    "noisy-deterministic-pendulum": ("deterministic", "Pendulum-v1", {"max_episode_steps": 25}, 2, 40, 40),
    "wide-noise-deterministic-mountaincar": (
        "deterministic-wide",
        "MountainCarContinuous-v0",
        {"max_episode_steps": 30},
        3,
        32,
        0,
    ),
}


def make_collector(
    collector_class, kind, env_id, env_kwargs, num_envs, frames_per_batch, random_frames, batches, **options
):
    torch.manual_seed(0)
    env = make_env(env_id, num_envs, seed=0, env_kwargs=env_kwargs or None)
    spec, action_spec = env.observation_spec["observation"], env.action_spec
    if kind == "q":
        policy = make_q_actor(spec, action_spec, hidden_sizes=(32,), epsilon=0.3)
    elif kind.startswith("deterministic"):
        sigma = 1.0 if kind == "deterministic-wide" else 0.1
        policy = make_deterministic_actor(spec, action_spec, hidden_sizes=(32,), noise_sigma=sigma)
    else:
        policy = make_actor(spec, action_spec, hidden_sizes=(32,), squash=kind.startswith("squashed"))
        if kind.endswith("no-log-prob"):
            policy = without_log_prob(policy)
    if kind == "clipped":
        env = clip_env_actions(env)
    torch.manual_seed(1)
    return collector_class(
        env,
        lean_policy(policy),
        frames_per_batch=frames_per_batch,
        total_frames=frames_per_batch * batches,
        init_random_frames=random_frames,
        env_device="cpu",
        policy_device="cpu",
        storing_device="cpu",
        track_traj_ids=False,
        auto_register_policy_transforms=False,
        **options,
    )


def assert_same_tensordicts(expected, actual):
    assert type(actual) is type(expected)
    assert actual.batch_size == expected.batch_size and actual.names == expected.names
    assert actual.device == expected.device
    assert set(actual.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert actual[key].dtype == expected[key].dtype, key
        assert torch.equal(actual[key], expected[key]), key


@pytest.mark.parametrize("case", list(CASES))
def test_batches_equal_torchrl_collectors(case):
    torchrl_collector = make_collector(Collector, *CASES[case], batches=4)
    expected = list(torchrl_collector)  # each collector draws from torch's generator, seeded as it is built
    lean_collector = make_collector(LeanCollector, *CASES[case], batches=4)
    assert lean_collector.lean
    actual = list(lean_collector)
    assert len(actual) == len(expected) == 4
    assert any(batch["next", "done"].any() for batch in expected)  # episodes end inside the batches
    for expected_batch, actual_batch in zip(expected, actual, strict=True):
        assert_same_tensordicts(expected_batch, actual_batch)
    assert_same_tensordicts(torchrl_collector._carrier, lean_collector._carrier)


@pytest.mark.parametrize(
    "batches, lean_sizes",
    [
        (8, [60, 40, 20, 20, 20]),  # 90 random frames: TorchRL's 5 random batches of 20, here 60 and 40
        (2, [40]),  # a budget that ends inside the random frames
    ],
)
def test_random_frames_in_longer_batches_are_torchrl_s_batches_end_to_end(batches, lean_sizes):
    case = ("squashed", "Pendulum-v1", {"max_episode_steps": 25}, 2, 20, 90)
    torchrl_collector = make_collector(Collector, *case, batches=batches)
    expected = list(torchrl_collector)
    lean_collector = make_collector(LeanCollector, *case, batches=batches, warmup_frames_per_batch=60)
    actual = list(lean_collector)
    assert [batch.numel() for batch in actual] == lean_sizes
    random_batches = min(5, batches)  # TorchRL's random batches; then the lean ones hold as many frames
    warmup = len(lean_sizes) - (batches - random_batches)
    assert_same_tensordicts(torch.cat(expected[:random_batches], dim=1), torch.cat(actual[:warmup], dim=1))
    for expected_batch, actual_batch in zip(expected[random_batches:], actual[warmup:], strict=True):
        assert_same_tensordicts(expected_batch, actual_batch)
    assert_same_tensordicts(torchrl_collector._carrier, lean_collector._carrier)


def test_the_off_policy_recipes_collect_their_random_frames_in_longer_batches():
    env = make_env("Pendulum-v1", 1, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, hidden_sizes=(8,), squash=True)
    collector = make_off_policy_collector(
        RunConfig(env_id="Pendulum-v1", total_frames=1000), env, actor, 8, 100, torch.device("cpu")
    )
    assert collector.warmup_frames_per_batch == WARMUP_FRAMES_PER_BATCH // 8 * 8
    assert [batch.numel() for batch in collector][:3] == [104, 8, 8]  # the random frames end at TorchRL's 104


def test_the_lean_and_torchrl_rollouts_take_turns():
    """The lean rollout leaves the env and the carrier as TorchRL's does: alternating them changes nothing."""
    case = CASES["q-cartpole-truncated"]
    expected = list(make_collector(Collector, *case, batches=5))
    collector = make_collector(LeanCollector, *case, batches=5)
    actual = []
    for index, batch in enumerate(collector):
        actual.append(batch)
        collector.lean = index % 2 == 1  # lean, TorchRL, lean, TorchRL, lean
    for expected_batch, actual_batch in zip(expected, actual, strict=True):
        assert_same_tensordicts(expected_batch, actual_batch)


def test_the_carrier_is_refilled_in_place_until_something_else_touches_it():
    """Between lean rollouts the carrier's tensors take the new state in place; a reset or an in-place change by
    anyone else makes the next rollout build a new carrier, and the batches stay TorchRL's."""
    case = CASES["sac-one-frame-hopper"]

    def interfere(collector, index):
        if index == 4:
            collector.reset()  # the env's state and the carrier's values replaced
        if index == 6:
            collector._carrier.get("observation").mul_(1.0)  # the same values, changed in place

    torchrl_collector = make_collector(Collector, *case, batches=9)
    expected = []
    for index, batch in enumerate(torchrl_collector):
        expected.append(batch)
        interfere(torchrl_collector, index)
    collector = make_collector(LeanCollector, *case, batches=9)
    actual, carriers = [], []
    for index, batch in enumerate(collector):
        actual.append(batch)
        carriers.append(collector._carrier)
        assert collector.env._observation is collector._carrier.get("observation")
        interfere(collector, index)
    for expected_batch, actual_batch in zip(expected, actual, strict=True):
        assert_same_tensordicts(expected_batch, actual_batch)
    assert_same_tensordicts(torchrl_collector._carrier, collector._carrier)
    # kept from the first policy batch on (the random frames' carrier is the first), new after each interference
    new = [index for index in range(1, 9) if carriers[index] is not carriers[index - 1]]
    assert new == [5, 7]


def test_each_batch_has_tensors_of_its_own():
    collector = make_collector(LeanCollector, *CASES["q-cartpole"], batches=2)
    first, second = list(collector)
    for key in first.keys(True, True):
        assert first[key].data_ptr() != second[key].data_ptr(), key
    assert not torch.equal(first["observation"], second["observation"])


@pytest.mark.parametrize(
    "env_id, options",
    [
        ("masked_env:PickAllowed-v0", {}),  # action masks
        ("dict_env:GoalReach-v0", {}),  # Dict observations
        ("CartPole-v1", {"track_traj_ids": True}),
        ("CartPole-v1", {"policy": "plain"}),
    ],
)
def test_other_configurations_run_torchrls_rollout(env_id, options):
    env = make_env(env_id, 2, seed=0)
    spec = env.observation_spec["observation"]
    if env_id.startswith("dict_env"):
        policy = make_q_actor(spec, env.action_spec, hidden_sizes=(8,), epsilon=0.3)
    else:
        policy = make_q_actor(spec, env.action_spec, hidden_sizes=(8,), epsilon=0.3)
    options = {"track_traj_ids": False} | options
    policy = policy if options.pop("policy", None) == "plain" else lean_policy(policy)
    collector = LeanCollector(
        env, policy, frames_per_batch=8, total_frames=16, auto_register_policy_transforms=False, **options
    )
    assert not collector.lean
    if env_id == "CartPole-v1":  # still collects, through the parent's rollout
        assert next(iter(collector)).batch_size == (2, 4)
