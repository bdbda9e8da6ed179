"""Evolution Strategies parts: a deterministic policy, its population under vmap, fitness shaping, the gradient.

OpenAI-style ES (Salimans et al., 2017, arXiv:1703.03864) searches the parameters ``theta`` of a deterministic
policy directly: each generation evaluates ``theta + sigma * eps_i`` and ``theta - sigma * eps_i`` for ``P / 2``
Gaussian directions ``eps_i`` (antithetic pairs), turns the returns into centred ranks and steps along

    g = 1 / P * sum_i (F(theta + sigma eps_i) - F(theta - sigma eps_i)) eps_i

with Adam (``sigma`` is absorbed into the step size, as in the paper's code). :class:`PopulationNetwork` runs
the policy network under all ``P`` parameter sets in one batched call (``torch.func.functional_call`` under
``torch.vmap``), so a population steps through a batch of ``P`` envs like a single policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Bounded, Categorical, TensorSpec, Unbounded
from torchrl.envs import EnvBase
from torchrl.modules import TanhModule

from agents.continuous import unbounded_box_message
from agents.networks import find_normalizer, make_mlp, observation_encoder
from envs.specs import space_name
from errors import InputError


class ArgmaxAction(nn.Module):
    """The index of the largest logit: the action of a deterministic policy over a Discrete space."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)


def make_es_policy(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (32, 32),
    activation: str = "tanh",
    normalize_obs: bool = False,
) -> TensorDictSequential:
    """Build the deterministic policy that Evolution Strategies search over.

    ``policy[0]`` is the network (observation -> ``"logits"`` or ``"action_preactivation"``), ``policy[1]`` the
    head: the argmax over logits for a ``Categorical`` spec (Gymnasium ``Discrete``), ``tanh`` scaled into the
    bounds for a ``Bounded`` one (Gymnasium ``Box``). The policy has no randomness: sampling and evaluation act
    alike.

    Args:
        observation_spec: the spec of ``"observation"`` (batched).
        action_spec: the env's action spec (batched).
        hidden_sizes: widths of the hidden layers.
        activation: ``"tanh"``, ``"relu"``, ``"elu"`` or ``"silu"``.
        normalize_obs: put an :class:`ObservationNormalizer` in front of the network (its running statistics
            are buffers: shared by the whole population and saved with the agent).

    Returns:
        ``TensorDictSequential(network, head)`` reading ``"observation"`` and writing ``"action"``.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("CartPole-v1", num_envs=2)
        >>> policy = make_es_policy(env.observation_spec["observation"], env.action_spec)
        >>> policy(env.reset())["action"].shape
        torch.Size([2])
    """
    encoder, in_features = observation_encoder(observation_spec, normalize_obs)
    if type(action_spec) is Categorical:  # not its subclasses Binary and MultiCategorical
        network = nn.Sequential(encoder, make_mlp(in_features, action_spec.space.n, hidden_sizes, activation))
        return TensorDictSequential(
            TensorDictModule(network, in_keys=["observation"], out_keys=["logits"]),
            TensorDictModule(ArgmaxAction(), in_keys=["logits"], out_keys=["action"]),
        )
    if isinstance(action_spec, Bounded) and action_spec.dtype.is_floating_point and action_spec.ndim == 2:
        network = nn.Sequential(
            encoder, make_mlp(in_features, action_spec.shape[-1], hidden_sizes, activation)
        )
        return TensorDictSequential(
            TensorDictModule(network, in_keys=["observation"], out_keys=["action_preactivation"]),
            TanhModule(in_keys=["action_preactivation"], out_keys=["action"], spec=action_spec[0]),
        )
    if isinstance(action_spec, Unbounded) and action_spec.dtype.is_floating_point:
        raise InputError(unbounded_box_message("Evolution Strategies"))
    raise InputError(
        f"Evolution Strategies handle Discrete and one-dimensional Box actions, got {space_name(action_spec)} "
        "actions; for MultiDiscrete or MultiBinary actions use recipes.ppo or recipes.a2c."
    )


