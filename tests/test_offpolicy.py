"""SAC, DDPG and TD3: losses against TorchRL's, gradient routing, target networks, entropy target, squashing,
exploration noise, recipes end to end and bad input."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torch.func import functional_call
from torchrl.data import Bounded, Categorical, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.objectives import DDPGLoss, SACLoss, SoftUpdate, TD3Loss

from agents import (
    Agent,
    ForeachSoftUpdate,
    ObservationNormalizer,
    TensorDDPGLoss,
    TensorSACLoss,
    TensorTD3Loss,
    find_normalizer,
    make_actor,
    make_qvalue_critic,
)
from agents.actor_critic import StackedNetwork, direct_forward, stacked_forward
from agents.continuous import (
    default_target_entropy,
    make_deterministic_actor,
    make_exploration_env,
    noise_scale,
)
from agents.gsde import make_gsde_actor
from agents.qvalue import NStepDistributionalDQNLoss, TensorDQNLoss, make_q_actor, make_target_updater
from envs import make_env
from errors import InputError
from recipes import ddpg, dqn, sac, td3
from training import RunConfig, quiet

OBSERVATION_SPEC = Unbounded(shape=(1, 3))
# an asymmetric Box: [-1, 3] x [0, 0.5]
ACTION_SPEC = Bounded(torch.tensor([[-1.0, 0.0]]), torch.tensor([[3.0, 0.5]]), shape=(1, 2))
BATCH = 32


def transitions(seed: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    low, high = ACTION_SPEC.space.low[0], ACTION_SPEC.space.high[0]
    terminated = torch.rand(BATCH, 1, generator=generator) < 0.3
    truncated = ~terminated & (torch.rand(BATCH, 1, generator=generator) < 0.3)
    return TensorDict(
        {
            "observation": torch.randn(BATCH, 3, generator=generator),
            "action": low + (high - low) * torch.rand(BATCH, 2, generator=generator),
            "next": {
                "observation": torch.randn(BATCH, 3, generator=generator),
                "reward": torch.randn(BATCH, 1, generator=generator),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[BATCH],
    )


def sac_loss(loss_class=TensorSACLoss, **options):
    actor = make_actor(OBSERVATION_SPEC, ACTION_SPEC, (16, 16), "relu", state_dependent_scale=True)
    critic = make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16), "relu")
    loss = loss_class(
        actor,
        critic,
        action_spec=ACTION_SPEC,
        target_entropy=default_target_entropy(ACTION_SPEC),
        delay_actor=False,
        loss_function="l2",
        alpha_init=0.5,
        **options,
    )
    loss.make_value_estimator(gamma=0.9)
    return loss


def td3_loss(loss_class=TensorTD3Loss):
    actor = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (16, 16))[0]
    critic = make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16))
    loss = loss_class(
        actor, critic, action_spec=ACTION_SPEC, loss_function="l2", policy_noise=0.3, noise_clip=0.4
    )
    loss.make_value_estimator(gamma=0.9)
    return loss


def ddpg_loss(loss_class=TensorDDPGLoss):
    actor = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (16, 16))[0]
    critic = make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16))
    loss = loss_class(actor, critic, delay_actor=True, delay_value=True)
    loss.make_value_estimator(gamma=0.9)
    return loss


def perturb_targets(loss):
    """Move the target networks' weights away from the online ones (a fresh loss starts with equal copies)."""
    with torch.no_grad():
        for name in (
            "target_actor_network_params",
            "target_qvalue_network_params",
            "target_value_network_params",
        ):
            params = getattr(loss, name, None) if name in dict(loss.named_children()) else None
            if params is None:
                continue
            for key, value in params.items(True, True):
                if key[-1] in ("weight", "bias"):
                    value.add_(0.05 * torch.randn_like(value))


LOSSES = {
    "sac": (sac_loss, SACLoss, ("loss_actor", "loss_qvalue", "loss_alpha")),
    "td3": (td3_loss, TD3Loss, ("loss_actor", "loss_qvalue")),
    "ddpg": (ddpg_loss, DDPGLoss, ("loss_actor", "loss_value")),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_tensor_losses_equal_torchrl_losses(name):
    """Same parameters and random draws: the tensor losses give TorchRL's losses, gradients and priorities."""
    build, parent, keys = LOSSES[name]
    loss = build()
    perturb_targets(loss)
    batch = transitions()
    torch.manual_seed(1)
    ours_batch = batch.clone()
    ours = loss(ours_batch)
    torch.manual_seed(1)
    theirs_batch = batch.clone()
    theirs = parent.forward(loss, theirs_batch)
    parameters = [p for p in loss.parameters() if p.requires_grad]
    for key in keys:
        torch.testing.assert_close(ours[key], theirs[key])
        ours_grads = torch.autograd.grad(ours[key], parameters, allow_unused=True, retain_graph=True)
        theirs_grads = torch.autograd.grad(theirs[key], parameters, allow_unused=True, retain_graph=True)
        for a, b in zip(ours_grads, theirs_grads):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b)
    torch.testing.assert_close(ours_batch["td_error"], theirs_batch["td_error"])


@pytest.mark.parametrize("scalars", ["non_tensor", "exclude"])
def test_unreduced_sac_losses_have_the_parents_layout(scalars):
    """``reduction="none"``: per-transition losses in a batch of the input's size, alpha and entropy as the
    parent gives them (non-tensor data, or left out)."""
    loss = sac_loss(reduction="none", scalar_output_mode=scalars)
    batch = transitions()
    torch.manual_seed(1)
    ours = loss(batch.clone())
    torch.manual_seed(1)
    theirs = SACLoss.forward(loss, batch.clone())
    assert ours.batch_size == theirs.batch_size == batch.batch_size
    assert set(ours.keys()) == set(theirs.keys())
    for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
        torch.testing.assert_close(ours[key], theirs[key])
    for key in set(ours.keys()) - {"loss_actor", "loss_qvalue", "loss_alpha"}:
        torch.testing.assert_close(torch.as_tensor(ours[key]), torch.as_tensor(theirs[key]))


