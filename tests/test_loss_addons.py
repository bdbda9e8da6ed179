"""Policy-loss add-ons: the KL penalty towards a reference policy, and how recipes add their terms."""

import json
from functools import partial

import pytest
import torch
from run_helpers import tiny_off_policy, tiny_reinforce, tiny_vpg
from tensordict import TensorDict
from torch import nn
from torchrl.objectives import ClipPPOLoss

from agents import Agent, KLPenalty, addon_losses, build_loss_addons, make_actor, make_critic
from envs import make_env
from errors import InputError
from recipes import a2c, ppo, reinforce, rnd_ppo, sac, vpg
from training import RunConfig


def cartpole_actor(seed=0, prefer_right=False):
    env = make_env("CartPole-v1", num_envs=1)
    torch.manual_seed(seed)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    if prefer_right:  # a reference that pushes right 95% of the time whatever it sees
        last_layer = [module for module in actor.modules() if isinstance(module, nn.Linear)][-1]
        with torch.no_grad():
            last_layer.weight.zero_()
            last_layer.bias.copy_(torch.tensor([-1.5, 1.5]))
    return actor


def observations(seed=1):
    return make_env("CartPole-v1", num_envs=8, seed=seed).rollout(40, break_when_any_done=False).reshape(-1)


def test_kl_is_zero_against_itself_and_its_gradient_reaches_only_the_trained_actor():
    actor = cartpole_actor()
    data = observations()
    assert KLPenalty(actor, actor, coef=1.0)(data)["kl"].item() == pytest.approx(0.0, abs=1e-6)
    reference = cartpole_actor(prefer_right=True)
    penalty = KLPenalty(actor, reference, coef=3.0)
    output = penalty(data)
    assert output["loss_kl"].item() == pytest.approx(3.0 * output["kl"].item()) and output["kl"].item() > 0.1
    output["loss_kl"].backward()
    assert all(parameter.grad is not None for parameter in actor.parameters())
    assert all(not parameter.requires_grad for parameter in penalty.reference_actor.parameters())
    # the reference is a copy: changing the module passed in does not move it
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(1.0)
    assert penalty(data)["kl"].item() == pytest.approx(output["kl"].item())


def test_kl_penalty_changes_the_ppo_gradient():
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    actor = cartpole_actor()
    critic = make_critic(env.observation_spec["observation"])
    with torch.no_grad():
        data = env.rollout(16, actor, break_when_any_done=False).reshape(-1)
    data["advantage"] = torch.randn(data.shape + (1,), generator=torch.Generator().manual_seed(0))
    data["value_target"] = torch.zeros(data.shape + (1,))
    loss_module = ClipPPOLoss(actor, critic, functional=False)
    addons = build_loss_addons(
        [partial(KLPenalty, reference_actor=cartpole_actor(prefer_right=True), coef=10.0)], actor
    )

    def gradient(with_addons):
        actor.zero_grad()
        total = loss_module(data)["loss_objective"]
        if with_addons:
            total = total + addon_losses(addons, data)[0]
        total.backward()
        return torch.cat([parameter.grad.flatten() for parameter in actor.parameters()])

    plain, penalised = gradient(False), gradient(True)
    assert not torch.allclose(plain, penalised, atol=1e-4)


def test_addon_losses_sum_loss_terms_and_log_the_rest():
    class Constant(nn.Module):
        def __init__(self, **values):
            super().__init__()
            self.values = values

        def forward(self, tensordict):
            return TensorDict({key: torch.tensor(value) for key, value in self.values.items()})

    total, logged = addon_losses(
        [Constant(loss_a=1.0, loss_b=2.0, info=5.0), Constant(loss_a=0.5)], TensorDict()
    )
    assert total.item() == 3.5
    assert logged.to_dict() == {
        "addon0_loss_a": torch.tensor(1.0),
        "addon0_loss_b": torch.tensor(2.0),
        "addon0_info": torch.tensor(5.0),
        "addon1_loss_a": torch.tensor(0.5),
    }
    total, logged = addon_losses([], TensorDict())
    assert total == 0.0 and logged.is_empty()
    with pytest.raises(InputError, match="scalars"):
        addon_losses([Constant(loss_a=[1.0, 2.0])], TensorDict())
    with pytest.raises(InputError, match="not a torch.nn.Module"):
        build_loss_addons([lambda actor: 0.1], cartpole_actor())
    with pytest.raises(InputError, match="coef"):
        KLPenalty(cartpole_actor(), cartpole_actor(), coef=-1.0)


