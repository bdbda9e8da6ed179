"""DQN family: target network syncs, prioritized replay, n-step targets, noisy layers, options, bad input."""

import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    Categorical,
    LazyTensorStorage,
    PrioritizedSampler,
    TensorDictReplayBuffer,
    Unbounded,
)
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import reset_noise
from torchrl.objectives import DQNLoss, ValueEstimators

from agents import Agent
from agents.qvalue import (
    MaxNormalisedPriorityWeights,
    NStepReturns,
    TensorDQNLoss,
    make_q_actor,
    make_target_updater,
    reset_target_noise,
)
from errors import InputError
from recipes import dqn
from training import RunConfig

OBSERVATION_SPEC = Unbounded(shape=(1, 1))
ACTION_SPEC = Categorical(2, shape=(1,))


def transitions(observations, actions, rewards, next_observations, terminated, truncated):
    """A flat batch of transitions from per-step lists."""
    terminated = torch.tensor(terminated).view(-1, 1)
    truncated = torch.tensor(truncated).view(-1, 1)
    return TensorDict(
        {
            "observation": torch.tensor(observations, dtype=torch.float32).view(-1, 1),
            "action": torch.tensor(actions),
            "next": {
                "observation": torch.tensor(next_observations, dtype=torch.float32).view(-1, 1),
                "reward": torch.tensor(rewards, dtype=torch.float32).view(-1, 1),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[len(observations)],
    )


def linear_q_actor():
    """Q(s) = [s, 2 s]: a one-layer Q-network with fixed weights, so targets can be computed by hand."""
    policy = make_q_actor(OBSERVATION_SPEC, ACTION_SPEC, hidden_sizes=())
    linear = next(m for m in policy.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0], [2.0]]))
        linear.bias.zero_()
    return policy[0]


def dqn_loss(q_actor, gamma=0.9, **kwargs):
    """The recipe's loss: DQNLoss's objective computed on tensors."""
    loss_module = TensorDQNLoss(q_actor, loss_function="l2", action_space=ACTION_SPEC, **kwargs)
    loss_module.make_value_estimator(gamma=gamma)
    return loss_module


def random_transitions(size, num_observations, num_actions):
    done = torch.rand(size, 1) < 0.3
    return TensorDict(
        {
            "observation": torch.randn(size, num_observations),
            "action": torch.randint(num_actions, (size,)),
            "steps_to_next_obs": torch.randint(1, 4, (size, 1)),
            "priority_weight": torch.rand(size),
            "next": {
                "observation": torch.randn(size, num_observations),
                "reward": torch.randn(size, 1),
                "done": done,
                "terminated": done & (torch.rand(size, 1) < 0.5),
                "truncated": torch.zeros(size, 1, dtype=torch.bool),
            },
        },
        batch_size=[size],
    )


