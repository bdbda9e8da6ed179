import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.modules import LSTMModule, ValueOperator, set_recurrent_mode
from torchrl.objectives.value import GAE, TD1Estimator

from agents import make_actor


def test_gae_matches_hand_computed_values_across_truncation_and_termination():
    # V(s) = 2 s; gamma 0.9, lambda 0.8. Steps 0-1: an episode cut by a time limit (truncated, bootstrapped
    # from V(3)); steps 2-3: an episode that terminates (no bootstrap).
    linear = nn.Linear(1, 1)
    with torch.no_grad():
        linear.weight.fill_(2.0)
        linear.bias.zero_()
    critic = ValueOperator(linear, in_keys=["observation"])

    def column(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype).reshape(1, 4, 1)

    terminated = column([False, False, False, True], torch.bool)
    truncated = column([False, True, False, False], torch.bool)
    batch = TensorDict(
        {
            "observation": column([1.0, 2.0, 5.0, 6.0]),
            "next": {
                "observation": column([2.0, 3.0, 6.0, 7.0]),
                "reward": column([1.0, 1.0, 0.0, 2.0]),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[1, 4],
    )
    GAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)(batch)
    # deltas: 1 + .9*4 - 2 = 2.6 | 1 + .9*6 - 4 = 2.4 | 0 + .9*12 - 10 = 0.8 | 2 - 12 = -10
    expected_advantage = torch.tensor([2.6 + 0.72 * 2.4, 2.4, 0.8 + 0.72 * -10.0, -10.0])
    torch.testing.assert_close(batch["advantage"].flatten(), expected_advantage)
    torch.testing.assert_close(
        batch["value_target"].flatten(), expected_advantage + torch.tensor([2.0, 4.0, 10.0, 12.0])
    )


def auto_reset_batch(num_envs=3, steps=7, observation_size=2, seed=0):
    """A collector-shaped batch ``[env, time]``: each step's next observation is the next step's observation,
    except where an episode ended (terminated or truncated: the next observation is the final one and the
    following step starts from a reset)."""
    generator = torch.Generator().manual_seed(seed)
    observation = torch.randn(num_envs, steps, observation_size, generator=generator)
    terminated = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
    truncated = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
    for flags, env, step in [(terminated, 0, 2), (truncated, 1, 4), (terminated, 2, 0), (truncated, 2, 5)]:
        flags[env, step] = True
    truncated[0, steps - 1] = True
    done = terminated | truncated
    next_observation = observation.roll(-1, 1).clone()
    final = torch.randn(num_envs, steps, observation_size, generator=generator)  # final observations
    ended = done.squeeze(-1).clone()
    ended[:, -1] = True
    next_observation[ended] = final[ended]
    return TensorDict(
        {
            "observation": observation,
            "next": {
                "observation": next_observation,
                "reward": torch.randn(num_envs, steps, 1, generator=generator),
                "terminated": terminated,
                "truncated": truncated,
                "done": done,
            },
        },
        batch_size=[num_envs, steps],
    )


class CountingCritic(nn.Module):
    def __init__(self, observation_size=2):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(observation_size, 16), nn.Tanh(), nn.Linear(16, 1))
        self.rows = 0

    def forward(self, observation):
        self.rows += observation.shape[:-1].numel()
        return self.body(observation)


@pytest.mark.parametrize("estimator", ["gae", "td1"])
def test_one_call_estimators_give_torchrls_values_and_advantages_from_one_critic_pass(estimator):
    from agents import OneCallGAE, OneCallTD1

    batch = auto_reset_batch()
    network = CountingCritic()
    critic = ValueOperator(network, in_keys=["observation"])
    if estimator == "gae":
        reference, one_call = (
            cls(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False) for cls in (GAE, OneCallGAE)
        )
    else:
        reference, one_call = (cls(gamma=0.9, value_network=critic) for cls in (TD1Estimator, OneCallTD1))
    expected = reference(batch.clone())
    network.rows = 0
    result = one_call(batch.clone())
    for key in ["advantage", "value_target", "state_value", ("next", "state_value")]:
        torch.testing.assert_close(result[key], expected[key])
    # the 21 observations once, plus the next observations the batch lacks: 5 episode ends and the 3 segment ends
    # (one of which is also an episode end)
    assert network.rows == 21 + 5 + 2


def test_one_call_gae_matches_torchrls_on_a_collected_batch_with_time_limits_and_terminations():
    from agents import OneCallGAE, make_critic
    from envs import make_env
    from training import RunConfig, make_collector

    env = make_env("CartPole-v1", 4, seed=0, env_kwargs={"max_episode_steps": 30})  # time limits too
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    critic = make_critic(env.observation_spec["observation"], [8], "tanh")
    collector = make_collector(RunConfig(num_envs=4), env, actor, torch.device("cpu"), 4 * 64, 4 * 64)
    batch = next(iter(collector))
    collector.shutdown()
    env.close()
    assert batch["next", "truncated"].any() and batch["next", "terminated"].any()
    expected = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)(batch.clone())
    result = OneCallGAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)(batch.clone())
    for key in ["advantage", "value_target", ("next", "state_value")]:
        torch.testing.assert_close(result[key], expected[key])