def test_the_tensor_sac_loss_refuses_the_parents_skip_done_states():
    with pytest.raises(InputError, match="skip_done_states is SACLoss's: use SACLoss"):
        sac_loss(skip_done_states=True)


def test_direct_forward_computes_what_functional_call_computes():
    """The recipes' critics and actors run without functional_call's parameter swapping, with equal outputs
    and gradients for parameters that are not the module's own; other modules fall back to functional_call."""
    normalizer = ObservationNormalizer(3)
    normalizer.update(torch.randn(64, 3) * 4 + 2)
    modules = {
        "critic": (make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16), "tanh").module, 2),
        "normalised critic": (
            make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16), normalizer=normalizer).module,
            2,
        ),
        "actor": (make_actor(OBSERVATION_SPEC, ACTION_SPEC, (16,), state_dependent_scale=True)[0].module, 1),
        "deterministic actor": (
            make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (16, 16))[0][0].module,
            1,
        ),
        "linear without bias": (torch.nn.Linear(3, 4, bias=False), 1),
    }
    inputs = (torch.randn(BATCH, 3), torch.rand(BATCH, 2))
    for name, (module, arity) in modules.items():
        direct = direct_forward(module)
        assert direct is not None, name
        parameters = {key: value.detach() * 1.5 + 0.1 for key, value in module.named_parameters()}
        for value in parameters.values():
            value.requires_grad_(True)
        ours = direct(parameters, *inputs[:arity])
        theirs = functional_call(module, parameters, inputs[:arity])
        for a, b in zip(torch.utils._pytree.tree_leaves(ours), torch.utils._pytree.tree_leaves(theirs)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            grads_a = torch.autograd.grad(
                a.sum(), list(parameters.values()), retain_graph=True, allow_unused=True
            )
            grads_b = torch.autograd.grad(
                b.sum(), list(parameters.values()), retain_graph=True, allow_unused=True
            )
            for ga, gb in zip(grads_a, grads_b):
                assert (ga is None) == (gb is None)
                if ga is not None:
                    torch.testing.assert_close(ga, gb, rtol=0, atol=0)
    sac, td3, ddpg = sac_loss(), td3_loss(), ddpg_loss()
    for network in (
        sac._actor,
        sac._qvalue,
        td3._qvalue,
        td3._action.network,
        ddpg._value,
        ddpg._action.network,
    ):
        assert network._direct is not None  # the losses take the direct path
    assert direct_forward(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))) is None
    assert direct_forward(torch.nn.Conv2d(1, 2, 3)) is None


def test_stacked_forward_computes_each_members_output():
    """Q ensembles run all members at once (batched products) with each member's own output and gradients, as
    the member-by-member loop computes them; networks with other layers are left to the loop."""
    normalizer = ObservationNormalizer(3)
    normalizer.update(torch.randn(64, 3) * 4 + 2)
    critics = {
        "relu": make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16), "relu"),
        "tanh, one layer": make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16,), "tanh"),
        "normalised": make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16, 16), normalizer=normalizer),
    }
    observation, action = torch.randn(BATCH, 3), torch.rand(BATCH, 2)
    members = 3
    for name, critic in critics.items():
        network = StackedNetwork(critic)
        assert network._stacked is not None, name
        stacked = TensorDict.from_module(critic).expand(members).clone()
        for value in stacked.values(True, True):
            value.normal_()
            value.requires_grad_(True)
        leaves = list(stacked.values(True, True))
        ours = network(stacked, observation, action)
        network._stacked = None
        theirs = network(stacked, observation, action)
        assert ours.shape == theirs.shape == (members, BATCH, 1), name
        torch.testing.assert_close(ours, theirs)
        weights = torch.randn(members, BATCH, 1)
        ours_grads = torch.autograd.grad((ours * weights).sum(), leaves)
        theirs_grads = torch.autograd.grad((theirs * weights).sum(), leaves)
        for a, b in zip(ours_grads, theirs_grads, strict=True):
            torch.testing.assert_close(a, b)
    # an action gradient flows through every member (the SAC actor's loss)
    critic = critics["relu"]
    stacked = TensorDict.from_module(critic).expand(members).clone()
    action.requires_grad_(True)
    network = StackedNetwork(critic)
    ours = torch.autograd.grad(network(stacked, observation, action).sum(), action)[0]
    network._stacked = None
    theirs = torch.autograd.grad(network(stacked, observation, action).sum(), action)[0]
    torch.testing.assert_close(ours, theirs)
    for loss in (sac_loss(), td3_loss()):
        assert loss._qvalue._stacked is not None  # the losses' twin critics take the batched path
    discrete = make_qvalue_critic(OBSERVATION_SPEC, Categorical(4, shape=(1,)), (16,))
    assert stacked_forward(discrete.module) is None  # an encoder inside a Sequential: member by member
    assert stacked_forward(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))) is None
    assert stacked_forward(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Softmax(-1))) is None
    assert stacked_forward(torch.nn.Sequential(torch.nn.ReLU())) is None  # no layer to batch


def test_stacked_network_reads_the_tensors_get_reads():
    """The parameters come straight from the TensorDicts' nested dicts: the very tensors get returns, for the
    losses' parameter TensorDicts (TensorDictParams and detached copies); other TensorDicts go through get,
    and a missing entry raises a KeyError."""
    loss = sac_loss()
    for network, parameters in (
        (loss._qvalue, loss.qvalue_network_params),
        (loss._qvalue, loss.target_qvalue_network_params),
        (loss._qvalue, loss._cached_detached_qvalue_params),
        (loss._actor, loss.actor_network_params),
    ):
        flat = network._flat(parameters)
        assert list(flat) == list(network.names.values())
        assert all(flat[name] is parameters.get(key) for key, name in network.names.items())
    stacked = loss.qvalue_network_params.data
    lazy = LazyStackedTensorDict.lazy_stack(list(stacked.unbind(0)), 0)
    flat = loss._qvalue._flat(lazy)
    for key, name in loss._qvalue.names.items():
        torch.testing.assert_close(flat[name], stacked.get(key), rtol=0, atol=0)
    missing = loss.qvalue_network_params.data.clone()
    del missing[next(iter(loss._qvalue.names))]
    with pytest.raises(KeyError):
        loss._qvalue._flat(missing)


