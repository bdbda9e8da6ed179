"""Batched torch implementations of Gymnasium's classic-control tasks, as native TorchRL envs.

Each env steps a whole batch of sub-envs with tensor operations on any device, resets finished sub-envs in
place (masked, in the same call as the step), and reproduces Gymnasium's reference implementation: dynamics,
rewards, termination, time-limit truncation, initial-state distribution and spaces. The same tasks are
registered with Gymnasium under the ``rlkit/`` namespace, so ``gymnasium.make("rlkit/CartPole-v1")`` gives a
single env and ``gymnasium.make_vec("rlkit/CartPole-v1", num_envs=N)`` a batched one.

    >>> env = CartPoleEnv(num_envs=4096, device="cpu", seed=0)
    >>> data = env.rollout(100, break_when_any_done=False)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from envs.specs import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY, set_specs, unchecked_tensordict
from errors import InputError

NAMESPACE = "rlkit"


@functools.cache
def reference_spaces(gymnasium_id: str) -> tuple[gym.Space, gym.Space]:
    """The single-env observation and action spaces of Gymnasium's own implementation."""
    env = gym.make(gymnasium_id)
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


@dataclasses.dataclass
class _Batch:
    state: torch.Tensor
    episode_return: torch.Tensor
    episode_length: torch.Tensor  # also the step count that the time limit reads