def tiny_config(recipe, output_dir):
    run = RunConfig(
        env_id="CartPole-v1",
        num_envs=4,
        total_frames=1024,
        eval_every=1024,
        eval_episodes=2,
        output_dir=output_dir,
        logger="csv",
        video=False,
        progress=False,
        stop_at_return=float("inf"),
    )
    if recipe is a2c:
        # one gradient step per batch: 64 of them
        return a2c.A2CConfig(
            run=run, collector=a2c.CollectorConfig(steps_per_env=4), optim=a2c.OptimConfig(lr=1e-2)
        )
    config_class = ppo.PPOConfig if recipe is ppo else rnd_ppo.RNDPPOConfig
    return config_class(
        run=run,
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=4, lr=1e-2),
    )


@pytest.mark.parametrize("recipe", [ppo, rnd_ppo, a2c], ids=["ppo", "rnd_ppo", "a2c"])
def test_a_heavy_kl_penalty_pulls_the_trained_policy_to_the_reference(recipe, output_dir):
    reference = cartpole_actor(prefer_right=True)
    data = observations()
    untrained = KLPenalty(cartpole_actor(), reference)(data)["kl"].item()
    recipe.main(
        tiny_config(recipe, output_dir),
        loss_addons=[partial(KLPenalty, reference_actor=reference, coef=100.0)],
    )
    trained = KLPenalty(Agent.load(output_dir).policy, reference)(data)["kl"].item()
    assert untrained > 0.5  # a fresh policy is near uniform, far from "right 95% of the time"
    assert trained < 0.03
    logged = (output_dir / "csv" / "scalars" / "train").glob("addon0_*.csv")
    assert {path.stem for path in logged} == {"addon0_loss_kl", "addon0_kl"}


def test_kl_penalty_works_on_batches_collected_by_a_gsde_actor():
    # collectors drop the actor's private "_eps_gSDE" input from the batches they return
    from torchrl.collectors import Collector

    from agents import make_gsde_actor, make_gsde_env

    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    spec = env.observation_spec["observation"]
    actor, reference = make_gsde_actor(spec, env.action_spec), make_gsde_actor(spec, env.action_spec)
    collector = Collector(make_gsde_env(env, actor), actor, frames_per_batch=16, total_frames=16)
    batch = next(iter(collector)).reshape(-1)
    collector.shutdown()
    assert "_eps_gSDE" not in batch.keys()  # noqa: SIM118 (TensorDict has no __contains__)
    penalty = KLPenalty(actor, reference)(batch)
    assert penalty["kl"] > 0 and torch.isfinite(penalty["loss_kl"])


def reference_checkpoint(path):
    """An agent checkpoint whose policy pushes right 95% of the time (see cartpole_actor)."""
    env = make_env("CartPole-v1", num_envs=1)
    agent = Agent(
        cartpole_actor(prefer_right=True),
        "CartPole-v1",
        env.single_observation_space,
        env.single_action_space,
        "ppo",
        policy_builder=make_actor,
    )
    agent.save(path)
    return path


@pytest.mark.parametrize(
    ("recipe", "make_config"),
    [
        (ppo, partial(tiny_config, ppo)),
        (a2c, partial(tiny_config, a2c)),
        (rnd_ppo, partial(tiny_config, rnd_ppo)),
        (reinforce, lambda output_dir: tiny_reinforce(output_dir, total_frames=4_096, logger="csv")),
        (vpg, lambda output_dir: tiny_vpg(output_dir, total_frames=4_096, logger="csv")),
    ],
    ids=["ppo", "a2c", "rnd_ppo", "reinforce", "vpg"],
)
def test_kl_to_a_checkpoint_from_the_options_pulls_the_policy_to_it(recipe, make_config, tmp_path):
    output_dir, data = tmp_path / "run", observations()
    reference = Agent.load(reference_checkpoint(tmp_path / "reference.ckpt")).policy
    untrained = KLPenalty(cartpole_actor(), reference)(data)["kl"].item()
    config = make_config(output_dir)
    config.addons.kl_to, config.addons.kl_coef = tmp_path / "reference.ckpt", 100.0
    if recipe in (reinforce, vpg):
        config.optim.lr = 1e-2
    recipe.main(config)
    trained = KLPenalty(Agent.load(output_dir).policy, reference)(data)["kl"].item()
    assert untrained > 0.5 and trained < 0.1 * untrained
    logged = (output_dir / "csv" / "scalars" / "train").glob("addon0_*.csv")
    assert {path.stem for path in logged} == {"addon0_loss_kl", "addon0_kl"}
    assert json.loads((output_dir / "config.json").read_text())["addons"]["kl_to"] == str(
        tmp_path / "reference.ckpt"
    )


