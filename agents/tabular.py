"""Tabular action values: a Q-table indexed by a Discrete observation, by the values of an integer Box one or by a
grid cell of a Box one."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.data import Binary, Bounded, Categorical, MultiCategorical, TensorSpec, Unbounded
from torchrl.modules import EGreedyModule, QValueActor

from agents.networks import multi_discrete_sizes
from errors import InputError

CELL_KEY = "cell"  # the table row of an observation, written by the policy next to "observation"
MAX_TABLE_ENTRIES = 50_000_000  # 200 MB of float32: more is a mistake for a table, not a plan


def _count(number: int) -> str:
    """``number`` with thousands separators, or its order of magnitude when it has more than 15 digits (the
    cells of a grid over an image: Python refuses to print an integer of more than 4,300 digits)."""
    if number < 10**15:
        return f"{number:,}"
    return f"about 10^{int((number.bit_length() - 1) * 0.30103)}"


def _box_bounds(low: np.ndarray | torch.Tensor, high: np.ndarray | torch.Tensor) -> str:
    """The bounds of a Box for an error message: every value for a few dimensions, else its shape and range."""
    low, high = torch.as_tensor(low), torch.as_tensor(high)
    if low.numel() <= 8:
        return f"between {low.tolist()} and {high.tolist()}"
    return f"of shape {tuple(low.shape)} between {low.min().item()} and {high.max().item()}"


def _few(items: list) -> str:
    """The first few of ``items`` for an error message, with how many there are in all."""
    return str(items) if len(items) <= 8 else f"{str(items[:8])[:-1]}, ...] ({len(items):,} in all)"


def check_finite_bounds(low: np.ndarray | torch.Tensor, high: np.ndarray | torch.Tensor) -> None:
    """Raise :class:`InputError` naming the dimensions of a Box whose ``low`` or ``high`` is infinite.

    Args:
        low: lower bounds of the observation space.
        high: upper bounds, of the same shape.

    Raises:
        InputError: some bound is infinite (or NaN), so the box cannot be cut into grid cells.
    """
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    unbounded = ~(np.isfinite(low) & np.isfinite(high))
    if unbounded.any():
        dims = [tuple(index.tolist()) if low.ndim > 1 else int(index[0]) for index in np.argwhere(unbounded)]
        raise InputError(
            f"The env's observation bounds are unbounded in dimension(s) {_few(dims)} (bounds "
            f"{_box_bounds(low, high)}); tabular Q-learning needs a finite box to cut into grid cells. Wrap the "
            "env so its observations have finite bounds, or use a function approximator (recipes.ppo)."
        )


class ObservationGrid(nn.Module):
    """Maps Box observations to the index of their cell in a regular grid over the box.

    Each dimension is cut into ``grid_size`` equal bins between its bounds; values outside the box fall in the
    edge bins. Cells are numbered row-major (the last dimension varies fastest), from 0 to
    ``grid_size ** dims - 1``.

    Args:
        low: lower bounds of one observation (any shape).
        high: upper bounds, of the same shape.
        grid_size: bins per dimension.

    Raises:
        InputError: a bound is infinite, a dimension has ``high <= low``, or ``grid_size`` is below 1.

    Examples:
        >>> grid = ObservationGrid(torch.tensor([-1.2, -0.07]), torch.tensor([0.6, 0.07]), grid_size=10)
        >>> grid(torch.tensor([[-1.2, -0.07], [0.6, 0.07], [-0.3, 0.0]]))
        tensor([ 0, 99, 55])
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor, grid_size: int):
        super().__init__()
        check_finite_bounds(low, high)
        if grid_size < 1:
            raise InputError(f"--grid-size must be a positive integer, got {grid_size}.")
        self.grid_size = grid_size
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32).clone())
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32).clone())
        if not (self.high > self.low).all():
            flat = torch.nonzero((self.high <= self.low).flatten()).flatten().tolist()
            raise InputError(
                f"The observation box is empty in flattened dimension(s) {_few(flat)} (high <= low): no grid "
                "fits it."
            )
        dims = self.low.numel()
        strides = grid_size ** torch.arange(dims - 1, -1, -1, dtype=torch.int64)
        self.register_buffer("strides", strides.reshape(self.low.shape))

    @property
    def num_cells(self) -> int:
        return self.grid_size ** self.low.numel()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        fraction = (observation - self.low) / (self.high - self.low)
        bins = (fraction * self.grid_size).floor().clamp(0, self.grid_size - 1).long()
        batch_shape = observation.shape[: observation.ndim - self.low.ndim]
        return (bins * self.strides).reshape(*batch_shape, -1).sum(-1)


