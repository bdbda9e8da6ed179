"""Action masks (Gymnasium's ``info["action_mask"]``): the env layer's ``"action_mask"``, masked PPO/A2C policies
and DQN's greedy, random and bootstrap actions, the agent's predict and evaluate, and learning on a masked task
(``tests/masked_env.py``: a forbidden action costs 10 and ends the episode)."""

import masked_env  # noqa: F401 - registers PickAllowed-v0
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from agents import Agent, TensorDQNLoss
from agents.networks import make_actor
from agents.qvalue import make_q_actor
from envs import make_env
from errors import InputError
from recipes import a2c, dqn, es, ppo, sac
from training import quiet

ENV_ID = "masked_env:PickAllowed-v0"


def random_masks(batch, actions=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    masks = torch.rand(batch, actions, generator=generator) < 0.5
    masks[~masks.any(-1), 0] = True
    return masks


def test_the_env_gives_each_observations_mask_and_the_final_one_at_an_episode_end():
    env = make_env(ENV_ID, 4, seed=0)
    assert "action_mask" in env.observation_spec.keys()  # noqa: SIM118 - a Composite spec
    rollout = env.rollout(40, break_when_any_done=False)  # random actions: many end episodes with a penalty
    assert rollout["next", "done"].any()
    # in this env the observation is the mask: each mask belongs to the observation beside it, the final
    # observation's under "next" of a finished episode, the reset one's at the next step's root
    assert torch.equal(rollout["action_mask"], rollout["observation"].bool())
    assert torch.equal(rollout["next", "action_mask"], rollout["next", "observation"].bool())
    env.close()
    plain = make_env("CartPole-v1", 2, seed=0)
    assert "action_mask" not in plain.observation_spec.keys()  # noqa: SIM118 - a Composite spec
    plain.close()


def test_a_masked_policy_samples_scores_and_takes_its_mode_among_the_allowed_actions():
    env = make_env(ENV_ID, 2, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, action_mask=True)
    masks = random_masks(500)
    inputs = TensorDict(observation=masks.float(), action_mask=masks, batch_size=[500])
    with set_exploration_type(ExplorationType.RANDOM):
        sampled = actor(inputs.clone())
    assert masks.gather(-1, sampled["action"].unsqueeze(-1)).all()
    assert torch.isfinite(sampled["action_log_prob"]).all()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        greedy = actor(inputs.clone())["action"]
    assert masks.gather(-1, greedy.unsqueeze(-1)).all()
    env.close()


def test_dqn_acts_and_bootstraps_among_the_allowed_actions():
    env = make_env(ENV_ID, 2, seed=0)
    policy = make_q_actor(env.observation_spec["observation"], env.action_spec, epsilon=1.0, action_mask=True)
    masks = random_masks(500)
    inputs = TensorDict(observation=masks.float(), action_mask=masks, batch_size=[500])
    for exploration in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):  # all random, then greedy
        with set_exploration_type(exploration):
            actions = policy(inputs.clone())["action"]
        assert masks.gather(-1, actions.unsqueeze(-1)).all()

    loss = TensorDQNLoss(policy[0], action_space=env.action_spec, delay_value=True)
    loss.make_value_estimator(gamma=0.5)
    next_masks = random_masks(500, seed=1)
    batch = TensorDict(
        observation=masks.float(),
        action=torch.zeros(500, dtype=torch.int64),
        next=TensorDict(
            observation=next_masks.float(),
            action_mask=next_masks,
            reward=torch.zeros(500, 1),
            done=torch.zeros(500, 1, dtype=torch.bool),
            terminated=torch.zeros(500, 1, dtype=torch.bool),
            batch_size=[500],
        ),
        batch_size=[500],
    )
    loss(batch)
    with torch.no_grad():
        chosen = loss._q_network(masks.float())[:, 0]  # the online value of action 0, the one taken
        next_values = loss._target()(next_masks.float()).masked_fill(~next_masks, -torch.inf)
        target = 0.5 * next_values.max(-1).values  # the best allowed next action, not the best of all
    torch.testing.assert_close(batch["td_error"].squeeze(-1), (chosen - target).pow(2))
    env.close()


