"""Evolution Strategies (Salimans et al., 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement
Learning", arXiv:1703.03864).

No gradients through the policy and no value function: each generation perturbs the parameters ``theta`` of a
deterministic policy along ``--num-envs / 2`` Gaussian directions, both ways (antithetic pairs: ``theta +
sigma eps`` and ``theta - sigma eps``), runs one episode (``--episodes-per-member``) with each of the
``--num-envs`` perturbed policies, ranks the returns (centred ranks in [-0.5, 0.5], ties sharing their rank)
and moves ``theta`` along ``sum_i (rank+_i - rank-_i) eps_i / P`` with Adam and L2 weight decay.

The whole population acts in one batched call per step: the policy network runs under ``P`` parameter sets
with ``torch.func.functional_call`` inside ``torch.vmap`` (:class:`agents.es.PopulationNetwork`), env ``i``
stepping with member ``i``, through TorchRL's collector. With ``--collector-backend ray`` the population is split across
Ray workers instead (see README). A frame is an env step inside an evaluated episode; the envs of a generation
step in polls of ``--steps-per-env`` until the longest episode ends, so steps past the end of shorter episodes are
simulated and not counted. Episodes longer than the env's time limit (1000 steps for an id without one) are cut
there.

The defaults solve CartPole-v1 (deterministic evaluation mean >= 475 over 20 episodes): see README for the
generations and time it takes.

    python -m recipes.es --env-backend torch                 # CartPole-v1, batched torch env
    python -m recipes.es --env-id Pendulum-v1 --env-backend torch --help
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from agents import Agent, find_normalizer
from agents.agent import EVALUATION_STEP_LIMIT
from agents.es import PopulationEvaluator, antithetic_gradient, centered_ranks, make_es_policy
from agents.networks import refuse_action_masks
from agents.options import Options, defaults
from envs.vector import env_spec
from errors import InputError
from training import (
    Callback,
    Run,
    RunConfig,
    TrainingState,
    apply_preset,
    check_ranges,
    make_training_env,
    prepare_process,
    recipe_main,
    require_positive,
    run_cli,
)
from training.collectors import env_construction
from training.distributed import RayPopulationEvaluator

PRESETS = Path(__file__).with_name("presets") / "es.toml"  # hyperparameters per env


@dataclass
class SearchConfig(Options):
    sigma: float = 0.1
    """Standard deviation of the parameter perturbations."""
    episodes_per_member: int = 1
    """Episodes run with each perturbed policy; its fitness is their mean return."""
    steps_per_env: int = 50
    """Steps each env takes per collector poll while a generation's episodes run."""


@dataclass
class OptimConfig(Options):
    lr: float = 0.03
    """Adam step size on the estimated gradient."""
    weight_decay: float = 0.005
    """L2 coefficient added to the gradient (the paper's 0.005)."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (32, 32)
    """Hidden layer widths of the policy."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "relu"
    """Activation between hidden layers (ReLU solved Pendulum-v1 in fewer generations than tanh)."""
    normalize_obs: bool = False
    """Normalise observations with running statistics (updated from every generation's episodes, saved in the
    agent)."""


@dataclass
class WorkerConfig(Options):
    worker_timeout_s: float = 600.0
    """Longest wait for a Ray worker's share of a generation before the run stops with an error
    (--collector-backend ray)."""
    worker_restarts: int = 1
    """Times Ray may restart each worker that dies (its share of the generation is rerun)."""