def parameter_groups(loss):
    groups = {"actor": list(loss.actor_network_params.values(True, True))}
    critic = getattr(loss, "qvalue_network_params", None)
    groups["critic"] = list((critic if critic is not None else loss.value_network_params).values(True, True))
    if isinstance(loss, SACLoss):
        groups["alpha"] = [loss.log_alpha]
    return {name: [p for p in params if p.requires_grad] for name, params in groups.items()}


@pytest.mark.parametrize(
    "name,owner",
    [
        ("sac", {"loss_actor": "actor", "loss_qvalue": "critic", "loss_alpha": "alpha"}),
        ("td3", {"loss_actor": "actor", "loss_qvalue": "critic"}),
        ("ddpg", {"loss_actor": "actor", "loss_value": "critic"}),
    ],
)
def test_each_loss_term_reaches_only_its_own_parameters(name, owner):
    loss = LOSSES[name][0]()
    losses = loss(transitions())
    groups = parameter_groups(loss)
    for key, own in owner.items():
        for group, params in groups.items():
            grads = torch.autograd.grad(losses[key], params, allow_unused=True, retain_graph=True)
            reached = any(g is not None and g.abs().sum() > 0 for g in grads)
            assert reached == (group == own), f"{key} {'missed' if group == own else 'reached'} the {group}"


@pytest.mark.parametrize("updater", [SoftUpdate, ForeachSoftUpdate])
@pytest.mark.parametrize("name", list(LOSSES))
def test_target_parameters_get_no_gradient_and_move_only_by_the_soft_update(name, updater):
    loss = LOSSES[name][0]()
    tau = 0.1
    target_updater = updater(loss, tau=tau)  # copies the online parameters into the targets
    perturb_targets(loss)
    targets = [p for key, p in loss.named_buffers() if key.startswith("target_")]
    assert targets and not any(p.requires_grad for p in targets)
    before = [p.clone() for p in targets]
    losses = loss(transitions())
    total = sum(value for key, value in losses.items() if key.startswith("loss_"))
    total.backward()
    assert all(p.grad is None for p in targets)
    optimizer = torch.optim.SGD([p for p in loss.parameters() if p.requires_grad], lr=0.1)
    optimizer.step()
    for p, old in zip(targets, before):
        torch.testing.assert_close(p, old)  # an optimizer step leaves the targets alone
    target_updater.step()
    sources = dict(loss.named_parameters())
    moved = 0
    for (key, p), old in zip([(k, p) for k, p in loss.named_buffers() if k.startswith("target_")], before):
        source = sources.get(key.removeprefix("target_"))
        if source is None:
            continue  # a buffer (TanhModule bounds): copied, not trained
        torch.testing.assert_close(p, (1 - tau) * old + tau * source.detach())
        moved += 1
    assert moved > 0


@pytest.mark.parametrize("name", list(LOSSES))
def test_foreach_soft_update_equals_torchrls_bit_for_bit(name):
    """Same losses, same training of the online parameters: the targets of both updaters agree exactly, also
    after a module has its parameters' data replaced (as ``module.to`` does) and after a state round trip."""
    torch.manual_seed(0)
    theirs = LOSSES[name][0]()
    torch.manual_seed(0)
    ours = LOSSES[name][0]()
    their_updater, our_updater = SoftUpdate(theirs, eps=0.9), ForeachSoftUpdate(ours, eps=0.9)
    our_updater.load_state_dict(their_updater.state_dict())

    def targets(loss):
        return [p for key, p in loss.named_buffers() if key.startswith("target_")]

    initial = [p.clone() for p in targets(ours)]
    for step in range(4):
        generator = torch.Generator().manual_seed(step)
        for losses in (theirs, ours):
            with torch.no_grad():
                for p in losses.parameters():
                    if step == 2:  # fresh storage behind the same Parameter objects
                        p.data = p.data.clone()
                    p.add_(torch.randn(p.shape, generator=generator.clone_state()))
        their_updater.step()
        our_updater.step()
        for a, b in zip(targets(theirs), targets(ours), strict=True):
            assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(targets(ours), initial))


@pytest.mark.parametrize("name", list(LOSSES))
def test_critics_read_the_actors_observation_statistics(name):
    """The actor owns the normaliser; every copy of the critic in the loss (online, target, twin) follows its
    statistics as they are updated, and the critic saves none of them."""
    if name == "sac":
        actor = make_actor(
            OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalize_obs=True, state_dependent_scale=True
        )
        trained = actor
    else:
        actor = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalize_obs=True)
        trained = actor[0]
    normalizer = find_normalizer(actor)
    critic = make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalizer=normalizer)
    assert not any(isinstance(module, ObservationNormalizer) for module in critic.modules())
    assert len(list(critic.buffers())) == 0
    common = {"delay_qvalue": True} if name != "ddpg" else {"delay_value": True}
    if name == "sac":
        loss = TensorSACLoss(trained, critic, action_spec=ACTION_SPEC, delay_actor=False, **common)
    elif name == "td3":
        loss = TensorTD3Loss(trained, critic, action_spec=ACTION_SPEC, delay_actor=True, **common)
    else:
        loss = TensorDDPGLoss(trained, critic, delay_actor=True, **common)
    loss.make_value_estimator(gamma=0.9)
    data = transitions()
    observation, action = data.get("observation"), data.get("action")

    def critic_values():
        parameters = loss.value_network_params if name == "ddpg" else loss.qvalue_network_params[0]
        with parameters.to_module(critic):
            return critic(TensorDict({"observation": observation[:4], "action": action[:4]}, [4]))[
                "state_action_value"
            ]

    before = critic_values()
    torch.manual_seed(0)
    first = loss(data.clone())
    normalizer.update(observation * 10 + 3)
    after = critic_values()
    torch.manual_seed(0)
    second = loss(data.clone())
    assert not torch.allclose(before, after)
    value_key = "loss_value" if name == "ddpg" else "loss_qvalue"
    assert first[value_key].item() != second[value_key].item()
    # the statistics are the actor's: shared with the loss's actor parameters, not copied
    shared = normalizer.mean.data_ptr()
    assert any(tensor.data_ptr() == shared for tensor in loss.actor_network_params.values(True, True))


