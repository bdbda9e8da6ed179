"""Recurrent policies (--recurrent lstm|gru): the state carried by the env, sequences in the loss that reproduce
what the policy did while collecting, advantages from the stored states, the agent's memory in predict and
evaluate, checkpoints, bad input, and learning a task that needs memory."""

import math

import numpy as np
import pytest
import torch
from run_helpers import tiny_a2c, tiny_ppo, tiny_rnd_ppo, with_options
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives.value.functional import generalized_advantage_estimate

from agents import Agent, OneCallGAE, TensorClipPPOLoss, make_actor, make_recurrent_critic
from agents.recurrent import (
    IS_INIT_KEY,
    initial_state,
    make_recurrent_env,
    recurrent_trunk,
    sequences,
    state_shapes,
)
from envs import make_env
from errors import InputError
from recipes import a2c, ppo, rnd_ppo

MEMORY_TASK = "rlkit/CartPoleNoVelocity-v1"


def collected(kind, num_envs=3, frames=120, seed=0):
    """A recurrent actor and critic, and a batch its collector gathered (episodes end inside it)."""
    torch.manual_seed(seed)
    env = make_env(MEMORY_TASK, num_envs=num_envs, seed=seed)
    actor = make_actor(
        env.observation_spec["observation"], env.action_spec, [16], recurrent=kind, recurrent_size=8
    )
    critic = make_recurrent_critic(actor, [16])
    env = make_recurrent_env(env, actor)
    collector = Collector(
        env, actor, frames_per_batch=frames, total_frames=frames, auto_register_policy_transforms=False
    )
    batch = next(iter(collector))
    collector.shutdown()
    return actor, critic, batch


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_env_carries_the_state_and_resets_it_at_episode_starts(kind):
    actor, _, batch = collected(kind)
    is_init = batch.get(IS_INIT_KEY).squeeze(-1)
    assert is_init[:, 0].all() and is_init[:, 1:].any(), "episodes restart inside the batch"
    done = batch.get(("next", "done")).squeeze(-1)
    assert torch.equal(is_init[:, 1:], done[:, :-1])
    for key in state_shapes(actor):
        state, next_state = batch.get(key), batch.get(("next", key))
        assert (state[is_init] == 0).all(), "a new episode starts from zeros"
        assert (state[~is_init].abs().sum((-1, -2)) > 0).all()
        continuing = ~done[:, :-1]
        assert torch.equal(state[:, 1:][continuing], next_state[:, :-1][continuing])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("length", [40, 10])
def test_sequences_in_recurrent_mode_reproduce_the_collected_log_probabilities(kind, length):
    """Slices of consecutive steps, run from the state stored at their first step and restarted at each episode
    start inside them, give the policy the collector acted with: the same log-probabilities of its actions."""
    actor, _, batch = collected(kind)
    slices = sequences(batch, length)
    assert slices.shape == (3 * 40 // length, length)
    with set_recurrent_mode(True):
        distribution = actor.get_dist(slices.clone())
    log_prob = distribution.log_prob(slices.get("action"))
    torch.testing.assert_close(log_prob, slices.get("action_log_prob"), rtol=0, atol=1e-5)
    # without the stored states (every slice from zeros) they differ: the test can fail
    zeroed = slices.clone()
    for key in state_shapes(actor):
        zeroed.set(key, torch.zeros_like(zeroed.get(key)))
    with set_recurrent_mode(True):
        wrong = actor.get_dist(zeroed).log_prob(slices.get("action"))
    assert not torch.allclose(wrong, slices.get("action_log_prob"), atol=1e-4) or length == 40


def test_a_saturated_recurrent_tanh_normal_policys_sequences_are_rescored_as_the_loss_scores_them():
    """The collector scores a tanh-normal policy's pre-tanh draws; the loss scores the actions, through atanh of
    the clamped action. Rescored in recurrent mode, sequence by sequence, the stored log-probabilities become the
    loss's, so that a recurrent PPO's first importance ratios are 1."""
    torch.manual_seed(0)
    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, [16], recurrent="lstm")
    critic = make_recurrent_critic(actor, [16])
    with torch.no_grad():  # a pre-tanh mean of 8: many draws pass the clamp just inside the bound
        [linear for linear in actor.modules() if isinstance(linear, torch.nn.Linear)][-1].bias.fill_(8.0)
    env = make_recurrent_env(env, actor)
    collector = Collector(
        env, actor, frames_per_batch=80, total_frames=80, auto_register_policy_transforms=False
    )
    batch = next(iter(collector))
    collector.shutdown()
    slices = sequences(batch, 10)
    with torch.no_grad(), set_recurrent_mode(True):
        scored = actor.get_dist(slices.copy()).log_prob(slices.get("action"))
    stored = slices.get("action_log_prob").clone()
    assert ((scored - stored).abs() > 1e-3).float().mean() > 0.1  # the collector's scores of its draws
    TensorClipPPOLoss(actor, critic, functional=False).rescore_squashed_actions(slices, sequences=True)
    torch.testing.assert_close(slices.get("action_log_prob"), scored, rtol=0, atol=1e-5)