class PopulationNetwork(nn.Module):
    """``network`` evaluated under ``P`` parameter sets at once, one per consecutive block of the batch.

    The batch of ``N = P * k`` inputs is read as ``[P, k, ...]``: rows ``i * k`` to ``(i + 1) * k - 1`` use
    parameter set ``i``; until :meth:`set_population` is called, every row uses the network's own parameters.
    Buffers (an observation normaliser's statistics) are the network's own, shared by all.

    Args:
        network: the module whose parameters are perturbed; it is not modified.
    """

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network
        self.names = [name for name, _ in network.named_parameters()]
        self.shapes = [parameter.shape for _, parameter in network.named_parameters()]
        self.sizes = [parameter.numel() for _, parameter in network.named_parameters()]
        self.population: dict[str, torch.Tensor] | None = None

        def forward_one(parameters: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self.network, parameters, (inputs,))

        self._forward_all = torch.vmap(forward_one)

    @property
    def num_parameters(self) -> int:
        return sum(self.sizes)

    def set_population(self, flat_parameters: torch.Tensor) -> None:
        """Use the rows of ``flat_parameters`` (``[P, num_parameters]``, in ``named_parameters`` order)."""
        chunks = flat_parameters.split(self.sizes, dim=-1)
        self.population = {
            name: chunk.reshape(flat_parameters.shape[0], *shape)
            for name, chunk, shape in zip(self.names, chunks, self.shapes)
        }

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.population is None:  # no population yet: every row uses the network's own parameters
            return self.network(inputs)
        population_size = next(iter(self.population.values())).shape[0]
        if inputs.shape[0] % population_size:
            raise ValueError(
                f"A batch of {inputs.shape[0]} inputs does not split into {population_size} parameter sets."
            )
        grouped = inputs.reshape(population_size, inputs.shape[0] // population_size, *inputs.shape[1:])
        outputs = self._forward_all(self.population, grouped)
        return outputs.reshape(inputs.shape[0], *outputs.shape[2:])


def make_population_policy(policy: TensorDictSequential) -> tuple[TensorDictSequential, PopulationNetwork]:
    """The policy of :func:`make_es_policy` with its network replaced by a :class:`PopulationNetwork`.

    Returns:
        ``(population_policy, population_network)``; call ``population_network.set_population`` before each
        generation's rollout.
    """
    network_module, head = policy[0], policy[1]
    population_network = PopulationNetwork(network_module.module)
    population_policy = TensorDictSequential(
        TensorDictModule(
            population_network, in_keys=network_module.in_keys, out_keys=network_module.out_keys
        ),
        head,
    )
    return population_policy, population_network


def centered_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks of ``values`` scaled to ``[-0.5, 0.5]`` (the paper's fitness shaping); tied values share their mean
    rank, so a pair with equal returns contributes nothing to the gradient."""
    if values.numel() == 1:
        return torch.zeros_like(values, dtype=torch.float32)
    ranks = torch.empty_like(values, dtype=torch.float32)
    ranks[values.argsort()] = torch.arange(values.numel(), dtype=torch.float32, device=values.device)
    _, groups = torch.unique(values, return_inverse=True)
    rank_sum = torch.zeros(int(groups.max()) + 1, device=values.device).index_add_(0, groups, ranks)
    group_size = torch.bincount(groups).float()
    ranks = (rank_sum / group_size)[groups]
    return ranks / (values.numel() - 1) - 0.5


def antithetic_gradient(noise: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """The ascent direction ``sum_i (F+_i - F-_i) eps_i / P`` of ``P / 2`` antithetic pairs.

    Args:
        noise: ``[P / 2, D]`` directions ``eps_i``.
        positive: ``[P / 2]`` shaped fitness of ``theta + sigma eps_i``.
        negative: ``[P / 2]`` shaped fitness of ``theta - sigma eps_i``.
    """
    return (positive - negative) @ noise / (2 * noise.shape[0])


def first_episodes(
    batches: Iterator[TensorDictBase], num_envs: int, max_steps: int
) -> tuple[TensorDictBase, torch.Tensor, torch.Tensor]:
    """Read collector batches (``[num_envs, steps]``) until every env has finished one episode.

    An episode still running after ``max_steps`` steps is cut there.

    Returns:
        The steps of those first episodes (flat), and each env's return and length.
    """
    finished = None
    returns, lengths, steps = 0.0, 0, []
    taken = 0
    while finished is None or not finished.all():
        batch = next(batches)
        done = batch.get(("next", "done")).reshape(batch.shape)
        if finished is None:
            finished = torch.zeros(num_envs, dtype=torch.bool, device=done.device)
        ended_before = (done.long().cumsum(-1) - done.long()) > 0
        inside = ~(ended_before | finished[:, None])
        taken += batch.shape[-1]
        if taken >= max_steps:  # the time limit: nothing after step max_steps counts
            inside[:, batch.shape[-1] - (taken - max_steps) :] = False
        reward = batch.get(("next", "reward")).reshape(batch.shape)
        returns = returns + (reward * inside).sum(-1)
        lengths = lengths + inside.sum(-1)
        steps.append(batch[inside])
        finished = finished | (done & inside).any(-1) | (taken >= max_steps)
    return torch.cat(steps), returns, lengths


class PopulationEvaluator:
    """Runs one episode in each env of a batch, env ``j`` acting with population member ``j // k``.

    A TorchRL ``Collector`` steps ``env`` with the population policy in polls of ``steps_per_env`` steps; each
    :meth:`evaluate` resets the envs and reads polls until every env has finished its episode (cut at
    ``max_steps``).

    Args:
        env: the batched env, ``P * k`` envs for ``P`` members and ``k`` episodes each.
        policy: a policy from :func:`make_es_policy`; its network is run under the population's parameters and
            its observation normaliser (if any) is used as it is.
        steps_per_env: steps per collector poll.
        max_steps: the longest episode.
        device: device of the policy and of the collected data.
    """

    def __init__(
        self,
        env: EnvBase,
        policy: TensorDictSequential,
        steps_per_env: int,
        max_steps: int,
        device: torch.device | str = "cpu",
    ):
        self.env = env
        self.policy = policy
        self.num_envs = env.batch_size[0]
        self.max_steps = max_steps
        population_policy, self.population_network = make_population_policy(policy)
        self.collector = Collector(
            env,
            population_policy,
            frames_per_batch=self.num_envs * steps_per_env,
            total_frames=-1,
            env_device=env.device,
            policy_device=device,
            storing_device=device,
            track_traj_ids=False,
            auto_register_policy_transforms=False,
        )
        self._batches = iter(self.collector)

    def evaluate(
        self, population: torch.Tensor, normalizer_state: dict[str, torch.Tensor] | None = None
    ) -> tuple[TensorDictBase, torch.Tensor, torch.Tensor]:
        """Run the episodes of ``population`` (``[P, num_parameters]``, flat parameter sets).

        Args:
            population: one row of flat parameters per member.
            normalizer_state: statistics to load into the policy's observation normaliser first (workers
                holding their own copy of the policy); None keeps them.

        Returns:
            The steps of the episodes (flat), and each env's return and length (``[P * k]``).
        """
        if normalizer_state is not None:
            find_normalizer(self.policy).load_state_dict(normalizer_state)
        with torch.no_grad():
            self.population_network.set_population(population)
            self.collector.reset()
            return first_episodes(self._batches, self.num_envs, self.max_steps)

    def close(self) -> None:
        self.collector.shutdown()
        self.env.close()


__all__ = [
    "ArgmaxAction",
    "PopulationEvaluator",
    "PopulationNetwork",
    "antithetic_gradient",
    "centered_ranks",
    "first_episodes",
    "make_es_policy",
    "make_population_policy",
]