def test_target_entropy_is_minus_the_action_dimension_on_the_unit_box():
    # -dim(A) on [-1, 1]: in the Box's units, plus log of each dim's half-width (2 and 0.25)
    assert default_target_entropy(ACTION_SPEC) == pytest.approx(-2.0 + math.log(2.0) + math.log(0.25))
    unit_box = Bounded(-torch.ones(1, 3), torch.ones(1, 3), shape=(1, 3))
    assert default_target_entropy(unit_box) == -3.0
    assert sac_loss().target_entropy.item() == pytest.approx(-2.0 + math.log(0.5))
    # the entropy coefficient's loss is then Stable-Baselines3's, whose policy's log-probability is on [-1, 1]
    loss = sac_loss()
    observation = torch.randn(32, 3)
    _, log_prob_box = loss._sample(observation)
    half_range = torch.tensor([2.0, 0.25])
    log_prob_unit = log_prob_box + half_range.log().sum()  # the same draw, before the affine map
    torch.testing.assert_close(log_prob_box + loss.target_entropy, log_prob_unit - 2.0)


def test_sac_recipe_tunes_and_logs_the_entropy_coefficient(tmp_path):
    config = quiet(sac.SACConfig(), tmp_path, logger="csv")
    config.run.total_frames, config.collector.learning_starts = 300, 100
    config.network.hidden_sizes = (8,)
    summary = sac.main(config)
    assert summary["frames"] >= 300
    rows = (tmp_path / "csv" / "scalars" / "train" / "alpha.csv").read_text().split()
    alphas = [float(row.split(",")[1]) for row in rows]
    assert len(alphas) >= 2 and alphas[-1] != pytest.approx(1.0)  # tuned away from --alpha-init


def test_tanh_normal_log_probability_is_finite_for_saturated_actions():
    actor = make_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), "relu", state_dependent_scale=True)
    with torch.no_grad():
        last = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([40.0, -40.0, -5.0, -5.0]))  # loc far outside tanh's range, small scale
    dist = actor.get_dist(TensorDict({"observation": torch.randn(64, 3)}, [64]))
    action = dist.rsample()
    low, high = ACTION_SPEC.space.low[0], ACTION_SPEC.space.high[0]
    torch.testing.assert_close(action[:, 0], high[0].expand(64))  # saturated at the bounds
    torch.testing.assert_close(action[:, 1], low[1].expand(64))
    log_prob = dist.log_prob(action)
    assert torch.isfinite(log_prob).all()
    log_prob.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in actor.parameters() if p.grad is not None)


def test_stable_baselines3_s_squashed_gaussian_head_and_log_probability():
    actor = make_actor(
        OBSERVATION_SPEC, ACTION_SPEC, (8,), "relu", state_dependent_scale=True, log_std_bounds=(-20, 2)
    )
    with torch.no_grad():
        last = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.5, -0.5, 9.0, -30.0]))  # log stds beyond both bounds
    observation = torch.randn(64, 3)
    loc, scale = actor.module[0](observation)
    torch.testing.assert_close(scale[0], torch.tensor([math.exp(2.0), math.exp(-20.0)]))
    # the loss's log-probability with epsilon: Stable-Baselines3's formula, log(1 - tanh(u)^2 + eps)
    loss = TensorSACLoss(
        actor, make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (8,)), log_prob_epsilon=1e-6
    )
    loss.make_value_estimator(gamma=0.99)
    torch.manual_seed(0)
    action, log_prob = loss._sample(observation)
    torch.manual_seed(0)
    u = loc + torch.randn_like(loc) * scale
    low, high = (torch.as_tensor(bound) for bound in (ACTION_SPEC.space.low[0], ACTION_SPEC.space.high[0]))
    expected = (
        torch.distributions.Normal(loc, scale).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2 + 1e-6)
    ).sum(-1) - torch.log((high - low) / 2).sum()
    torch.testing.assert_close(log_prob, expected)
    torch.testing.assert_close(
        action, (high + low) / 2 + (high - low) / 2 * torch.tanh(u).clamp(-1 + 1e-6, 1 - 1e-6)
    )
    with pytest.raises(InputError, match="log_std_bounds bound a state-dependent scale"):
        make_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), log_std_bounds=(-20, 2))


def test_sac_with_stable_baselines3_s_head_trains_saves_and_loads(tmp_path):
    config = quiet(sac.SACConfig(), tmp_path)
    config.run.total_frames, config.collector.learning_starts = 300, 100
    config.network.hidden_sizes, config.network.log_std_bounds = (8,), (-20.0, 2.0)
    config.loss.log_prob_epsilon = 1e-6
    sac.main(config)
    agent = Agent.load(tmp_path)
    assert agent.policy_kwargs["log_std_bounds"] == [-20.0, 2.0]
    assert any(type(module).__name__ == "ClampedLogStd" for module in agent.policy.modules())
    assert agent.evaluate(episodes=1, seed=0).lengths.tolist() == [200]