@pytest.mark.parametrize("loss_function", ["smooth_l1", "l2"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"double_dqn": True},
        {"dueling": True},
        {"noisy": True},
        {"double_dqn": True, "dueling": True, "noisy": True},
    ],
)
@pytest.mark.parametrize("batch_keys", [(), ("steps_to_next_obs",), ("priority_weight",)])
def test_tensor_dqn_loss_equals_torchrl_dqn_loss(options, loss_function, batch_keys):
    torch.manual_seed(0)
    network_options = {key: value for key, value in options.items() if key != "double_dqn"}
    action_spec = Categorical(3, shape=(1,))
    q_actor = make_q_actor(Unbounded(shape=(1, 4)), action_spec, hidden_sizes=(16,), **network_options)[0]
    loss_options = {"double_dqn": options.get("double_dqn", False), "loss_function": loss_function}
    # TorchRL's DQNLoss with the importance weights applied as TensorDQNLoss applies them (see the next test)
    reference = type("PaperWeightedDQNLoss", (MaxNormalisedPriorityWeights, DQNLoss), {})(
        q_actor, delay_value=True, action_space=action_spec, **loss_options
    )
    tensor_loss = TensorDQNLoss(q_actor, action_space=action_spec, **loss_options)
    with torch.no_grad():  # a target network that differs from the online one
        for target in reference.target_value_network_params.values(True, True):
            target.add_(0.1 * torch.randn_like(target))
        tensor_loss.target_value_network_params.update_(reference.target_value_network_params)
    batch = random_transitions(64, 4, 3).exclude(*{"steps_to_next_obs", "priority_weight"} - set(batch_keys))
    results = []
    for loss_module in (reference, tensor_loss):
        loss_module.make_value_estimator(gamma=0.9)
        loss_module.deterministic_sampling_mode = (
            ExplorationType.RANDOM
        )  # noisy layers on, same noise for both
        sample = batch.clone()
        q_actor.zero_grad()
        loss = loss_module(sample)["loss"]
        loss.backward()
        results.append(
            (
                loss.detach(),
                sample.get("td_error"),
                [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in q_actor.parameters()],
            )
        )
    (loss, priorities, gradients), (tensor_loss_value, tensor_priorities, tensor_gradients) = results
    torch.testing.assert_close(tensor_loss_value, loss)
    torch.testing.assert_close(tensor_priorities, priorities)
    for tensor_gradient, gradient in zip(tensor_gradients, gradients, strict=True):
        torch.testing.assert_close(tensor_gradient, gradient)

    # targets written in place afterwards (as target updaters do) are the ones the next loss uses
    hard_update = make_target_updater(tensor_loss, update_interval=1)
    hard_update.step()
    with torch.no_grad():
        reference.target_value_network_params.update_(tensor_loss.target_value_network_params)
    torch.testing.assert_close(tensor_loss(batch.clone())["loss"], reference(batch.clone())["loss"])


def test_tensor_dqn_loss_refuses_what_it_does_not_compute():
    q_actor = make_q_actor(OBSERVATION_SPEC, ACTION_SPEC, hidden_sizes=(8,))[0]
    with pytest.raises(InputError, match="needs a QValueActor"):
        TensorDQNLoss(q_actor[0])
    loss_module = TensorDQNLoss(q_actor, action_space=ACTION_SPEC)
    loss_module.make_value_estimator(ValueEstimators.TDLambda, gamma=0.9, lmbda=0.9)
    with pytest.raises(InputError, match="TD\\(0\\) targets only"):
        loss_module(random_transitions(4, 1, 2))


def td_targets(loss_module, batch):
    """The TD targets the loss regresses onto, recovered from the squared TD errors it reports."""
    loss_module(batch)
    action_values = loss_module.value_network(batch.clone()).get("action_value")
    chosen = action_values.gather(-1, batch.get("action").unsqueeze(-1)).squeeze(-1)
    squared_error = batch.get("td_error").squeeze(-1)
    # Q(s, a) = s or 2 s is below every target used here, so the target is Q + |TD error|
    return chosen.detach() + squared_error.sqrt()


def test_target_parameters_frozen_between_syncs_and_equal_after_one():
    q_actor = make_q_actor(OBSERVATION_SPEC, ACTION_SPEC, hidden_sizes=(8,))[0]
    loss_module = dqn_loss(q_actor)
    target_updater = make_target_updater(loss_module, update_interval=3)
    optimizer = torch.optim.SGD(list(loss_module.value_network_params.values(True, True)), lr=0.1)
    batch = transitions([0.5, -1.0], [0, 1], [1.0, 0.0], [1.0, 0.0], [False, True], [False, False])
    target = loss_module.target_value_network_params
    online = loss_module.value_network_params
    initial_target = target.clone()
    for step in range(1, 4):
        optimizer.zero_grad()
        loss_module(batch.clone())["loss"].backward()
        optimizer.step()
        target_updater.step()
        if step < 3:
            assert (target == initial_target).all(), "target changed between syncs"
            assert not (online == target).all(), "the online network should have moved away"
    assert (online == target).all(), "target should equal the online network right after a sync"
    assert not (target == initial_target).all()
    synced = target.clone()
    for _ in range(2):  # and stays frozen until the next sync
        optimizer.zero_grad()
        loss_module(batch.clone())["loss"].backward()
        optimizer.step()
        target_updater.step()
        assert (target == synced).all()