def test_a_masked_agent_predicts_and_evaluates_with_the_envs_masks(output_dir):
    config = ppo.PPOConfig()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=256, num_envs=4, preset="none")
    config.collector.steps_per_env, config.optim.minibatch_size = 64, 64
    ppo.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")
    assert agent.policy_kwargs["action_mask"] is True
    # sampled actions of a barely trained policy: never a forbidden one, so every episode lasts its ten steps
    result = agent.evaluate(episodes=10, seed=0, deterministic=False)
    assert result.lengths.tolist() == [10] * 10
    mask = np.array([0, 1, 0, 0], np.int8)
    assert agent.predict(mask.astype(np.float32), deterministic=False, action_mask=mask) == 1
    actions = agent.predict(np.ones((3, 4), np.float32), action_mask=np.eye(4, dtype=bool)[[2, 0, 3]])
    assert actions.tolist() == [2, 0, 3]
    # a mask that allows nothing (a terminal state's) allows everything, and the caller's array stays as it was
    one, three = np.zeros(4, bool), np.zeros((3, 4), bool)
    agent.predict(np.ones(4, np.float32), action_mask=one)
    agent.predict(np.ones((3, 4), np.float32), action_mask=three)
    assert not one.any() and not three.any()
    for masks in (mask, np.tile(mask, 3)):  # one mask, or a flat run of them, for a batch of three
        with pytest.raises(
            InputError, match=rf"action_mask of shape \({masks.size},\) for 3 observations: pass one row"
        ):
            agent.predict(np.ones((3, 4), np.float32), action_mask=masks)


@pytest.mark.parametrize(
    ("recipe", "config_type", "name"), [(sac, sac.SACConfig, "SAC"), (es, es.ESConfig, "ES")]
)
def test_recipes_whose_policies_cannot_take_masks_refuse_a_masked_env(recipe, config_type, name, output_dir):
    config = config_type()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=256, num_envs=4, preset="none")
    with pytest.raises(
        InputError, match=f"which {name} cannot take: its policy would pick disallowed actions"
    ):
        recipe.main(config)
    assert not (output_dir / "agent.ckpt").exists()


def test_an_agent_trained_without_masks_refuses_one_in_predict(output_dir):
    config = ppo.PPOConfig()
    quiet(config, output_dir, total_frames=64, num_envs=2, preset="none")
    config.collector.steps_per_env, config.optim.minibatch_size = 32, 32
    ppo.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")
    with pytest.raises(InputError, match="this ppo agent was trained without them"):
        agent.predict(np.zeros(4, np.float32), action_mask=np.array([1, 0], bool))
    assert agent.predict(np.zeros(4, np.float32)) in (0, 1)


@pytest.mark.learning
@pytest.mark.parametrize(
    ("main", "config_type"), [(ppo.main, ppo.PPOConfig), (a2c.main, a2c.A2CConfig), (dqn.main, dqn.DQNConfig)]
)
def test_masked_recipes_learn_to_pick_the_highest_allowed_action(main, config_type, output_dir):
    config = config_type()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=20_000, eval_every=5_000, preset="none")
    summary = main(config)
    assert summary["eval_return_mean"] >= 9.5  # 10 is perfect; a forbidden action would cost 10


def test_n_step_transitions_keep_the_mask_of_their_bootstrap_observation():
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    from agents import NStepReturns

    env = make_env(ENV_ID, 4, seed=0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    n_step_returns = NStepReturns(3, 0.9)
    for _ in range(4):
        n_step_returns.extend(buffer, env.rollout(16, break_when_any_done=False))
    stored = buffer[: len(buffer)]
    assert len(buffer) > 0 and "action_mask" in stored["next"].keys()  # noqa: SIM118 - TensorDict
    # the observation here is the mask: the next mask is that of the observation the n-step return bootstraps from
    assert torch.equal(stored["next", "action_mask"], stored["next", "observation"].bool())
    env.close()


def test_a_dict_observations_action_mask_entry_masks_the_policy(output_dir):
    env = make_env("masked_env:PickAllowedDict-v0", 2, seed=0)
    rollout = env.rollout(20, break_when_any_done=False)
    assert torch.equal(rollout["action_mask"], rollout["observation", "action_mask"].bool())
    assert torch.equal(rollout["next", "action_mask"], rollout["next", "observation", "action_mask"].bool())
    env.close()
    config = ppo.PPOConfig()
    quiet(
        config,
        output_dir,
        env_id="masked_env:PickAllowedDict-v0",
        total_frames=256,
        num_envs=4,
        preset="none",
    )
    config.collector.steps_per_env, config.optim.minibatch_size = 64, 64
    ppo.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")
    assert agent.evaluate(episodes=10, seed=0, deterministic=False).lengths.tolist() == [10] * 10
    observation = {"observation": np.zeros(4, np.float32), "action_mask": np.array([0, 0, 1, 0], np.int8)}
    assert agent.predict(observation, deterministic=False) == 2  # the observation's own mask