def policies_for_the_box():
    sac_actor = make_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), "relu", state_dependent_scale=True)
    gsde_actor = make_gsde_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), "relu", sigma_init=3.0, squash=True)
    gaussian = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), noise_sigma=2.0)
    return {"sac": sac_actor, "sac-gsde": gsde_actor, "ddpg/td3": gaussian}


@pytest.mark.parametrize("name", ["sac", "sac-gsde", "ddpg/td3"])
def test_actions_stay_inside_an_asymmetric_box(name):
    policy = policies_for_the_box()[name]
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(20.0)  # large outputs: saturate the squashing
    observations = TensorDict({"observation": 5 * torch.randn(2_000, 3)}, [2_000])
    low, high = ACTION_SPEC.space.low[0], ACTION_SPEC.space.high[0]
    for exploration in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):
        with torch.no_grad(), set_exploration_type(exploration):
            action = policy(observations.clone())["action"]
        assert ((action >= low) & (action <= high)).all(), exploration
        assert (action[:, 0] > 1.0).any() and (action[:, 0] < 0.0).any()  # both sides of the Box are reached


def test_exploration_noise_is_off_in_evaluation_and_on_in_collection():
    policy = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), noise_sigma=0.3)
    observations = TensorDict({"observation": torch.randn(16, 3)}, [16])
    with torch.no_grad():
        mean = policy[0](observations.clone())["action"]
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            torch.testing.assert_close(policy(observations.clone())["action"], mean)
        with set_exploration_type(ExplorationType.RANDOM):
            noisy = policy(observations.clone())["action"]
    assert (noisy - mean).abs().mean() > 0.05


def test_noise_scales_are_relative_to_each_action_dims_half_width():
    # ACTION_SPEC's half-widths are 2 and 0.25: 0.1 of them is a standard deviation of 0.2 and 0.025
    torch.testing.assert_close(noise_scale(0.1, ACTION_SPEC), torch.tensor([0.2, 0.025]))
    assert noise_scale(0.1, Bounded(-2.0, 2.0, shape=(4, 3))) == pytest.approx(
        0.2
    )  # equal widths: one number
    torch.manual_seed(0)
    gaussian = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), noise_sigma=0.1)
    with torch.no_grad():
        for p in gaussian[0].parameters():
            p.zero_()  # mu(s) = the Box's midpoint (1, 0.25), many standard deviations from either bound
        observations = TensorDict({"observation": torch.zeros(20_000, 3)}, [20_000])
        with set_exploration_type(ExplorationType.RANDOM):
            noise = gaussian(observations)["action"] - torch.tensor([1.0, 0.25])
    torch.testing.assert_close(noise.std(0), torch.tensor([0.2, 0.025]), rtol=0.05, atol=0)
    ou = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,), noise="ou", noise_sigma=0.1)
    torch.testing.assert_close(
        ou[1].ou.current_sigma(torch.zeros(5, 2)), torch.tensor([0.2, 0.025]).expand(5, 2)
    )


def test_td3_target_noise_and_its_clip_are_per_action_dim_buffers():
    actor = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (8,))[0]
    critic = make_qvalue_critic(OBSERVATION_SPEC, ACTION_SPEC, (8,))
    loss = TensorTD3Loss(
        actor,
        critic,
        action_spec=ACTION_SPEC,
        policy_noise=noise_scale(0.1, ACTION_SPEC),  # standard deviations 0.2 and 0.025
        noise_clip=noise_scale(0.5, ACTION_SPEC),  # clipped at 1.0 and 0.125: five of them
    )
    loss.make_value_estimator(gamma=0.9)
    buffers = dict(loss.named_buffers())
    torch.testing.assert_close(buffers["noise_clip"], torch.tensor([1.0, 0.125]))
    assert "policy_noise" not in loss.state_dict()  # they follow the Box, not the file
    with torch.no_grad():
        for key, p in loss.target_actor_network_params.items(True, True):
            if loss.actor_network_params.get(key).requires_grad:  # the weights, not the Box's bounds
                p.zero_()  # the target action is the Box's midpoint (1, 0.25)
    actions = []
    qvalue = loss._qvalue
    loss._qvalue = lambda params, observation, action: (
        actions.append(action) or qvalue(params, observation, action)
    )
    batch = torch.cat([transitions(seed) for seed in range(625)])  # 20,000 transitions
    loss.value_loss(batch)
    noise = actions[0] - torch.tensor([1.0, 0.25])
    torch.testing.assert_close(noise.std(0), torch.tensor([0.2, 0.025]), rtol=0.05, atol=0)
    assert (noise.abs() <= torch.tensor([1.0, 0.125])).all()


@pytest.mark.parametrize("recipe", ["td3", "ddpg"])
def test_recipes_train_and_sample_on_action_dims_of_different_widths(recipe, tmp_path):
    import echo_env  # noqa: F401 - registers UnevenEcho-v0: half-widths 2 and 20

    module = {"td3": td3, "ddpg": ddpg}[recipe]
    config = quiet(module.__dict__[f"{recipe.upper()}Config"](), tmp_path)
    config.run.env_id, config.run.total_frames, config.run.eval_every = "UnevenEcho-v0", 300, 300
    config.collector.learning_starts, config.network.hidden_sizes = 100, (8,)
    module.main(config)  # TD3's target noise and its clip are per action dim too
    agent = Agent.load(tmp_path / "agent.ckpt")
    observations = np.zeros((5_000, 2), np.float32)
    noise = agent.predict(observations, deterministic=False) - agent.predict(observations, deterministic=True)
    assert np.allclose(noise.std(0) / np.array([2.0, 20.0]), config.network.noise_sigma, rtol=0.1)