def test_importance_weights_scale_the_loss():
    loss_module = dqn_loss(linear_q_actor())
    batch = transitions([1.0, 2.0], [0, 1], [5.0, 1.0], [1.0, 1.0], [True, False], [False, False])
    unweighted = loss_module(batch.clone())["loss"]
    per_sample = torch.stack([loss_module(batch[i : i + 1].clone())["loss"] for i in range(2)])
    assert torch.allclose(unweighted, per_sample.mean())
    # as Schaul et al. (2016) apply them: mean(w * loss), the sampler's weights normalised by the largest, so that
    # small weights shrink the update (TorchRL's own reduction, sum(w * loss) / sum(w), would undo that)
    for weights in (torch.tensor([1.0, 0.0]), torch.tensor([0.25, 1.0])):
        weighted = loss_module(batch.clone().set("priority_weight", weights))["loss"]
        assert torch.allclose(weighted, (weights * per_sample).mean())
        assert not torch.allclose(weighted, unweighted)
    ones = loss_module(batch.clone().set("priority_weight", torch.ones(2)))["loss"]
    assert torch.allclose(ones, unweighted)


def test_prioritized_replay_priorities_change_after_an_update():
    sampler = PrioritizedSampler(16, alpha=1.0, beta=0.5)
    replay_buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(16), sampler=sampler, batch_size=8, priority_key="td_error"
    )
    batch = transitions(
        list(range(16)), [0] * 16, [float(i) for i in range(16)], [0.0] * 16, [True] * 16, [False] * 16
    )
    replay_buffer.extend(batch)
    before = torch.as_tensor(sampler._sum_tree[torch.arange(16)]).clone()
    assert torch.allclose(before, before[0]), "new transitions start with equal (maximal) priority"
    sample = replay_buffer.sample()
    assert {"priority_weight", "index"} <= set(sample.keys())
    loss_module = dqn_loss(linear_q_actor())
    loss_module(sample)
    sample.set("td_error", sample.get("td_error").sqrt())
    replay_buffer.update_tensordict_priority(sample)
    after = torch.as_tensor(sampler._sum_tree[torch.arange(16)])
    index = sample.get("index")
    expected = (sample.get("td_error").squeeze(-1) + sampler._eps) ** sampler._alpha
    assert torch.allclose(after[index], expected.to(after.dtype), rtol=1e-5)
    assert not torch.allclose(after, before)


def test_prioritized_replay_without_torchrls_extension_is_one_clear_error(tmp_path, monkeypatch):
    from torchrl.data.replay_buffers.samplers import prioritized

    monkeypatch.setattr(prioritized, "SumSegmentTreeFp32", None)  # as when torchrl._torchrl fails to load
    with pytest.raises(
        InputError, match=r"Prioritized replay needs TorchRL's compiled extension.*--prioritized"
    ):
        dqn.main(tiny_dqn(tmp_path / "run", buffer__prioritized=True))
    assert not (tmp_path / "run" / "agent.ckpt").exists()


def test_n_step_targets_match_hand_computed_at_termination_and_truncation():
    gamma, n = 0.9, 3
    # one env, 7 steps: an episode terminates at step 2, the next is truncated at step 5 (final obs 50)
    rewards = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    observations = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 100.0]
    next_observations = [2.0, 3.0, 4.0, 20.0, 30.0, 50.0, 200.0]
    terminated = [False, False, True, False, False, False, False]
    truncated = [False, False, False, False, False, True, False]
    steps = transitions(observations, [0] * 7, rewards, next_observations, terminated, truncated).unsqueeze(0)
    n_step_returns = NStepReturns(n, gamma)
    stored = n_step_returns.inv(steps)  # the 4 transitions whose 3-step window is complete
    assert stored.shape == (1, 4)
    stored = stored.reshape(-1)
    targets = td_targets(dqn_loss(linear_q_actor(), gamma=gamma), stored)
    expected = [
        1 + gamma * 2 + gamma**2 * 3,  # the window ends in a termination: no bootstrap
        2 + gamma * 3,  # cut at the termination, never crossing into the next episode
        3.0,
        # the window ends in a truncation: bootstrap from the true final observation, max_a Q(50) = 100
        4 + gamma * 5 + gamma**2 * 6 + gamma**3 * 2 * 50.0,
    ]
    assert torch.allclose(targets, torch.tensor(expected), rtol=1e-5)
    assert stored.get("steps_to_next_obs").tolist() == [3, 2, 1, 3]
    # the next batch completes the remaining windows, which are cut at the truncation too
    more = transitions([200.0], [0], [8.0], [300.0], [False], [False]).unsqueeze(0)
    following = n_step_returns.inv(more).reshape(-1)
    assert following.get("observation").squeeze(-1).tolist() == [20.0]
    assert math.isclose(following.get(("next", "reward")).item(), 5 + gamma * 6, rel_tol=1e-6)
    assert following.get(("next", "truncated")).item() and not following.get(("next", "terminated")).item()


