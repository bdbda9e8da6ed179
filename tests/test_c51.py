"""Distributional DQN (C51) and full Rainbow, independent-noise NoisyNets, and the multiplicative epsilon schedules."""

import pytest
import torch
from tensordict import TensorDict
from test_dqn import tiny_dqn
from torchrl.data import Categorical, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import NoisyLinear
from torchrl.objectives import DistributionalDQNLoss

from agents import Agent, ExplorationConfig, make_q_actor
from agents.qvalue import IndependentNoisyLinear, NStepDistributionalDQNLoss
from errors import InputError
from recipes import dqn
from training import Callback

OBSERVATION_SPEC, ACTION_SPEC = Unbounded(shape=(1, 4)), Categorical(3, shape=(1,))


def c51_actor(**options):
    """The epsilon-greedy C51 policy (``policy[0]`` is the ``DistributionalQValueActor`` the loss trains)."""
    options = {"hidden_sizes": (16,), "distributional": True, "num_atoms": 11, **options}
    return make_q_actor(OBSERVATION_SPEC, ACTION_SPEC, **options)


@pytest.mark.parametrize("dueling", [False, True])
def test_c51_actor_gives_log_probabilities_per_atom_and_acts_on_their_expectation(dueling):
    torch.manual_seed(0)
    actor = c51_actor(dueling=dueling, v_min=-5.0, v_max=5.0)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        output = actor(TensorDict(observation=torch.randn(6, 4), batch_size=[6]))
    log_probabilities = output.get("action_value")
    assert log_probabilities.shape == (6, 11, 3)
    torch.testing.assert_close(log_probabilities.exp().sum(-2), torch.ones(6, 3))
    expected = (log_probabilities.exp() * torch.linspace(-5, 5, 11).unsqueeze(-1)).sum(-2)
    assert torch.equal(output.get("action"), expected.argmax(-1))


def n_step_transitions(batch_size=8, terminated=False):
    return TensorDict(
        {
            "observation": torch.randn(batch_size, 4),
            "action": torch.randint(3, (batch_size,)),
            "steps_to_next_obs": torch.randint(1, 4, (batch_size,)),
            "next": {
                "observation": torch.randn(batch_size, 4),
                "reward": torch.randn(batch_size, 1),
                "done": torch.full((batch_size, 1), terminated),
                "terminated": torch.full((batch_size, 1), terminated),
                "truncated": torch.zeros(batch_size, 1, dtype=torch.bool),
            },
        },
        batch_size=[batch_size],
    )


def test_n_step_c51_loss_is_torchrl_loss_with_per_transition_discounts():
    torch.manual_seed(0)
    actor = c51_actor()[0]
    ours = NStepDistributionalDQNLoss(actor, gamma=0.9)
    theirs = DistributionalDQNLoss(actor, gamma=0.9)
    transitions = n_step_transitions()
    reference = transitions.clone()
    reference.set("steps_to_next_obs", reference.get("steps_to_next_obs").unsqueeze(-1))  # what TorchRL needs
    loss = ours(transitions)["loss"]
    torch.testing.assert_close(loss, theirs(reference)["loss"])
    torch.testing.assert_close(
        transitions.get("td_error"), reference.get("td_error")
    )  # written into the input
    assert transitions.get("td_error").shape == (8, 1) and (transitions.get("td_error") > 0).all()


def test_c51_target_of_a_terminal_transition_is_its_reward():
    """A terminal transition's target distribution sits on the atoms around its reward: the loss is the
    cross-entropy to those two atoms, weighted by where the reward falls between them."""
    torch.manual_seed(0)
    actor = c51_actor(v_min=0.0, v_max=10.0)[0]  # atoms 0, 1, ..., 10
    transitions = n_step_transitions(4, terminated=True)
    transitions.set(("next", "reward"), torch.tensor([[2.0], [2.25], [7.5], [20.0]]))  # 20: clipped to 10
    loss = NStepDistributionalDQNLoss(actor, gamma=0.99, reduction="none")(transitions.clone())["loss"]
    log_p = actor(transitions.clone()).get("action_value")[torch.arange(4), :, transitions.get("action")]
    expected = torch.stack(
        [
            -log_p[0, 2],
            -(0.75 * log_p[1, 2] + 0.25 * log_p[1, 3]),
            -0.5 * (log_p[2, 7] + log_p[2, 8]),
            -log_p[3, 10],
        ]
    )
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_atoms": 1}, "--num-atoms must be an integer in"),
        ({"v_min": 5.0, "v_max": 5.0}, "--v-min must be below --v-max"),
        ({"v_max": float("inf")}, "--v-min must be below --v-max"),
        ({"action_mask": True}, "--distributional does not take action masks"),
    ],
)
def test_bad_supports_and_masks_are_refused(options, message):
    with pytest.raises(InputError, match=message):
        c51_actor(**options)