@dataclass
class ESConfig(Options):
    """Evolution Strategies: antithetic Gaussian search with rank shaping and Adam.

    --num-envs is the population size (even: antithetic pairs); the batched env holds num-envs x
    episodes-per-member envs."""

    run: RunConfig = field(
        default_factory=defaults(RunConfig, num_envs=32, total_frames=2_000_000, eval_every=20_000)
    )
    search: SearchConfig = field(default_factory=SearchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    workers: WorkerConfig = field(default_factory=WorkerConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range or that do not combine."""
        self.run.validate()
        if self.run.compile:
            raise InputError(
                "--compile has nothing to compile in recipes.es (no loss, no backward pass); leave it out."
            )
        search, optim = self.search, self.optim
        require_positive(episodes_per_member=search.episodes_per_member, steps_per_env=search.steps_per_env)
        if self.run.num_envs % 2:
            raise InputError(
                f"--num-envs is the ES population and must be even (antithetic pairs), got {self.run.num_envs}."
            )
        check_ranges(
            sigma=(search.sigma, "(0, inf)"),
            lr=(optim.lr, "(0, inf)"),
            weight_decay=(optim.weight_decay, "[0, inf)"),
        )
        if self.run.collector_backend == "multiprocess":
            raise InputError(
                "ES runs its population in one batched env (--collector-backend single) or on Ray workers "
                "(--collector-backend ray); multiprocess is not offered."
            )
        if self.workers.worker_timeout_s <= 0 or self.workers.worker_restarts < 0:
            raise InputError("--worker-timeout-s must be > 0 and --worker-restarts >= 0.")


@recipe_main
def main(config: ESConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train ES as configured and return the run summary (see ``training.run``)."""
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, search_config, optim_config = config.run, config.search, config.optim
    prepare_process(run_config)
    device = torch.device(run_config.device)
    population_size = run_config.num_envs
    pairs = population_size // 2
    episodes_per_member = search_config.episodes_per_member
    num_envs = population_size * episodes_per_member
    # an episode's longest length: the time limit given (--max-episode-steps or in --env-kwargs), else the id's
    max_steps = (
        run_config.env_make_kwargs.get("max_episode_steps")
        or env_spec(run_config.env_id).max_episode_steps
        or EVALUATION_STEP_LIMIT
    )

    # env + modules: the agent owns theta (the policy); the population is run by an evaluator on a batched env
    # of P * k envs (member i acting in envs i*k .. i*k + k - 1), here or on Ray workers
    env = make_training_env(run_config, device, num_envs=num_envs)
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "normalize_obs": config.network.normalize_obs,
    }
    observation_spec = env.observation_spec["observation"]
    try:
        refuse_action_masks(env, "ES")
        policy = make_es_policy(observation_spec, env.action_spec, **policy_kwargs).to(device)
        agent = Agent(
            policy,
            run_config.env_id,
            env.single_observation_space,
            env.single_action_space,
            "es",
            policy_builder=make_es_policy,
            policy_kwargs=policy_kwargs,
        )
    except InputError:
        env.close()
        raise
    normalizer = find_normalizer(policy)
    parameters = list(policy.parameters())
    remote = run_config.collector_backend == "ray"
    if remote:  # each worker builds its own env and policy
        env.close()
        evaluator = RayPopulationEvaluator(
            run_config.num_workers,
            run_config.ray_address,
            config.workers.worker_timeout_s,
            env_id=run_config.env_id,
            num_envs=num_envs,
            backend=run_config.env_backend,
            seed=run_config.seed,
            policy_kwargs=policy_kwargs,
            steps_per_env=search_config.steps_per_env,
            max_steps=max_steps,
            env_options={**env_construction(run_config), "vectorization": run_config.vectorization},
            max_restarts=config.workers.worker_restarts,
        )
    else:
        evaluator = PopulationEvaluator(env, policy, search_config.steps_per_env, max_steps, device)

    # optimizer: Adam ascends the ES gradient (given to it negated) with L2 weight decay
    optimizer = torch.optim.Adam(parameters, lr=optim_config.lr, weight_decay=optim_config.weight_decay)

    # logger, evaluation, checkpoints, resume (at a generation's end the envs hold no episode in flight: only their
    # generators matter; a Ray evaluator keeps its envs out of reach, and resume refuses it)
    counters = {"generation": 0}
    training = TrainingState(
        env=None if remote else env,
        collector=evaluator if remote else evaluator.collector,
        modules={"policy": policy},
        optimizers={"adam": optimizer},
        counters=counters,
    )
    run = Run("es", config, run_config, agent, training, callbacks=callbacks)

    sigma = search_config.sigma
    sizes = [parameter.numel() for parameter in parameters]  # theta's split into the parameters

    def update(noise, returns):
        shaped = centered_ranks(returns)
        gradient = antithetic_gradient(noise, shaped[:pairs], shaped[pairs:])
        optimizer.zero_grad(set_to_none=True)
        for parameter, chunk in zip(parameters, (-gradient).split(sizes)):
            parameter.grad = chunk.view_as(parameter).clone()
        optimizer.step()
        return gradient.norm()

    # loop: one generation per iteration
    try:
        while not run.ended:  # a resumed run that had ended only finishes
            with torch.no_grad():
                theta = torch.nn.utils.parameters_to_vector(parameters)
                noise = torch.randn(pairs, theta.numel(), device=device)
            steps, episode_returns, episode_lengths = evaluator.evaluate(
                theta + sigma * torch.cat([noise, -noise]),
                normalizer.state_dict() if remote and normalizer is not None else None,
            )
            run.check_finite(steps, {})  # before a NaN return could be ranked
            returns = episode_returns.view(population_size, episodes_per_member).mean(-1)
            gradient_norm = update(noise, returns)
            if normalizer is not None:
                normalizer.update(steps.get("observation"))
            counters["generation"] += 1
            metrics = {
                "train/generation": counters["generation"],
                "train/population_return_mean": returns.mean().item(),
                "train/population_return_max": returns.max().item(),
                "train/episode_length_mean": episode_lengths.float().mean().item(),
                "train/gradient_norm": gradient_norm.item(),
                "train/theta_norm": theta.norm().item(),
            }
            if run.record_batch(steps, metrics):
                if counters["generation"] == 1 and run.frames > run_config.total_frames:
                    warnings.warn(
                        f"--total-frames {run_config.total_frames} is less than one generation: the run collects "
                        f"whole generations, here {run.frames} frames ({population_size} members x "
                        f"{episodes_per_member} episodes). Raise --total-frames, or lower --num-envs (the "
                        "population) or --episodes-per-member for a shorter run.",
                        stacklevel=1,
                    )
                break
    finally:  # workers and envs are released whatever ends the loop
        evaluator.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, ESConfig, __doc__, presets=PRESETS)