def seven_steps():
    return transitions(
        [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 100.0],
        [0] * 7,
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        [2.0, 3.0, 4.0, 20.0, 30.0, 50.0, 200.0],
        [False, False, True, False, False, False, False],
        [False, False, False, False, False, True, False],
    ).unsqueeze(0)


def test_n_step_returns_called_on_a_batch_gives_its_n_step_transitions():
    called, inverted = NStepReturns(3, 0.9)(seven_steps()), NStepReturns(3, 0.9).inv(seven_steps())
    assert called.shape == (1, 4)
    assert (called == inverted).all()
    assert called.get("steps_to_next_obs").tolist() == [[3, 2, 1, 3]]
    assert NStepReturns(3, 0.9)(seven_steps()[..., :3]) is None  # no window complete yet


def test_n_step_returns_extend_stores_what_the_losses_read():
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    n_step_returns = NStepReturns(3, 0.9)
    assert n_step_returns.extend(buffer, seven_steps().set("extra", torch.zeros(1, 7))) == 4
    stored = buffer[:]
    assert len(buffer) == 4 and "extra" not in stored and "gamma" not in stored
    assert stored.get("steps_to_next_obs").tolist() == [3, 2, 1, 3]
    one_step = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    assert NStepReturns(1, 0.9).extend(one_step, seven_steps()) == 7  # n = 1: every step, unchanged
    assert one_step[:].get(("next", "reward")).squeeze(-1).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_n_step_windows_pending_at_a_resume_with_new_episodes_end_there_as_truncations():
    """A resumed run whose envs start new episodes (their state was not saved): the saved windows close at the
    interrupted episode's last step, bootstrapping from its next observation, and never take in the new
    episode's first steps."""
    gamma, n = 0.9, 3
    interrupted = NStepReturns(n, gamma)
    interrupted.inv(seven_steps())  # the steps from observations 20, 30 and 100 wait for their windows
    resumed = NStepReturns(n, gamma)
    resumed.set_extra_state(interrupted.get_extra_state())
    resumed.end_episodes()
    new_episode = transitions(
        [1000.0, 1001.0, 1002.0, 1003.0],
        [0] * 4,
        [10.0] * 4,
        [1001.0, 1002.0, 1003.0, 1004.0],
        [False] * 4,
        [False] * 4,
    ).unsqueeze(0)
    stored = resumed.inv(new_episode).reshape(-1)
    assert stored.get("observation").squeeze(-1).tolist() == [20.0, 30.0, 100.0, 1000.0]
    assert stored.get(("next", "observation")).squeeze(-1).tolist() == [50.0, 50.0, 200.0, 1003.0]
    assert stored.get("steps_to_next_obs").tolist() == [2, 1, 1, 3]
    assert stored.get(("next", "truncated")).squeeze(-1).tolist() == [True, True, True, False]
    assert not stored.get(("next", "terminated")).any()
    targets = td_targets(dqn_loss(linear_q_actor(), gamma=gamma), stored)  # max_a Q(x) = 2x
    expected = [
        5 + gamma * 6 + gamma**2 * 2 * 50.0,  # cut at the truncation the interrupted run saw
        6 + gamma * 2 * 50.0,
        7 + gamma * 2 * 200.0,  # the last step before the interruption: truncated there
        10 + gamma * 10 + gamma**2 * 10 + gamma**3 * 2 * 1003.0,  # the new episode's own window
    ]
    assert torch.allclose(targets, torch.tensor(expected), rtol=1e-5)