def test_recurrent_ppo_on_box_actions_starts_each_batch_at_importance_ratios_of_1(tmp_path, monkeypatch):
    """The recipe rescores its sequences: at the first gradient step of each batch the policy has not moved, so
    no ratio is clipped and the KL estimate is 0, also where the policy's draws pass the atanh clamp."""
    first_steps = []
    step = ppo.Learner.step

    def recording_step(self, minibatch):
        metrics, norm = step(self, minibatch)
        first_steps.append((float(metrics["clip_fraction"]), float(metrics["kl_approx"])))
        return metrics, norm

    monkeypatch.setattr(ppo.Learner, "step", recording_step)
    options = {
        "network.recurrent": "lstm",
        "network.log_std_init": 2.5,  # wide draws: many pass the clamp
        "collector.steps_per_env": 64,
        "optim.minibatch_size": 128,  # a batch of 2 envs x 64 steps is one minibatch: every step is a first
        "optim.num_epochs": 1,
    }
    run = {"env_id": "Pendulum-v1", "num_envs": 2, "total_frames": 384, "eval_every": 10**6}
    ppo.main(with_options(tiny_ppo(tmp_path / "run", **run), options))
    assert len(first_steps) == 3
    assert all(clip == 0.0 and abs(kl) < 1e-5 for clip, kl in first_steps), first_steps