def test_ornstein_uhlenbeck_noise_is_correlated_and_restarts_with_each_episode():
    torch.manual_seed(0)
    env = make_exploration_env(make_env("Pendulum-v1", num_envs=1, seed=0), "ou")
    policy = make_deterministic_actor(
        env.observation_spec["observation"], env.action_spec, (8,), noise="ou", noise_sigma=1.0
    )
    with torch.no_grad():
        for p in policy[0].parameters():
            p.zero_()  # mu(s) = midpoint of the Box = 0: the action is the noise
        with set_exploration_type(ExplorationType.RANDOM):
            rollout = env.rollout(400, policy, break_when_any_done=False)
    noise = rollout["action"][0, :, 0]  # [env, time, action dim]
    assert noise.abs().max() > 0.01
    steps = noise.shape[0]
    # an OU process with theta * dt = 0.0015 per step is strongly autocorrelated; white noise would give ~0
    # (sigma 1.0 relative: a standard deviation of 2, increments of 0.2 per step)
    correlation = torch.corrcoef(torch.stack([noise[:-1], noise[1:]]))[0, 1]
    assert correlation > 0.9
    # the episode start at step 200 (Pendulum's time limit) restarts the process at 0 + one increment
    assert rollout["is_init"][0, :, 0].nonzero().flatten().tolist() == [0, 200]
    assert steps == 400
    # a restart puts the process back at 0: one increment away, while it had wandered off before
    assert noise[0].abs() < 0.3 and noise[200].abs() < 0.3 and noise[200].abs() < noise[199].abs() / 3
    env.close()


@pytest.mark.parametrize(
    "name,setup",
    [
        ("sac", lambda c: None),
        ("sac-gsde", lambda c: setattr(c.network, "use_sde", True)),
        ("sac-nstep", lambda c: setattr(c.buffer, "n_steps", 3)),
        ("sac-discrete", lambda c: (setattr(c.run, "env_id", "CartPole-v1"), setattr(c, "discrete", True))),
        ("td3", lambda c: None),
        ("td3-ou", lambda c: setattr(c.network, "noise", "ou")),
        ("ddpg", lambda c: None),
        ("ddpg-ou", lambda c: setattr(c.network, "noise", "ou")),
        ("sac-normalized", lambda c: setattr(c.network, "normalize_obs", True)),
        (
            "sac-gsde-normalized",
            lambda c: (setattr(c.network, "use_sde", True), setattr(c.network, "normalize_obs", True)),
        ),
        (
            "sac-discrete-normalized",
            lambda c: (
                setattr(c.run, "env_id", "CartPole-v1"),
                setattr(c, "discrete", True),
                setattr(c.network, "normalize_obs", True),
            ),
        ),
        ("td3-normalized", lambda c: setattr(c.network, "normalize_obs", True)),
        ("ddpg-normalized", lambda c: setattr(c.network, "normalize_obs", True)),
    ],
)
def test_recipes_train_save_and_the_agent_loads_and_evaluates(name, setup, tmp_path):
    module = {"sac": sac, "td3": td3, "ddpg": ddpg}[name.split("-")[0]]
    config_class = {"sac": sac.SACConfig, "td3": td3.TD3Config, "ddpg": ddpg.DDPGConfig}[name.split("-")[0]]
    config = quiet(config_class(), tmp_path)
    config.run.logger, config.run.total_frames, config.run.eval_every = "none", 400, 200
    config.run.num_envs = 2
    config.collector.learning_starts = 100
    config.network.hidden_sizes = (16,)
    setup(config)
    summary = module.main(config)
    assert summary["frames"] >= 400 and len(summary) > 0
    agent = Agent.load(tmp_path / "agent.ckpt")
    result = agent.evaluate(episodes=2, seed=0)
    assert result.returns.shape == (2,)
    if name.endswith("normalized"):  # every collected observation, in the statistics saved with the agent
        assert agent.normalizer.count.item() == summary["frames"]
        assert agent.normalizer.var.min() < 0.99 or agent.normalizer.var.max() > 1.01
    else:
        assert agent.normalizer is None
    env = gym.make(config.run.env_id)
    observation, _ = env.reset(seed=0)
    action = agent.predict(observation, deterministic=True)
    assert env.action_space.contains(action)
    assert (agent.predict(observation, deterministic=True) == action).all()
    if name.endswith("-ou"):  # OU noise needs the env's episode-start flag; predict has none
        with pytest.raises(InputError, match="Ornstein-Uhlenbeck"):
            agent.predict(observation, deterministic=False)
        with pytest.raises(InputError, match="Ornstein-Uhlenbeck"):
            agent.evaluate(episodes=1, seed=0, deterministic=False)
    else:
        stochastic = agent.predict(observation, deterministic=False)
        assert env.action_space.contains(stochastic)