def test_n_step_returns_refuses_to_be_a_replay_buffer_transform():
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(100), transform=NStepReturns(3, 0.9))
    with pytest.raises(RuntimeError, match="call it on each batch"):
        buffer.extend(seven_steps().reshape(-1))


def test_one_step_target_bootstraps_on_truncation_only():
    batch = transitions([1.0, 1.0], [0, 0], [1.0, 1.0], [3.0, 3.0], [True, False], [False, True])
    targets = td_targets(dqn_loss(linear_q_actor(), gamma=0.5), batch)
    assert torch.allclose(targets, torch.tensor([1.0, 1.0 + 0.5 * 6.0]))


def test_double_dqn_values_the_online_argmax_with_the_target_network():
    q_actor = linear_q_actor()
    loss_module = dqn_loss(q_actor, gamma=1.0, double_dqn=True)
    # make the target network prefer the other action: Q_target(s) = [3 s, s]
    with torch.no_grad():
        for key, value in loss_module.target_value_network_params.items(True, True):
            if key[-1] == "weight":
                value.copy_(torch.tensor([[3.0], [1.0]]))
    batch = transitions([0.0], [1], [0.0], [1.0], [False], [False])
    loss_module(batch)
    # the online net picks action 1 at s' = 1; the target net values it at 1 (not its own max, 3)
    assert torch.allclose(batch.get("td_error").squeeze(), torch.tensor(1.0))


def test_noisy_network_is_deterministic_in_evaluation_and_noisy_in_training():
    policy = make_q_actor(Unbounded(shape=(1, 4)), ACTION_SPEC, hidden_sizes=(16,), noisy=True)
    observation = TensorDict({"observation": torch.randn(5, 4)}, batch_size=[5])

    def q_values(exploration):
        with set_exploration_type(exploration):
            return policy(observation.clone()).get("action_value")

    deterministic = q_values(ExplorationType.DETERMINISTIC)
    noisy = q_values(ExplorationType.RANDOM)
    policy.apply(reset_noise)
    assert torch.equal(q_values(ExplorationType.DETERMINISTIC), deterministic)
    assert not torch.allclose(q_values(ExplorationType.RANDOM), noisy)
    assert not torch.allclose(noisy, deterministic)
    # acting draws new noise for every action (NoisyNet Algorithm 1), without an explicit reset
    assert not torch.allclose(q_values(ExplorationType.RANDOM), q_values(ExplorationType.RANDOM))
    # the loss trains the Q-value actor alone: calling it does not move the noise
    with set_exploration_type(ExplorationType.RANDOM):
        first, second = (policy[0](observation.clone()).get("action_value") for _ in range(2))
    assert torch.equal(first, second)


def tiny_dqn(output_dir, env_id="CartPole-v1", **options):
    run = RunConfig(
        env_id=env_id,
        num_envs=2,
        total_frames=256,
        eval_every=256,
        eval_episodes=2,
        output_dir=output_dir,
        logger="none",
        video=False,
        progress=False,
    )
    config = dqn.DQNConfig(
        run=run,
        collector=dqn.CollectorConfig(steps_per_env=16, updates_per_batch=2, learning_starts=64),
        buffer=dqn.BufferConfig(batch_size=16),
        network=dqn.NetworkConfig(hidden_sizes=(16,)),
    )
    for key, value in options.items():
        group, name = key.split("__") if "__" in key else (None, key)
        setattr(getattr(config, group) if group else config, name, value)
    return config


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"variant": "rainbow"},
        {"loss__double": True, "network__dueling": True},
        {"network__noisy": True, "buffer__n_steps": 4},
        {"buffer__prioritized": True, "loss__tau": 0.05},
    ],
    ids=["dqn", "rainbow", "double-dueling", "noisy-nstep", "prioritized-soft"],
)
def test_dqn_options_combine_train_and_reload(options, output_dir):
    summary = dqn.main(tiny_dqn(output_dir, **options))
    assert summary["frames"] == 256 and summary["algorithm"] == "dqn"
    agent = Agent.load(output_dir / "agent.ckpt")
    config = agent.config
    assert agent.policy_builder == "q_actor"
    observations = torch.randn(3, 4)
    assert agent.predict(observations).shape == (3,)
    assert (agent.predict(observations) == Agent.load(output_dir / "agent.ckpt").predict(observations)).all()
    if options.get("variant") == "rainbow":
        assert config["variant"] == "rainbow"
        assert agent.policy_kwargs["dueling"] and agent.policy_kwargs["noisy"]