def test_sac_takes_the_kl_penalty_too(tmp_path):
    make = tiny_off_policy(sac.SACConfig)
    sac.main(make(tmp_path / "reference"))
    reference = Agent.load(tmp_path / "reference").policy
    data = make_env("Pendulum-v1", num_envs=8, seed=1).rollout(40, break_when_any_done=False).reshape(-1)
    final_kl = {}
    for coef in (0.0, 1_000.0):
        config = make(tmp_path / f"coef-{coef}", seed=1, logger="csv")
        config.addons.kl_to, config.addons.kl_coef = tmp_path / "reference", coef
        sac.main(config)
        final_kl[coef] = KLPenalty(Agent.load(tmp_path / f"coef-{coef}").policy, reference)(data)["kl"].item()
        assert (tmp_path / f"coef-{coef}" / "csv" / "scalars" / "train" / "addon0_kl.csv").exists()
    assert final_kl[1_000.0] < 0.5 * final_kl[0.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"env_id": "Acrobot-v1"}, "that agent acts on observations"),
        ({"kl_coef": -1.0}, "--kl-coef must be a finite number >= 0"),
        ({"kl_to": "no/such/run"}, "No agent checkpoint"),
    ],
)
def test_bad_kl_options_are_refused(tmp_path, options, message):
    config = tiny_config(ppo, tmp_path / "run")
    config.addons.kl_to = options.get("kl_to", reference_checkpoint(tmp_path / "reference.ckpt"))
    config.addons.kl_coef = options.get("kl_coef", 0.1)
    config.run.env_id = options.get("env_id", "CartPole-v1")
    with pytest.raises(InputError, match=message):
        ppo.main(config)


def test_a_reference_of_another_kind_of_distribution_is_refused_before_collecting():
    from agents import make_gsde_actor

    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    spec, action_spec = env.observation_spec["observation"], env.action_spec
    tanh_normal = make_actor(spec, action_spec)
    for policy in (make_gsde_actor(spec, action_spec), make_actor(spec, action_spec, squash=False)):
        with pytest.raises(InputError, match="closed-form KL between .* and TanhNormal"):
            KLPenalty(policy, tanh_normal)
    KLPenalty(make_actor(spec, action_spec), tanh_normal)  # the same kind: accepted
    env.close()


def test_kl_options_are_flat_command_line_flags():
    import tyro

    for config_type in (
        ppo.PPOConfig,
        a2c.A2CConfig,
        rnd_ppo.RNDPPOConfig,
        reinforce.ReinforceConfig,
        vpg.VPGConfig,
        sac.SACConfig,
    ):
        config = tyro.cli(
            config_type, args=["--kl-to", "runs/x", "--kl-coef", "0.5"], config=(tyro.conf.OmitArgPrefixes,)
        )
        assert (str(config.addons.kl_to), config.addons.kl_coef) == ("runs/x", 0.5)


@pytest.mark.parametrize("recipe", [ppo, rnd_ppo], ids=["ppo", "rnd_ppo"])
def test_an_addon_reads_every_entry_of_the_minibatch_the_loss_gets(recipe, output_dir):
    seen = set()

    class NextObservationSize(nn.Module):  # an add-on that reads a next-step entry
        def __init__(self, actor):
            super().__init__()

        def forward(self, tensordict):
            seen.update(tensordict.keys(True, True))
            return TensorDict({"next_observation_norm": tensordict["next", "observation"].norm()})

    recipe.main(tiny_config(recipe, output_dir), loss_addons=[NextObservationSize])
    assert {("next", "observation"), "observation", "advantage"} <= seen