def test_the_loss_runs_the_shared_trunk_once_per_minibatch_with_the_same_gradients(monkeypatch):
    """Actor and critic share the encoder and the recurrent layer: in a PPO loss the critic's call reuses the
    actor's (one forward and one backward through the trunk) and the gradients are those of two separate calls."""
    actor, critic, batch = collected("lstm")
    with torch.no_grad():
        OneCallGAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)(batch)
    minibatch = sequences(batch, 20)
    loss_module = TensorClipPPOLoss(actor, critic, functional=False)
    trunk = recurrent_trunk(actor)
    calls = []
    trunk.layer.register_forward_hook(lambda *args: calls.append(1))

    def gradients():
        loss_module.zero_grad()
        with set_recurrent_mode(True):
            losses = loss_module(minibatch.clone())
        sum(losses[key] for key in ("loss_objective", "loss_critic")).backward()
        return {name: p.grad.clone() for name, p in loss_module.named_parameters() if p.grad is not None}

    shared = gradients()
    assert len(calls) == 1 and trunk._memo is None, "one trunk call; the backward pass dropped its outputs"
    monkeypatch.setattr("agents.recurrent._same_key", lambda old, new: False)  # every call runs the trunk
    separate = gradients()
    assert len(calls) == 3
    assert shared.keys() == separate.keys()
    for name in shared:
        torch.testing.assert_close(shared[name], separate[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_trunk_reruns_after_its_parameters_or_inputs_change():
    actor, critic, batch = collected("gru")
    trunk = recurrent_trunk(actor)
    calls = []
    trunk.layer.register_forward_hook(lambda *args: calls.append(1))
    data = batch.reshape(-1)[:8].clone()
    actor(data)
    critic(data)
    assert len(calls) == 1
    with torch.no_grad():  # as an optimizer step does: the parameters' versions change
        next(trunk.parameters()).add_(0.01)
    critic(data)
    assert len(calls) == 2
    data.get("observation").mul_(2.0)  # the same tensor, changed in place
    critic(data)
    assert len(calls) == 3
    with torch.no_grad():  # no gradients: nothing kept, every call runs
        critic(data)
        critic(data)
    assert len(calls) == 5


def test_advantages_of_a_recurrent_critic_use_each_steps_stored_state():
    _, critic, batch = collected("lstm")
    with torch.no_grad():
        OneCallGAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)(batch)
        values = critic(batch.select(*critic.in_keys).reshape(-1)).get("state_value").reshape(3, 40, 1)
        next_values = critic(batch.get("next").select(*critic.in_keys).reshape(-1)).get("state_value")
    advantage, _ = generalized_advantage_estimate(
        0.9,
        0.8,
        values,
        next_values.reshape(3, 40, 1),
        batch.get(("next", "reward")),
        batch.get(("next", "done")),
        batch.get(("next", "terminated")),
        time_dim=1,
    )
    torch.testing.assert_close(batch.get("advantage"), advantage, rtol=1e-5, atol=1e-5)


def test_agent_predict_keeps_the_state_between_calls(tmp_path):
    env = make_env(MEMORY_TASK, num_envs=1)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, [16], recurrent="lstm")
    agent = Agent(
        actor,
        MEMORY_TASK,
        env.single_observation_space,
        env.single_action_space,
        "ppo",
        policy_kwargs={"hidden_sizes": [16], "recurrent": "lstm", "recurrent_size": 64},
    )
    assert agent.recurrent and agent.state is None
    observations = np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32)
    logits = []

    def remembered(observation):  # the policy's logits for this observation from the kept state
        state = agent.state if agent.state is not None else initial_state(actor, 1)
        inputs = TensorDict({"observation": torch.as_tensor(observation)[None]}, [1]).update(state)
        return actor.module[0](inputs).get("logits")

    for observation in observations:
        logits.append(remembered(observation))
        agent.predict(observation)
    assert agent.state["recurrent_state_h"].shape == (1, 1, 64)
    assert not torch.allclose(logits[5], logits[6])
    kept = agent.state.clone()
    first = agent.predict(observations[0])
    agent.reset_state()
    fresh = agent.predict(observations[0])
    assert fresh == agent.predict(observations[0], state=initial_state(actor, 1), episode_start=True)
    assert first == agent.predict(observations[0], state=kept)
    # a batch of envs: one state per row; episode_start restarts the rows it marks
    agent.reset_state()
    agent.predict(observations[:4])
    assert agent.state["recurrent_state_h"].shape == (4, 1, 64)
    agent.predict(observations[4:8], episode_start=[True, False, False, True])
    with pytest.raises(InputError, match="after a batch of another size, call reset_state"):
        agent.predict(observations[0])
    with pytest.raises(InputError, match="one flag per observation"):
        agent.predict(observations[:4], episode_start=[True, False])
    agent.reset_state()  # checked with no state kept too
    with pytest.raises(InputError, match=r"one flag per observation \(2\), got 3"):
        agent.predict(observations[:2], episode_start=[True, False, True])
    with pytest.raises(InputError, match="episode_start takes bools"):
        agent.predict(observations[:2], episode_start="banana")
    agent.predict(observations[:2], episode_start=[1, 0])  # 0 and 1 are flags too
    agent.predict(observations[:2], episode_start=np.array([1.0, 0.0], dtype=np.float32))  # dones as floats
    with pytest.raises(InputError, match="episode_start takes bools"):
        agent.predict(observations[:2], episode_start=[0.5, 0.0])
    agent.reset_state()
    with pytest.raises(InputError, match="a mapping with the entries"):
        agent.predict(observations[0], state=[1, 2])
    # save and load: the same actions from the same observations
    agent.reset_state()
    path = agent.save(tmp_path / "agent.ckpt")
    loaded = Agent.load(path)
    assert loaded.recurrent
    assert [agent.predict(o) for o in observations] == [loaded.predict(o) for o in observations]
    assert (
        agent.evaluate(episodes=3, seed=0).lengths.tolist()
        == loaded.evaluate(episodes=3, seed=0).lengths.tolist()
    )
    recorded = loaded.evaluate(episodes=2, seed=0, video_path=tmp_path / "episode.mp4")
    assert (tmp_path / "episode.mp4").stat().st_size > 0
    assert recorded.lengths.tolist() == loaded.evaluate(episodes=2, seed=0).lengths.tolist()