class ClassicControlEnv(EnvBase):
    """Base class: a batch of sub-envs whose state is one ``(num_envs, state_dim)`` tensor.

    Subclasses define the Gymnasium spaces, the initial-state distribution, the dynamics (new state, reward
    and termination from state and action) and the observation of a state. The base class counts steps for
    the time limit, tracks episode returns and lengths, and resets finished sub-envs.

    Keys are those of :class:`envs.GymnasiumVectorEnv`, so recipes use either backend unchanged.

    Args:
        num_envs: number of sub-envs.
        device: where the state lives and the physics runs.
        dtype: dtype of the internal state (observations are float32 like Gymnasium's); ``torch.float64``
            reproduces Gymnasium's float64 arithmetic.
        seed: seed of the env's random generator (initial states); None draws one from torch's global RNG.
        max_episode_steps: time limit; Gymnasium's registered limit by default.
    """

    gymnasium_id: ClassVar[str]
    max_episode_steps_default: ClassVar[int]
    state_dim: ClassVar[int]

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ):
        if num_envs < 1:
            raise InputError(f"num_envs must be at least 1, got {num_envs}.")
        super().__init__(device=device, batch_size=torch.Size([num_envs]))
        self.dtype = dtype
        if max_episode_steps is not None and max_episode_steps < 1:
            raise InputError(f"max_episode_steps must be at least 1, got {max_episode_steps}.")
        self.max_episode_steps = max_episode_steps or self.max_episode_steps_default
        self.single_observation_space, self.single_action_space = reference_spaces(self.gymnasium_id)
        set_specs(self, self.single_observation_space, self.single_action_space)
        self._bounds: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(torch.randint(2**62, ())) if seed is None else seed)
        # Per-step state lives in a plain object: nn.Module attribute assignment is slow in the hot loop.
        self.batch = _Batch(
            state=self.initial_states(num_envs),
            episode_return=torch.zeros(num_envs, 1, device=self.device),
            episode_length=torch.zeros(num_envs, 1, dtype=torch.int64, device=self.device),
        )
        self._not_done = torch.zeros(num_envs, 1, dtype=torch.bool, device=self.device)

    @property
    def state(self) -> torch.Tensor:
        """The ``(num_envs, state_dim)`` physical state of every sub-env."""
        return self.batch.state

    @state.setter
    def state(self, value: torch.Tensor) -> None:
        self.batch.state = value.to(self.device, self.dtype)

    @property
    def steps(self) -> torch.Tensor:
        """Steps taken in each sub-env's current episode (what the time limit counts), shape ``(num_envs,)``."""
        return self.batch.episode_length.view(-1)

    @steps.setter
    def steps(self, value: torch.Tensor) -> None:
        self.batch.episode_length = value.to(self.device, torch.int64).reshape(-1, 1)

    # --------------------------------------------------------------- to define
    def initial_states(self, n: int) -> torch.Tensor:
        """``n`` states drawn from the task's initial-state distribution."""
        raise NotImplementedError

    def dynamics(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """New state, reward ``(n,)`` and terminated ``(n,)`` after ``action`` in ``state``."""
        raise NotImplementedError

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """Float32 observations of ``state``."""
        raise NotImplementedError

    def _uniform(self, n: int, low: float | list[float], high: float | list[float]) -> torch.Tensor:
        key = (tuple(low) if isinstance(low, list) else low, tuple(high) if isinstance(high, list) else high)
        bounds = self._bounds.get(key)
        if bounds is None:
            low_t = torch.as_tensor(low, dtype=self.dtype, device=self.device)
            bounds = self._bounds[key] = (
                low_t,
                torch.as_tensor(high, dtype=self.dtype, device=self.device) - low_t,
            )
        low_t, width = bounds
        shape = (n, *low_t.shape)
        return (
            torch.rand(shape, generator=self.generator, dtype=self.dtype, device=self.device)
            .mul_(width)
            .add_(low_t)
        )

    # ----------------------------------------------------------------- TorchRL
    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self.generator.manual_seed(seed)
            self.batch.state = self.initial_states(self.batch_size[0])

    def _root(self) -> TensorDictBase:
        batch = self.batch
        return unchecked_tensordict(
            {
                "observation": self.observe(batch.state),
                EPISODE_RETURN_KEY: batch.episode_return,
                EPISODE_LENGTH_KEY: batch.episode_length,
                "done": self._not_done,
                "terminated": self._not_done,
                "truncated": self._not_done,
            },
            self.batch_size,
            self.device,
        )

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        reset = None if tensordict is None else tensordict.get("_reset", None)
        if reset is None:
            batch = self.batch
            batch.state = self.initial_states(self.batch_size[0])
            batch.episode_return = torch.zeros_like(batch.episode_return)
            batch.episode_length = torch.zeros_like(batch.episode_length)
        else:
            self._reset_where(reset.reshape(*self.batch_size, 1))
        return self._root()

    def _reset_where(self, mask: torch.Tensor) -> None:
        """Reset the sub-envs where ``mask`` (shape ``(num_envs, 1)``) is set.

        On the CPU only the finished rows are redrawn. On an accelerator a fresh state is drawn for every
        sub-env and selected with ``torch.where``, which avoids a host synchronisation per step.
        """
        batch = self.batch
        if self.device.type == "cpu":
            rows = mask.view(-1).nonzero().view(-1)
            if rows.numel() == 0:
                return
            batch.state = batch.state.index_put((rows,), self.initial_states(rows.numel()))
        else:
            batch.state = torch.where(mask, self.initial_states(self.batch_size[0]), batch.state)
        batch.episode_return = batch.episode_return.masked_fill(mask, 0.0)
        batch.episode_length = batch.episode_length.masked_fill(mask, 0)

    def _advance(self, action: torch.Tensor) -> tuple[TensorDictBase, torch.Tensor]:
        """One step of every sub-env, without resetting; returns the ``"next"`` data and ``done`` ``(n, 1)``."""
        batch = self.batch
        batch.state, reward, terminated = self.dynamics(batch.state, action)
        batch.episode_length = batch.episode_length + 1
        truncated = batch.episode_length >= self.max_episode_steps
        terminated = terminated.unsqueeze(-1)
        done = terminated | truncated
        reward = reward.to(torch.float32).unsqueeze(-1)
        batch.episode_return = batch.episode_return + reward
        next_td = unchecked_tensordict(
            {
                "observation": self.observe(batch.state),
                "reward": reward,
                EPISODE_RETURN_KEY: batch.episode_return,
                EPISODE_LENGTH_KEY: batch.episode_length,
                "done": done,
                "terminated": terminated,
                "truncated": truncated,
            },
            self.batch_size,
            self.device,
        )
        return next_td, done

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._advance(tensordict.get("action"))[0]

    def _step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Step every sub-env, then reset the finished ones in place (no partial-reset round trip)."""
        next_td, done = self._advance(tensordict.get("action"))
        tensordict.set("next", next_td)
        self._reset_where(done)
        return tensordict, self._root()


def _angle_normalize(x: torch.Tensor) -> torch.Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


class CartPoleEnv(ClassicControlEnv):
    """CartPole-v1 (Barto, Sutton and Anderson, 1983) as in Gymnasium: Euler integration, reward 1 per step
    (the terminating step included), termination beyond 2.4 m or 12 degrees, 500-step limit."""

    gymnasium_id = "CartPole-v1"
    max_episode_steps_default = 500
    state_dim = 4
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def initial_states(self, n):
        return self._uniform(n, [-0.05] * 4, [0.05] * 4)

    def dynamics(self, state, action):
        # Gymnasium's equations, written with fused operations (addcmul) to keep the op count low
        x, x_dot, theta, theta_dot = state.unbind(-1)
        total_mass = self.masspole + self.masscart
        polemass_length = self.masspole * self.length
        force = (action.reshape(x.shape) * (2 * self.force_mag) - self.force_mag).to(state.dtype)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = torch.addcmul(force, theta_dot * theta_dot, sintheta, value=polemass_length).div_(total_mass)
        numerator = torch.addcmul(sintheta * self.gravity, costheta, temp, value=-1.0)
        denominator = (
            (costheta * costheta)
            .mul_(-self.masspole * self.length / total_mass)
            .add_(self.length * 4.0 / 3.0)
        )
        thetaacc = numerator.div_(denominator)
        xacc = torch.addcmul(temp, thetaacc, costheta, value=-polemass_length / total_mass)
        state = torch.add(
            state, torch.stack((x_dot, xacc, theta_dot, thetaacc), dim=-1), alpha=self.tau
        )  # Euler
        terminated = (state[:, 0].abs() > self.x_threshold) | (
            state[:, 2].abs() > self.theta_threshold_radians
        )
        return state, torch.ones_like(x), terminated

    def observe(self, state):
        return state.to(torch.float32)


class PendulumEnv(ClassicControlEnv):
    """Pendulum-v1 as in Gymnasium: torque clipped to [-2, 2], cost theta^2 + 0.1 thetadot^2 + 0.001 u^2,
    never terminates, 200-step limit."""

    gymnasium_id = "Pendulum-v1"
    max_episode_steps_default = 200
    state_dim = 2
    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def initial_states(self, n):
        return self._uniform(n, [-math.pi, -1.0], [math.pi, 1.0])

    def dynamics(self, state, action):
        th, thdot = state.unbind(-1)
        u = action.reshape(th.shape).to(state.dtype).clamp(-self.max_torque, self.max_torque)
        costs = _angle_normalize(th).square() + 0.1 * thdot.square() + 0.001 * u.square()
        newthdot = (
            thdot + (3 * self.g / (2 * self.l) * torch.sin(th) + 3.0 / (self.m * self.l**2) * u) * self.dt
        )
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * self.dt
        return torch.stack((newth, newthdot), dim=-1), -costs, torch.zeros_like(th, dtype=torch.bool)

    def observe(self, state):
        th, thdot = state.unbind(-1)
        return torch.stack((torch.cos(th), torch.sin(th), thdot), dim=-1).to(torch.float32)


class MountainCarEnv(ClassicControlEnv):
    """MountainCar-v0 (Moore, 1990) as in Gymnasium: reward -1 per step, goal at 0.5, 200-step limit."""

    gymnasium_id = "MountainCar-v0"
    max_episode_steps_default = 200
    state_dim = 2
    min_position, max_position, max_speed, goal_position, goal_velocity = -1.2, 0.6, 0.07, 0.5, 0.0
    force, gravity = 0.001, 0.0025

    def initial_states(self, n):
        position = self._uniform(n, -0.6, -0.4)
        return torch.stack((position, torch.zeros_like(position)), dim=-1)

    def _move(self, position, velocity):
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        velocity = torch.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        return torch.stack((position, velocity), dim=-1), terminated

    def dynamics(self, state, action):
        position, velocity = state.unbind(-1)
        push = (action.reshape(position.shape) - 1).to(state.dtype)
        velocity = velocity + push * self.force + torch.cos(3 * position) * (-self.gravity)
        state, terminated = self._move(position, velocity)
        return state, -torch.ones_like(position), terminated

    def observe(self, state):
        return state.to(torch.float32)


class MountainCarContinuousEnv(MountainCarEnv):
    """MountainCarContinuous-v0 as in Gymnasium: reward 100 at the goal (0.45) minus 0.1 a^2, 999-step limit."""

    gymnasium_id = "MountainCarContinuous-v0"
    max_episode_steps_default = 999
    goal_position, power = 0.45, 0.0015

    def dynamics(self, state, action):
        position, velocity = state.unbind(-1)
        action = action.reshape(position.shape).to(state.dtype)
        velocity = velocity + action.clamp(-1.0, 1.0) * self.power - 0.0025 * torch.cos(3 * position)
        state, terminated = self._move(position, velocity)
        reward = torch.where(terminated, 100.0, 0.0).to(state.dtype) - action.square() * 0.1
        return state.to(torch.float32).to(state.dtype), reward, terminated  # Gymnasium stores it as float32


class AcrobotEnv(ClassicControlEnv):
    """Acrobot-v1 (Sutton, 1996; the book's dynamics) as in Gymnasium: RK4 integration over 0.2 s, reward -1
    until the tip swings above the bar, 500-step limit."""

    gymnasium_id = "Acrobot-v1"
    max_episode_steps_default = 500
    state_dim = 4
    dt = 0.2
    link_length_1, link_mass_1, link_mass_2, link_com_pos_1, link_com_pos_2, link_moi = (
        1.0,
        1.0,
        1.0,
        0.5,
        0.5,
        1.0,
    )
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi

    def initial_states(self, n):
        # Gymnasium draws float64 and stores float32
        return self._uniform(n, [-0.1] * 4, [0.1] * 4).to(torch.float32).to(self.dtype)

    def _dsdt(self, s: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        m1, m2, l1 = self.link_mass_1, self.link_mass_2, self.link_length_1
        lc1, lc2, i1, i2, g = self.link_com_pos_1, self.link_com_pos_2, self.link_moi, self.link_moi, 9.8
        theta1, theta2, dtheta1, dtheta2 = s.unbind(-1)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + i2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * torch.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2)
            + phi2
        )
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * torch.sin(theta2) - phi2) / (
            m2 * lc2**2 + i2 - d2**2 / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), dim=-1)

    def dynamics(self, state, action):
        torque = (action.reshape(state.shape[:1]) - 1).to(state.dtype)
        dt, dt2 = self.dt, self.dt / 2.0
        k1 = self._dsdt(state, torque)
        k2 = self._dsdt(state + dt2 * k1, torque)
        k3 = self._dsdt(state + dt2 * k2, torque)
        k4 = self._dsdt(state + dt * k3, torque)
        new = state + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        theta1, theta2, dtheta1, dtheta2 = new.unbind(-1)
        state = torch.stack(
            (
                _wrap(theta1),
                _wrap(theta2),
                dtheta1.clamp(-self.max_vel_1, self.max_vel_1),
                dtheta2.clamp(-self.max_vel_2, self.max_vel_2),
            ),
            dim=-1,
        )
        terminated = -torch.cos(state[:, 0]) - torch.cos(state[:, 1] + state[:, 0]) > 1.0
        return state, torch.where(terminated, 0.0, -1.0).to(state.dtype), terminated

    def observe(self, state):
        theta1, theta2, dtheta1, dtheta2 = state.unbind(-1)
        return torch.stack(
            (torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2),
            dim=-1,
        ).to(torch.float32)


def _wrap(x: torch.Tensor) -> torch.Tensor:
    """Gymnasium's ``wrap(x, -pi, pi)``: shift by 2 pi until inside (kept as is on the bounds)."""
    wrapped = torch.remainder(x + math.pi, 2 * math.pi) - math.pi
    return torch.where((x >= -math.pi) & (x <= math.pi), x, wrapped)


TORCH_ENVS: dict[str, type[ClassicControlEnv]] = {
    cls.gymnasium_id: cls
    for cls in (CartPoleEnv, PendulumEnv, MountainCarEnv, MountainCarContinuousEnv, AcrobotEnv)
}


def torch_env_class(env_id: str) -> type[ClassicControlEnv]:
    """The torch env reproducing ``env_id`` (``"CartPole-v1"`` or ``"rlkit/CartPole-v1"``)."""
    name = env_id.removeprefix(f"{NAMESPACE}/")
    if name not in TORCH_ENVS:
        raise InputError(
            f"No torch implementation of {env_id!r}: the torch backend has {sorted(TORCH_ENVS)}. "
            "Use the gymnasium backend for other envs."
        )
    return TORCH_ENVS[name]