def test_rainbow_is_every_option_with_c51_and_saves_and_reloads(output_dir):
    dqn.main(tiny_dqn(output_dir, variant="rainbow", network__v_min=0.0, network__v_max=50.0))
    agent = Agent.load(output_dir)
    kwargs = agent.policy_kwargs
    assert kwargs["distributional"] and kwargs["dueling"] and kwargs["noisy"]
    assert (kwargs["num_atoms"], kwargs["v_min"], kwargs["v_max"]) == (51, 0.0, 50.0)
    torch.testing.assert_close(agent.policy[0].support, torch.linspace(0, 50, 51))
    observations = torch.randn(5, 4)
    assert (agent.predict(observations) == Agent.load(output_dir).predict(observations)).all()
    with pytest.raises(InputError, match="--v-min must be below"):
        dqn.main(
            tiny_dqn(
                output_dir / "other", network__distributional=True, network__v_min=20.0, network__v_max=10.0
            )
        )


def test_independent_noise_draws_one_sample_per_weight():
    torch.manual_seed(0)
    independent, factorised = IndependentNoisyLinear(6, 5), NoisyLinear(6, 5)
    assert torch.linalg.matrix_rank(independent.weight_epsilon) > 1  # factorised noise is an outer product
    assert torch.linalg.matrix_rank(factorised.weight_epsilon) == 1
    assert (independent.weight_sigma == 0.017).all() and independent.weight_mu.abs().max() <= (3 / 6) ** 0.5
    before = independent.weight_epsilon.clone()
    independent.reset_noise()
    assert not torch.equal(before, independent.weight_epsilon)


def test_noisy_type_reaches_the_saved_network(output_dir):
    dqn.main(
        tiny_dqn(output_dir, network__noisy=True, network__noisy_type="independent", network__dueling=True)
    )
    agent = Agent.load(output_dir)
    layers = [module for module in agent.policy.modules() if isinstance(module, NoisyLinear)]
    assert layers and all(type(layer) is IndependentNoisyLinear for layer in layers)


class Epsilons(Callback):
    def __init__(self):
        self.seen = []  # (frames, finished episodes, epsilon for the next batch)

    def on_batch(self, run, batch, metrics):
        self.seen.append((batch.numel(), int(batch.get(("next", "done")).sum()), metrics["train/epsilon"]))


@pytest.mark.parametrize("unit", ["step", "episode"])
def test_multiplicative_epsilon_decays_per_step_or_episode_down_to_its_floor(output_dir, unit):
    epsilons = Epsilons()
    config = tiny_dqn(output_dir, run__total_frames=2_048)
    config.exploration = ExplorationConfig(
        final_epsilon=0.2, epsilon_schedule="multiplicative", epsilon_decay=0.99, epsilon_decay_unit=unit
    )
    dqn.main(config, callbacks=[epsilons])
    epsilon = 1.0
    for frames, episodes, logged in epsilons.seen:
        epsilon = max(0.2, epsilon * 0.99 ** (frames if unit == "step" else episodes))
        assert logged == pytest.approx(epsilon)
    assert epsilons.seen[-1][2] == pytest.approx(0.2 if unit == "step" else epsilon)
    assert epsilons.seen[-1][2] < 1.0


def test_epsilon_schedule_options_are_checked():
    with pytest.raises(InputError, match="--epsilon-decay must be in"):
        ExplorationConfig(epsilon_decay=0.0).validate()
    with pytest.raises(InputError, match="--epsilon-schedule must be one of linear, multiplicative"):
        ExplorationConfig(epsilon_schedule="cosine").validate()


@pytest.mark.learning
@pytest.mark.parametrize(("variant", "frames"), [("c51", 30_000), ("rainbow", 50_000)])
def test_c51_and_rainbow_learn_cartpole(output_dir, variant, frames):
    """The CartPole preset (v_min 0, v_max 100): C51 reached 475 at 14,336 frames, Rainbow at 32,768 (seed 0)."""
    config = dqn.DQNConfig()
    config.run.total_frames, config.run.output_dir, config.run.seed = frames, output_dir, 0
    config.run.logger, config.run.video, config.run.progress = "none", False, False
    if variant == "rainbow":
        config.variant = "rainbow"
    else:
        config.network.distributional = True
    summary = dqn.main(config)
    assert summary["solved_at_frames"] is not None and summary["best_eval_return_mean"] >= 475