class IntegerCells(nn.Module):
    """Maps integer Box observations to a row of their own: every combination of values between the bounds is a
    cell, numbered row-major (the last dimension varies fastest); values outside the box fall in the edge cells.

    Args:
        low: lower bounds of one observation (integers, any shape).
        high: upper bounds, of the same shape.

    Raises:
        InputError: a dimension has ``high < low``, or the box holds more cells than a table may have.

    Examples:
        >>> cells = IntegerCells(torch.tensor([0, -1]), torch.tensor([3, 1]))
        >>> cells(torch.tensor([[0, -1], [3, 1], [1, 0]]))
        tensor([ 0, 11,  4])
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor):
        super().__init__()
        low, high = torch.as_tensor(low).long(), torch.as_tensor(high).long()
        # in Python's integers: int64 bounds as wide as the dtype would overflow (high - low + 1)
        sizes = [
            top - bottom + 1
            for bottom, top in zip(low.flatten().tolist(), high.flatten().tolist(), strict=True)
        ]
        if min(sizes, default=1) < 1:
            raise InputError("The observation box is empty in some dimension (high < low): no cell fits it.")
        self.num_cells = 1
        for size in sizes:
            self.num_cells *= size
            if self.num_cells > MAX_TABLE_ENTRIES:
                raise InputError(
                    f"Integer Box observations {_box_bounds(low, high)} take more than "
                    f"{MAX_TABLE_ENTRIES:,} table rows, one per combination of values: pass --grid-size N to cut "
                    "each dimension into N bins instead, or train a network (recipes.dqn, recipes.ppo)."
                )
        strides = [1] * len(sizes)
        for index in range(len(sizes) - 2, -1, -1):
            strides[index] = strides[index + 1] * sizes[index + 1]
        self.register_buffer("low", low.clone())
        self.register_buffer("high", high.clone())
        self.register_buffer("strides", torch.tensor(strides, dtype=torch.int64).reshape(low.shape))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        values = torch.minimum(torch.maximum(observation.round().long(), self.low), self.high)
        batch_shape = observation.shape[: observation.ndim - self.low.ndim]
        return ((values - self.low) * self.strides).reshape(*batch_shape, -1).sum(-1)


class QTable(TensorDictModuleBase):
    """A table of action values as a TensorDict module: ``"observation"`` -> ``"cell"`` -> ``"action_value"``.

    The encoder turns each observation into its row of the table (the cell index, kept in the tensordict so
    that an update can tell which transitions share a state), and the row holds the action values. The table
    starts at zero: with rewards below zero that is optimistic, which drives exploration on its own.

    Args:
        encoder: maps a batch of observations to integer rows: ``nn.Identity()`` for Discrete observations (already
            ``0..n-1``) or an :class:`ObservationGrid`.
        num_states: rows of the table.
        num_actions: columns of the table.

    Examples:
        >>> from tensordict import TensorDict
        >>> table = QTable(nn.Identity(), num_states=5, num_actions=2)
        >>> table(TensorDict(observation=torch.tensor([0, 4]), batch_size=[2]))["action_value"]
        tensor([[0., 0.],
                [0., 0.]], grad_fn=<IndexBackward0>)
    """

    def __init__(self, encoder: nn.Module, num_states: int, num_actions: int):
        self.in_keys = ["observation"]
        self.out_keys = [CELL_KEY, "action_value"]
        super().__init__()
        self.encoder = encoder
        self.values = nn.Parameter(torch.zeros(num_states, num_actions))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        # A TensorDictModuleBase writes its outputs directly: TensorDictModule's generic output path costs more
        # than the table lookup itself.
        cell = self.encoder(tensordict.get("observation"))
        tensordict.set(CELL_KEY, cell)
        tensordict.set("action_value", self.values[cell])
        return tensordict


def make_q_table(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    grid_size: int | None = None,
    epsilon: float = 1.0,
) -> TensorDictSequential:
    """Build an epsilon-greedy policy over a table of action values, initialised to zeros.

    The policy runs three TensorDict modules: the :class:`QTable` (``"observation"`` -> ``"cell"`` ->
    ``"action_value"``, one row per state), a ``QValueModule`` writing the greedy ``"action"`` and its
    ``"chosen_action_value"``, and an ``EGreedyModule`` that replaces the action by a random one with
    probability ``eps`` under ``ExplorationType.RANDOM`` only (the collector's default), so deterministic
    evaluation and :meth:`Agent.predict` are greedy. ``eps`` is a buffer: training anneals it in place and it is
    saved with the agent.

    Args:
        observation_spec: the spec of ``"observation"`` (batched): ``Categorical`` (a Gymnasium ``Discrete``
            space, one row per value), a finite ``Bounded`` float box (one row per grid cell) or an integer box
            (one row per combination of values, :class:`IntegerCells`, or per grid cell with ``grid_size``).
        action_spec: the env's action spec (batched); must be ``Categorical``.
        grid_size: bins per observation dimension for Box observations (``grid_size ** dims`` rows); None for
            Discrete observations and integer Boxes read value by value.
        epsilon: initial probability of a random action.

    Returns:
        A ``TensorDictSequential`` of a ``QValueActor`` (:func:`q_value_actor`, what ``DQNLoss`` trains) and an
        ``EGreedyModule`` (:func:`egreedy_module`).

    Raises:
        InputError: a non-Discrete action space, an unsupported or unbounded observation space, a missing or
            useless ``grid_size``, or a table too large to hold.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("Taxi-v4", num_envs=2)
        >>> policy = make_q_table(env.observation_spec["observation"], env.action_spec)
        >>> policy(env.reset())["action_value"].shape
        torch.Size([2, 6])
    """
    if type(action_spec) is not Categorical:  # not its subclasses MultiCategorical and Binary
        raise InputError(
            f"Tabular Q-learning needs a Discrete action space, got {type(action_spec).__name__} actions; "
            "use recipes.ppo for Box, MultiDiscrete or MultiBinary action spaces."
        )
    if isinstance(observation_spec, MultiCategorical | Binary):  # a cell per combination of values
        if grid_size is not None:
            raise InputError(
                "--grid-size cuts Box observations into cells; drop it for MultiDiscrete or MultiBinary observations."
            )
        shape = observation_spec.shape[1:]
        sizes = (
            multi_discrete_sizes(observation_spec)
            if isinstance(observation_spec, MultiCategorical)
            else [2] * shape.numel()
        )
        encoder = IntegerCells(torch.zeros(shape, dtype=torch.int64), torch.tensor(sizes).reshape(shape) - 1)
        num_states = encoder.num_cells
    elif isinstance(observation_spec, Categorical):
        if grid_size is not None:
            raise InputError(
                "--grid-size cuts Box observations into cells; drop it for Discrete observations."
            )
        encoder, num_states = nn.Identity(), observation_spec.space.n
    elif isinstance(observation_spec, (Bounded, Unbounded)) and observation_spec.dtype.is_floating_point:
        if isinstance(observation_spec, Unbounded):
            raise InputError(
                "The env's observation bounds are unbounded; tabular Q-learning needs a finite box to cut into "
                "grid cells. Use a function approximator (recipes.ppo)."
            )
        if grid_size is None:
            raise InputError(
                "Box observations need a grid for a Q-table: pass --grid-size N (bins per observation dimension)."
            )
        encoder = ObservationGrid(observation_spec.space.low[0], observation_spec.space.high[0], grid_size)
        num_states = encoder.num_cells
    elif isinstance(observation_spec, Bounded) and observation_spec.dtype != torch.bool:  # an integer Box
        low, high = observation_spec.space.low[0], observation_spec.space.high[0]
        if grid_size is None:
            encoder = IntegerCells(low, high)
        else:
            encoder = ObservationGrid(low.float(), high.float() + 1, grid_size)
        num_states = encoder.num_cells
    else:
        spaces = {"Binary": "MultiBinary", "MultiCategorical": "MultiDiscrete", "Composite": "Dict"}
        kind = (
            "a Box of booleans"
            if isinstance(observation_spec, Bounded) and observation_spec.dtype == torch.bool
            else f"a {spaces.get(type(observation_spec).__name__, type(observation_spec).__name__)} space"
        )
        raise InputError(
            f"Tabular Q-learning reads Discrete observations and Box observations of numbers, got {kind}; number "
            "the observations 0..n-1 with a Discrete(n) observation space (a gymnasium.ObservationWrapper)."
        )
    num_actions = action_spec.space.n
    if num_states * num_actions > MAX_TABLE_ENTRIES:
        raise InputError(
            f"A Q-table of {_count(num_states)} states x {num_actions} actions is too large to hold "
            f"(limit {MAX_TABLE_ENTRIES:,} entries); lower --grid-size, or train a network (recipes.dqn, "
            "recipes.ppo)."
        )
    q_actor = QValueActor(QTable(encoder, num_states, num_actions), spec=Categorical(num_actions))
    exploration = EGreedyModule(Categorical(num_actions), eps_init=float(epsilon), eps_end=float(epsilon))
    return TensorDictSequential(q_actor, exploration)


def q_value_actor(policy: TensorDictSequential) -> QValueActor:
    """The greedy ``QValueActor`` inside a policy from :func:`make_q_table`."""
    return policy[0]


def egreedy_module(policy: TensorDictSequential) -> EGreedyModule:
    """The ``EGreedyModule`` of a policy from :func:`make_q_table`; its ``eps`` buffer is the exploration rate."""
    return policy[1]