def test_noisy_dqn_explores_without_epsilon_and_learns_its_noise_scale(output_dir):
    dqn.main(tiny_dqn(output_dir, network__noisy=True))
    agent = Agent.load(output_dir / "agent.ckpt")
    assert agent.policy[1].eps.item() == 0.0
    # the noise is on during updates, so the noise scales move away from their initial value
    initial = make_q_actor(Unbounded(shape=(1, 4)), ACTION_SPEC, hidden_sizes=(16,), noisy=True)
    initial_sigmas = {k: v for k, v in initial.named_parameters() if k.endswith("sigma")}
    trained_sigmas = {k: v for k, v in agent.policy.named_parameters() if k.endswith("sigma")}
    assert initial_sigmas.keys() == trained_sigmas.keys() and initial_sigmas
    for key, sigma in trained_sigmas.items():
        assert not torch.allclose(sigma, initial_sigmas[key]), key


def test_epsilon_anneals_to_its_final_value(output_dir):
    config = tiny_dqn(output_dir)
    config.exploration.exploration_fraction = 0.5
    dqn.main(config)
    assert Agent.load(output_dir / "agent.ckpt").policy[1].eps.item() == pytest.approx(0.04)


def test_box_action_space_is_refused_with_the_recipes_that_fit(output_dir):
    with pytest.raises(InputError, match="Discrete action space.*recipes.ppo"):
        dqn.main(tiny_dqn(output_dir, env_id="Pendulum-v1"))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"buffer__alpha": -1.0}, "--alpha"),
        ({"buffer__beta": 2.0}, "--beta"),
        ({"exploration__final_epsilon": 1.5}, "--final-epsilon"),
        ({"buffer__n_steps": 0}, "--n-steps"),
        ({"loss__tau": 0.0}, "--tau"),
    ],
)
def test_out_of_range_options_are_refused(options, message, output_dir):
    with pytest.raises(InputError, match=message):
        dqn.main(tiny_dqn(output_dir, **options))


def test_a_buffer_larger_than_memory_is_refused_before_its_sampler_is_built(output_dir, monkeypatch):
    def never(*args):
        raise AssertionError("the prioritized sampler was built")

    monkeypatch.setattr(dqn, "prioritized_sampler", never)
    with pytest.raises(
        InputError, match=r"--buffer-size 10,000,000,000,000 needs at least .* GiB .*lower --buffer-size"
    ):
        dqn.main(tiny_dqn(output_dir, buffer__prioritized=True, buffer__buffer_size=10**13))
    # 1 GiB of memory: 10^8 CartPole transitions need 3 GiB (two observations of 16 bytes each), and 2 more for
    # the priorities' trees (2^27 leaves, two float32 trees of twice as many nodes)
    monkeypatch.setattr("training.replay.physical_memory", lambda: 2**30)
    with pytest.raises(
        InputError, match=r"at least 5.0 GiB for the replay buffer and its priorities, more than .* 1.0 GiB"
    ):
        dqn.main(tiny_dqn(output_dir, buffer__prioritized=True, buffer__buffer_size=10**8))
    with pytest.raises(
        InputError, match=r"--buffer-size 100,000,000 needs at least 3.0 GiB for the replay buffer,"
    ):
        dqn.main(tiny_dqn(output_dir, buffer__buffer_size=10**8))