def test_agents_without_memory_refuse_a_state(output_dir):
    ppo.main(tiny_ppo(output_dir))
    agent = Agent.load(output_dir)
    assert not agent.recurrent
    with pytest.raises(InputError, match="state and episode_start are for recurrent agents"):
        agent.predict(np.zeros(4, dtype=np.float32), episode_start=True)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_ppo_and_a2c_train_and_evaluate_recurrent_policies(kind, tmp_path):
    config = tiny_ppo(tmp_path / "ppo", env_id=MEMORY_TASK)
    config.network.recurrent, config.network.recurrent_size, config.optim.sequence_length = kind, 16, 8
    summary = ppo.main(config)
    assert summary["frames"] == 2048 and math.isfinite(summary["eval_return_mean"])
    agent = Agent.load(tmp_path / "ppo")
    assert agent.recurrent and agent.policy_kwargs["recurrent"] == kind
    assert len(agent.evaluate(episodes=2, seed=0).returns) == 2
    config = tiny_a2c(tmp_path / "a2c", env_id=MEMORY_TASK)
    config.network.recurrent = kind
    assert a2c.main(config)["frames"] >= 2048
    assert Agent.load(tmp_path / "a2c").recurrent


@pytest.mark.parametrize(
    "change, message",
    [
        ({"optim.sequence_length": 8}, "--sequence-length is for recurrent policies"),
        (
            {"network.recurrent": "lstm", "optim.sequence_length": 12},
            "must be a multiple of --sequence-length",
        ),
        ({"network.recurrent": "lstm", "optim.sequence_length": 0}, "--sequence-length must be a positive"),
        (
            {"network.recurrent": "lstm", "collector.steps_per_env": 31},
            "--steps-per-env 31 and --minibatch-size 64 leave recurrent sequences of length 1",
        ),
        ({"network.recurrent": "lstm", "network.recurrent_size": 0}, "--recurrent-size must be a positive"),
        ({"network.recurrent": "rnn"}, "--recurrent must be one of lstm, gru"),
        ({"network.recurrent_size": 128}, "--recurrent-size 128 only applies with --recurrent lstm or gru"),
        ({"network.recurrent": "lstm", "run.compile": True}, "--recurrent does not combine with --compile"),
        (
            {"network.recurrent": "lstm", "run.collector_backend": "multiprocess"},
            "--recurrent keeps a recurrent state beside the training env",
        ),
    ],
)
def test_recurrent_options_that_do_not_combine_are_one_clear_error(change, message, output_dir):
    config = with_options(tiny_ppo(output_dir), change)
    with pytest.raises(InputError, match=message):
        ppo.main(config)
    assert not output_dir.exists() or not (output_dir / "agent.ckpt").exists()


def test_rnd_ppo_and_a2c_refuse_what_they_cannot_do(output_dir):
    config = tiny_rnd_ppo(output_dir)
    config.network.recurrent = "lstm"
    with pytest.raises(InputError, match="--recurrent is a PPO option that recipes.rnd_ppo does not support"):
        rnd_ppo.main(config)
    config = tiny_a2c(output_dir)
    config.network.recurrent, config.network.shared_network = "gru", True
    with pytest.raises(InputError, match="drop --shared-network"):
        a2c.main(config)
    config = tiny_a2c(output_dir)
    config.network.recurrent_size = 32
    with pytest.raises(InputError, match="--recurrent-size 32 only applies with --recurrent"):
        a2c.main(config)
    config.run.resume = output_dir  # a run saved before the refusal keeps its options
    config.validate()


@pytest.mark.learning
def test_ppo_with_memory_solves_cartpole_without_velocities_and_without_memory_does_not(tmp_path):
    """Positions alone do not tell which way the pole is falling: PPO with the env's preset (an LSTM) reaches the
    threshold (475; at 80k frames on seed 0, about a minute here), and in as many frames the same settings
    without memory stay far below it."""

    def config(output_dir, **network):  # python -m recipes.ppo --env-id MEMORY_TASK, quietly
        config = ppo.PPOConfig()
        config.run.env_id, config.run.output_dir = MEMORY_TASK, output_dir
        config.run.logger, config.run.video, config.run.progress = "none", False, False
        for name, value in network.items():
            setattr(config.network, name, value)
        return config

    with_memory = ppo.main(config(tmp_path / "lstm"))
    assert with_memory["solved_at_frames"] is not None, with_memory
    assert Agent.load(tmp_path / "lstm").policy_kwargs["recurrent"] == "lstm"
    memoryless = config(tmp_path / "none", recurrent=None)
    memoryless.run.total_frames = with_memory["frames"]
    without = ppo.main(memoryless)
    assert without["best_eval_return_mean"] < 200, without