@pytest.mark.parametrize(
    "recipe,config_class,env_id,message",
    [
        (td3, td3.TD3Config, "CartPole-v1", "TD3 needs a Box"),
        (ddpg, ddpg.DDPGConfig, "CartPole-v1", "DDPG needs a Box"),
    ],
)
def test_deterministic_recipes_refuse_discrete_actions(recipe, config_class, env_id, message, tmp_path):
    config = quiet(config_class(), tmp_path)
    config.run.env_id = env_id
    with pytest.raises(InputError, match=message):
        recipe.main(config)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda c: setattr(c, "discrete", True), "--discrete asks for a Discrete action space"),
        (lambda c: setattr(c.loss, "tau", 0.0), "--tau must be in"),
        (lambda c: setattr(c.buffer, "n_steps", 0), "--n-steps must be a positive integer"),
        (lambda c: setattr(c.loss, "alpha_init", -1.0), "--alpha-init must be in .0, inf."),
        (lambda c: setattr(c.collector, "updates_per_frame", 0.0), "--updates-per-frame must be in .0, inf."),
        (lambda c: setattr(c.collector, "updates_per_frame", 0.01), "is 0.08 gradient steps a batch.*1/8"),
        (lambda c: setattr(c.collector, "updates_per_frame", 0.3), "is 2.4 gradient steps a batch"),
        (lambda c: setattr(c.network, "sde_sample_freq", 4), "only applies with --use-sde"),
        (
            lambda c: setattr(c.run, "env_id", "CartPole-v1") or setattr(c.network, "use_sde", True),
            "--use-sde is for Box",
        ),
        (
            lambda c: setattr(c.run, "env_id", "CartPole-v1") or setattr(c.loss, "target_entropy", 1.0),
            r"--target-entropy 1.0 is outside \[0, log 2 = 0.693\).*would grow without end",
        ),
        (
            lambda c: setattr(c.run, "env_id", "CartPole-v1") or setattr(c.loss, "target_entropy", -1.0),
            r"--target-entropy -1.0 is outside .*would shrink without end",
        ),
        (
            lambda c: setattr(c.loss, "target_entropy", math.nan),
            r"--target-entropy must be in \(-inf, inf\), got nan",
        ),
        (
            lambda c: setattr(c.network, "log_std_bounds", (2.0, -20.0)),
            "log_std_bounds takes two finite numbers",
        ),
        (lambda c: setattr(c.network, "log_std_bounds", (-20.0,)), "log_std_bounds takes two finite numbers"),
        (lambda c: setattr(c.loss, "log_prob_epsilon", -1e-6), r"--log-prob-epsilon must be in \[0, 1\)"),
        (
            lambda c: setattr(c.network, "use_sde", True) or setattr(c.loss, "log_prob_epsilon", 1e-6),
            "a --use-sde policy has its own noise",
        ),
        (
            lambda c: (
                setattr(c.run, "env_id", "CartPole-v1") or setattr(c.network, "log_std_bounds", (-20.0, 2.0))
            ),
            "CartPole-v1 has Discrete actions: drop them",
        ),
    ],
)
def test_sac_bad_input(change, message, tmp_path):
    config = quiet(sac.SACConfig(), tmp_path)
    change(config)
    with pytest.raises(InputError, match=message):
        sac.main(config)


def test_deterministic_actor_bad_input():
    with pytest.raises(InputError, match="Box"):
        make_deterministic_actor(OBSERVATION_SPEC, Categorical(3, shape=(1,)))
    with pytest.raises(InputError, match="Unknown exploration noise"):
        make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, noise="pink")
    for value in (-0.1, math.inf):
        with pytest.raises(InputError, match=r"--target-noise must be in \[0, inf\)"):
            config = td3.TD3Config(run=RunConfig(env_id="Pendulum-v1"))
            config.loss.target_noise = value
            td3.main(config)


@pytest.mark.parametrize("recipe", [td3, ddpg])
@pytest.mark.parametrize(
    "change,message",
    [
        (lambda n: setattr(n, "noise_sigma", float("nan")), r"--noise-sigma must be in \[0, inf\), got nan"),
        (lambda n: setattr(n, "noise_sigma", float("inf")), r"--noise-sigma must be in \[0, inf\), got inf"),
        (lambda n: setattr(n, "ou_theta", 0.3), "--ou-theta is for --noise ou"),
    ],
)
def test_exploration_noise_bad_input(recipe, change, message, tmp_path):
    config = quiet(recipe.__dict__[f"{recipe.__name__.split('.')[-1].upper()}Config"](), tmp_path)
    change(config.network)
    with pytest.raises(InputError, match=message):
        recipe.main(config)
    assert not (tmp_path / "config.json").exists()  # refused before the run claimed its folder


def actor_parameters_after(tmp_path, name, **optim):
    config = quiet(sac.SACConfig(), tmp_path / name)
    config.run.logger, config.run.total_frames, config.run.eval_every = "none", 400, 400
    config.collector.learning_starts = 100 if optim else 1_000  # without optim settings: no update at all
    config.network.hidden_sizes = (8,)
    for key, value in optim.items():
        setattr(config.optim, key, value)
    sac.main(config)
    return [p.detach() for p in Agent.load(tmp_path / name / "agent.ckpt").policy.parameters()]


def test_sac_actor_lr_sets_the_actor_rate_alone(tmp_path):
    initial = actor_parameters_after(tmp_path, "no-updates")
    frozen = actor_parameters_after(tmp_path, "tiny-actor-lr", actor_lr=1e-30)
    trained = actor_parameters_after(tmp_path, "default", actor_lr=None)
    assert all(
        torch.equal(a, b) for a, b in zip(initial, frozen)
    )  # same seed, same init; the actor did not move
    assert not all(torch.equal(a, b) for a, b in zip(initial, trained))
    with pytest.raises(InputError, match="--actor-lr must be in .0, inf."):
        config = quiet(sac.SACConfig(), tmp_path)
        config.optim.actor_lr = -1.0
        sac.main(config)


def test_discrete_settings_leave_the_options_given_on_the_command_line():
    config = sac.apply_discrete_settings(sac.SACConfig(), keep={"lr", "batch_size"})
    assert config.discrete
    assert config.network.hidden_sizes == (128, 128) and config.buffer.n_steps == 3
    assert (
        config.optim.lr == sac.SACConfig().optim.lr
        and config.buffer.batch_size == sac.SACConfig().buffer.batch_size
    )


@pytest.mark.parametrize("module", [dqn, sac, td3, ddpg], ids=["dqn", "sac", "td3", "ddpg"])
def test_a_batch_larger_than_the_buffer_is_refused(module, tmp_path):
    config = quiet(
        {dqn: dqn.DQNConfig, sac: sac.SACConfig, td3: td3.TD3Config, ddpg: ddpg.DDPGConfig}[module](),
        tmp_path,
    )
    config.buffer.batch_size, config.buffer.buffer_size = 256, 100
    with pytest.raises(InputError, match="--batch-size 256 exceeds --buffer-size 100"):
        module.main(config)


