"""TensorClipPPOLoss gives ClipPPOLoss's outputs and gradients, from the same random draws."""

import pytest
import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from agents import input_encoder, make_actor, make_critic, make_gsde_actor
from agents.ppo_loss import TensorClipPPOLoss
from envs import make_env

CASES = {
    "categorical": ("CartPole-v1", {}, {}),
    "categorical, entropy bonus, clipped value": (
        "CartPole-v1",
        {},
        {"entropy_bonus": True, "entropy_coeff": 0.01, "clip_value": 0.2},
    ),
    "tanh-normal, sampled entropy": ("Pendulum-v1", {}, {"entropy_bonus": True, "entropy_coeff": 0.001}),
    "unsquashed normal, normalised observations, raw advantage": (
        "Pendulum-v1",
        {"squash": False, "normalize_obs": True},
        {"normalize_advantage": False, "loss_critic_type": "smooth_l1"},
    ),
    "unsquashed normal, entropy bonus": (
        "Pendulum-v1",
        {"squash": False},
        {"entropy_bonus": True, "entropy_coeff": 0.01},
    ),
}


def minibatch(env_id, actor_options):
    torch.manual_seed(0)
    env = make_env(env_id, num_envs=4, seed=0)
    spec = env.observation_spec["observation"]
    actor = make_actor(spec, env.action_spec, **actor_options)
    critic = make_critic(spec, encoder=input_encoder(actor))
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        batch = env.rollout(16, actor, break_when_any_done=False)
        GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)(batch)
    env.close()
    return actor, critic, batch.reshape(-1)


@pytest.mark.parametrize("name", CASES)
def test_losses_and_gradients_equal_the_parents(name):
    env_id, actor_options, loss_options = CASES[name]
    actor, critic, batch = minibatch(env_id, actor_options)
    options = {"clip_epsilon": 0.2, "critic_coeff": 0.5, "normalize_advantage": True, "entropy_bonus": False}
    options |= {"loss_critic_type": "l2"} | loss_options
    results = []
    for loss_class in (ClipPPOLoss, TensorClipPPOLoss):
        loss = loss_class(actor, critic, functional=False, **options)
        if loss_class is TensorClipPPOLoss:
            assert loss._networks is not None  # the tensor path, not the parent's
        actor.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        torch.manual_seed(3)  # the sampled entropy of a tanh-normal policy draws actions
        output = loss(batch.clone())
        total = sum(output[key] for key in output.keys() if key.startswith("loss_"))  # noqa: SIM118 - a TensorDict
        total.backward()
        gradients = {name: p.grad.clone() for name, p in loss.named_parameters() if p.grad is not None}
        results.append((output.detach(), gradients))
    (expected, expected_gradients), (output, gradients) = results
    assert list(output.keys()) == list(expected.keys())
    for key in expected.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch dimension
        torch.testing.assert_close(output[key], expected[key], rtol=0, atol=0, msg=key)
    assert gradients.keys() == expected_gradients.keys() and gradients
    for parameter, gradient in expected_gradients.items():
        torch.testing.assert_close(gradients[parameter], gradient, rtol=0, atol=0, msg=parameter)


def test_a_policy_it_does_not_cover_takes_the_parents_path():
    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    spec = env.observation_spec["observation"]
    gsde = make_gsde_actor(spec, env.action_spec)
    loss = TensorClipPPOLoss(gsde, make_critic(spec), functional=False)
    assert loss._networks is None
    env.close()


def test_without_diagnostics_the_losses_are_the_same_and_only_the_diagnostics_go():
    actor, critic, batch = minibatch("CartPole-v1", {})
    options = {"clip_epsilon": 0.2, "critic_coeff": 0.5, "entropy_bonus": True, "entropy_coeff": 0.01}
    full = TensorClipPPOLoss(actor, critic, functional=False, **options)(batch.clone())
    lean = TensorClipPPOLoss(
        actor, critic, functional=False, diagnostics=False, log_explained_variance=False, **options
    )(batch.clone())
    left_out = {"ESS", "max_ratio", "mean_ratio", "explained_variance"}
    assert set(full.keys()) - set(lean.keys()) == left_out
    for key in lean.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch dimension
        torch.testing.assert_close(lean[key], full[key], rtol=0, atol=0, msg=key)


def test_a_categorical_entropy_that_is_not_finite_takes_the_parents_answer(monkeypatch):
    actor, critic, batch = minibatch("CartPole-v1", {})
    options = {"clip_epsilon": 0.2, "entropy_bonus": True, "entropy_coeff": 0.01}
    loss = TensorClipPPOLoss(actor, critic, functional=False, **options)
    expected = loss(batch.clone())
    answers = []

    def parents(distribution, adv_shape):
        answers.append(distribution)
        return ClipPPOLoss._get_entropy(loss, distribution, adv_shape)

    monkeypatch.setattr(loss, "_get_entropy", parents)
    output = loss(batch.clone())
    assert answers == []  # a finite closed form: the parent is not asked
    torch.testing.assert_close(output["entropy"], expected["entropy"], rtol=0, atol=0)
    monkeypatch.setattr(
        "agents.fast_paths._categorical_entropy", lambda log_pmf: torch.full(log_pmf.shape[:-1], float("nan"))
    )
    output = loss(batch.clone())
    assert len(answers) == 1 and isinstance(answers[0], torch.distributions.Categorical)
    torch.testing.assert_close(output["entropy"], expected["entropy"], rtol=0, atol=0)


def _log_prob_in_the_loss(actor, batch):
    with torch.no_grad():
        return actor.get_dist(batch.copy()).log_prob(batch["action"])


@pytest.mark.parametrize("lean", [True, False], ids=["tensor path", "parent's path"])
def test_a_saturated_tanh_normal_policys_stored_log_probabilities_become_the_losss(lean):
    torch.manual_seed(0)
    env = make_env("Pendulum-v1", num_envs=4, seed=0)
    spec = env.observation_spec["observation"]
    actor = make_actor(spec, env.action_spec)
    critic = make_critic(spec, encoder=input_encoder(actor))
    with torch.no_grad():  # a pre-tanh mean of 8: many draws pass the clamp just inside the bound
        [linear for linear in actor.modules() if isinstance(linear, torch.nn.Linear)][-1].bias.fill_(8.0)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        batch = env.rollout(64, actor, break_when_any_done=False)
    env.close()
    loss = TensorClipPPOLoss(actor, critic, functional=False)
    if not lean:
        loss._networks = None  # the parent's distribution objects score the actions
    stored = batch["action_log_prob"].clone()
    scored = _log_prob_in_the_loss(actor, batch.reshape(-1)).reshape(stored.shape)
    assert (
        (scored - stored).abs() > 1e-3
    ).float().mean() > 0.1  # the collector's scores of its pre-tanh draws
    loss.rescore_squashed_actions(batch)
    torch.testing.assert_close(batch["action_log_prob"], scored, rtol=0, atol=1e-5)
    unsaturated = (scored - stored).abs() < 1e-4
    torch.testing.assert_close(batch["action_log_prob"][unsaturated], stored[unsaturated], rtol=0, atol=1e-4)


def test_rescoring_leaves_other_policies_log_probabilities_alone():
    actor, critic, batch = minibatch("Pendulum-v1", {"squash": False})
    stored = batch["action_log_prob"].clone()
    TensorClipPPOLoss(actor, critic, functional=False).rescore_squashed_actions(batch)
    assert torch.equal(batch["action_log_prob"], stored)