def test_atari_trains_with_a_buffer_smaller_than_one_collected_batch(output_dir):
    """As CartPole does (and TorchRL's storages): the buffer keeps the last transitions of the batch."""
    config = tiny_dqn(output_dir, env_id="ALE/Breakout-v5", collector__learning_starts=0)
    config.buffer.buffer_size, config.run.total_frames, config.run.eval_every = 20, 64, 10**6
    config.network.hidden_sizes = ()
    summary = dqn.main(config)
    assert summary["frames"] == 64


def test_cli_refuses_a_box_action_space_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "recipes.dqn", "--env-id", "Pendulum-v1", "--output-dir", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: DQN needs a Discrete action space")
    assert "recipes.sac" in lines[0] and "recipes.ppo" in lines[0]


def test_dqn_run_gives_no_conflicting_batch_size_warning(output_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dqn.main(tiny_dqn(output_dir, buffer__prioritized=False))
    assert not [warning for warning in caught if "conflicting batch_sizes" in str(warning.message)]


def test_the_target_copy_follows_the_loss_to_a_new_dtype_before_any_call():
    """A compiled forward cannot rebuild the target copy: moving the loss rebuilds it at once."""
    q_actor = linear_q_actor()
    loss_module = dqn_loss(q_actor, gamma=0.5).double()
    target = loss_module._target_network
    assert all(parameter.dtype == torch.float64 for parameter in target.parameters())
    target_tensors = {
        tensor.data_ptr() for tensor in loss_module.target_value_network_params.values(True, True)
    }
    assert {parameter.data_ptr() for parameter in target.parameters()} == target_tensors
    batch = transitions([1.0], [0], [1.0], [3.0], [False], [False]).apply(
        lambda tensor: tensor.double() if tensor.is_floating_point() else tensor
    )
    loss_module(batch)
    assert loss_module._target_network is target  # the call found it current


def test_the_target_network_of_a_noisy_dqn_draws_noise_of_its_own():
    torch.manual_seed(0)
    action_spec = Categorical(3, shape=(1,))
    q_actor = make_q_actor(Unbounded(shape=(1, 4)), action_spec, hidden_sizes=(16,), noisy=True)[0]
    loss_module = TensorDQNLoss(q_actor, action_space=action_spec)
    make_target_updater(loss_module, update_interval=1000)

    def epsilons(params):
        return {key: value.clone() for key, value in params.items(True, True) if key[-1].endswith("epsilon")}

    online, target = (
        epsilons(loss_module.value_network_params),
        epsilons(loss_module.target_value_network_params),
    )
    assert online and all(
        (target[key] == online[key]).all() for key in online
    )  # copied when the loss was made
    reset_target_noise(loss_module)
    new_online, new_target = (
        epsilons(loss_module.value_network_params),
        epsilons(loss_module.target_value_network_params),
    )
    assert all(
        (new_online[key] == online[key]).all() for key in online
    )  # the online network's noise is left alone
    assert all((new_target[key] != target[key]).any() for key in target)
    for key, value in new_target.items():  # factorised noise: each weight's epsilon is f(eps_out) f(eps_in)
        if key[-1] == "weight_epsilon":
            assert torch.linalg.matrix_rank(value) == 1


def test_epsilon_options_given_with_noisy_layers_are_named_as_unused(output_dir, tmp_path):
    """NoisyNet layers explore on their own (epsilon 0): exploration options the user gave are named as unused;
    those the env's preset filled in (CartPole-v1's final epsilon and fraction) are not."""
    options = {"network__noisy": True, "exploration__initial_epsilon": 0.9, "exploration__final_epsilon": 0.1}
    with pytest.warns(
        UserWarning, match=r"--initial-epsilon, --final-epsilon unused: --noisy layers explore"
    ):
        dqn.main(tiny_dqn(output_dir, **options))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dqn.main(tiny_dqn(tmp_path / "preset", network__noisy=True))
    assert not [warning for warning in caught if "unused: --noisy" in str(warning.message)]