@pytest.mark.parametrize("module", [dqn, sac], ids=["dqn", "sac"])
def test_a_run_that_never_updates_says_so(module, tmp_path):
    config = quiet(
        {dqn: dqn.DQNConfig, sac: sac.SACConfig}[module](), tmp_path, total_frames=256, eval_episodes=1
    )
    config.collector.learning_starts = 1_000
    with pytest.warns(UserWarning, match="ended without a gradient step.*--learning-starts 1000"):
        module.main(config)


def test_a_run_whose_n_step_windows_store_too_little_says_so(tmp_path):
    config = quiet(dqn.DQNConfig(), tmp_path, total_frames=1_000, eval_episodes=1)
    config.collector.learning_starts, config.buffer.n_steps = 0, 600
    with pytest.warns(UserWarning, match=r"stored once --n-steps 600 further steps .* or --n-steps\."):
        dqn.main(config)


@pytest.mark.parametrize("recipe", [sac, td3, ddpg])
def test_max_grad_norm_clips_the_actor_and_the_critics(recipe, tmp_path):
    """A tiny --max-grad-norm leaves the actor's gradients far below Adam's eps: the clipped actor barely moves."""
    config_class = {sac: sac.SACConfig, td3: td3.TD3Config, ddpg: ddpg.DDPGConfig}[recipe]

    def parameters_after(name, learning_starts, max_grad_norm=float("inf")):
        config = quiet(config_class(run=RunConfig(env_id="Pendulum-v1")), tmp_path / name)
        config.run.logger, config.run.total_frames, config.run.eval_every = "none", 400, 400
        config.collector.learning_starts = learning_starts
        config.network.hidden_sizes = (8,)
        config.optim.max_grad_norm = max_grad_norm
        recipe.main(config)
        agent = Agent.load(tmp_path / name / "agent.ckpt")
        return torch.cat([parameter.detach().flatten() for parameter in agent.policy.parameters()])

    initial = parameters_after("no-updates", 1_000)
    free = (parameters_after("free", 100) - initial).abs().max()
    clipped = (parameters_after("clipped", 100, max_grad_norm=1e-12) - initial).abs().max()
    assert free > 0 and clipped < 0.05 * free


def test_a_moved_sac_loss_reads_the_statistics_its_actor_is_updated_with():
    """SAC has no target actor; its online actor's statistics in the loss must stay the actor's through a move."""
    actor = make_actor(
        OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalize_obs=True, state_dependent_scale=True
    )
    critic = make_qvalue_critic(
        OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalizer=find_normalizer(actor)
    )
    loss = TensorSACLoss(actor, critic, action_spec=ACTION_SPEC)
    loss._apply(torch.clone)  # what loss.to(device) does to each tensor
    normalizer = find_normalizer(actor)
    normalizer.update(torch.randn(64, 3) * 50 + 100)
    statistics = {tensor.data_ptr() for tensor in normalizer.buffers()}
    in_loss = {tensor.data_ptr() for tensor in loss.actor_network_params.values(True, True)}
    assert statistics <= in_loss


@pytest.mark.parametrize("name", ["td3", "ddpg", "dqn", "c51"])
def test_target_networks_normalise_with_the_online_statistics(name):
    """TorchRL's losses copy buffers into the target networks and its updaters update parameters only: the target
    networks' observation statistics must be the online ones, before and after a target update, or the bootstrap
    reads observations on another scale (frozen at zero mean, unit variance); and after the loss is moved, the
    network the training loop updates must still hold the statistics the loss reads."""
    observation = torch.randn(64, 3) * 50 + 100
    if name in ("td3", "ddpg"):
        policy = make_deterministic_actor(OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalize_obs=True)
        critic = make_qvalue_critic(
            OBSERVATION_SPEC, ACTION_SPEC, (16,), "relu", normalizer=find_normalizer(policy)
        )
        if name == "td3":
            loss = TensorTD3Loss(
                policy[0], critic, action_spec=ACTION_SPEC, delay_actor=True, delay_qvalue=True
            )
        else:
            loss = TensorDDPGLoss(policy[0], critic, delay_actor=True, delay_value=True)
        online_params, target_params, network = (
            "actor_network_params",
            "target_actor_network_params",
            policy[0],
        )
    else:
        actions = Categorical(4, shape=(1,))
        options = {"distributional": True, "num_atoms": 11} if name == "c51" else {}
        policy = make_q_actor(OBSERVATION_SPEC, actions, hidden_sizes=(16,), normalize_obs=True, **options)
        if name == "c51":
            loss = NStepDistributionalDQNLoss(policy[0], gamma=0.9, delay_value=True)
        else:
            loss = TensorDQNLoss(policy[0], action_space=actions)
        online_params, target_params, network = (
            "value_network_params",
            "target_value_network_params",
            policy[0],
        )
    normalizer = find_normalizer(policy)
    updater = make_target_updater(loss, 1) if name in ("dqn", "c51") else SoftUpdate(loss, tau=1.0)
    data = TensorDict({"observation": observation}, [64])

    def outputs(params):
        with getattr(loss, params).to_module(network):
            return network(data.clone()).get("action_value" if name in ("dqn", "c51") else "action")

    for step in range(4):
        if step == 2:  # what loss.to(device) does to each tensor: the statistics must stay one set
            loss._apply(torch.clone)
            normalizer = find_normalizer(policy)
        normalizer.update(observation * (step + 1) - 20 * step)
        updater.step()  # tau 1 (or a hard copy): the target network is the online one
        own_output = network(data.clone()).get("action_value" if name in ("dqn", "c51") else "action")
        assert torch.equal(outputs(online_params), outputs(target_params))
        assert torch.equal(
            outputs(online_params), own_output
        )  # the loss reads what the collector's policy reads
        shared = normalizer.mean.data_ptr()  # the online statistics themselves, not a copy
        assert any(tensor.data_ptr() == shared for tensor in getattr(loss, target_params).values(True, True))