def test_one_call_gae_reads_collected_values_and_runs_the_critic_on_the_missing_next_observations_only():
    from agents import OneCallGAE

    network = CountingCritic()
    critic = ValueOperator(network, in_keys=["observation"])
    expected = GAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)(auto_reset_batch())
    estimator = OneCallGAE(
        gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False, collected_values=True
    )
    collected = auto_reset_batch()
    with torch.no_grad():
        collected["state_value"] = critic(collected.clone())["state_value"]
    network.rows = 0
    result = estimator(collected)
    assert network.rows == 5 + 2  # the episode ends and the segment ends, as in the test above
    for key in ["advantage", "value_target", "state_value", ("next", "state_value")]:
        torch.testing.assert_close(result[key], expected[key])
    # the batch's values are taken as given: other values give other advantages
    shifted = auto_reset_batch()
    shifted["state_value"] = collected["state_value"] + 1.0
    assert not torch.allclose(estimator(shifted)["advantage"], expected["advantage"])
    # a batch without values: the critic runs over it as without collected_values
    network.rows = 0
    result = estimator(auto_reset_batch())
    assert network.rows == 21 + 5 + 2
    torch.testing.assert_close(result["advantage"], expected["advantage"])


def test_collector_given_a_critic_writes_its_values_of_the_observations():
    from agents import make_critic
    from agents.fast_paths import LeanActor
    from agents.networks import critic_on_cnn_trunk
    from envs import make_env
    from training import RunConfig, make_collector

    env = make_env("CartPole-v1", 2, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    critic = make_critic(env.observation_spec["observation"], [8], "tanh")
    collector = make_collector(
        RunConfig(num_envs=2), env, actor, torch.device("cpu"), 2 * 16, 4 * 16, critic=critic
    )
    assert collector.lean and isinstance(collector.policy, LeanActor)
    assert not critic_on_cnn_trunk(actor, critic)  # an MLP critic: written all the same, at its own cost
    for lean in (True, False):  # the direct rollout and TorchRL's write the same entries
        collector.lean = lean
        batch = next(iter(collector))
        assert set(batch.keys()) >= {"state_value", "action", "logits"}
        torch.testing.assert_close(batch["state_value"], critic(batch.clone())["state_value"])
    collector.shutdown()
    env.close()
    with pytest.raises(TypeError, match="reading 'observation' alone"):
        LeanActor(actor, critic=ValueOperator(nn.Linear(4, 1), in_keys=["other"]))


def test_one_call_gae_leaves_recurrent_mode_and_functional_parameters_to_torchrl(monkeypatch):
    from agents import OneCallGAE

    parent_calls = []
    parent = GAE._call_value_nets

    def spy(self, *args, **kwargs):
        parent_calls.append(args)
        return parent(self, *args, **kwargs)

    monkeypatch.setattr(GAE, "_call_value_nets", spy)
    critic = ValueOperator(CountingCritic(), in_keys=["observation"])
    estimator = OneCallGAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)
    estimator(auto_reset_batch())
    assert not parent_calls
    marked = auto_reset_batch()  # episode starts marked, a critic without memory: still one call
    marked["is_init"] = torch.zeros(*marked.shape, 1, dtype=torch.bool)
    estimator(marked)
    assert not parent_calls
    # a recurrent critic in recurrent mode (sequences) is TorchRL's; in sequential mode it is covered
    # (tests/test_recurrent.py checks its advantages against a per-step reference)
    layer = LSTMModule(
        input_size=2,
        hidden_size=4,
        in_keys=["observation", "h", "c"],
        out_keys=["m", ("next", "h"), ("next", "c")],
    )
    recurrent_critic = TensorDictSequential(layer, ValueOperator(torch.nn.Linear(4, 1), in_keys=["m"]))
    batch = auto_reset_batch()
    batch["is_init"] = torch.zeros(*batch.shape, 1, dtype=torch.bool)
    batch["is_init"][:, 0] = True
    for key in ("h", "c"):
        batch[key] = batch["next", key] = torch.zeros(*batch.shape, 1, 4)
    batch["next", "is_init"] = torch.zeros(*batch.shape, 1, dtype=torch.bool)
    recurrent_estimator = OneCallGAE(
        gamma=0.9, lmbda=0.8, value_network=recurrent_critic, average_gae=False, deactivate_vmap=True
    )
    with set_recurrent_mode(True):
        recurrent_estimator(batch.clone())
    assert len(parent_calls) == 1
    recurrent_estimator(batch)
    assert len(parent_calls) == 1
