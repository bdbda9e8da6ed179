"""Atari 2600 games of the Arcade Learning Environment (``ale-py``) with the standard DQN preprocessing.

:func:`make_atari_env` applies the preprocessing of Mnih et al. (2015), "Human-level control through deep
reinforcement learning", in the form Machado et al. (2018), "Revisiting the Arcade Learning Environment", recommend
for evaluation: ALE v5's sticky actions (repeat probability 0.25) stay on, and the full game is played.

- up to 30 no-op actions after each reset (random start states);
- 4 emulator frames per agent step, the observation being the pixel-wise maximum of the last two (Atari sprites
  flicker between frames);
- 84x84 grayscale frames, kept as ``uint8``, and the last 4 stacked: observations are ``uint8`` arrays of shape
  ``(4, 84, 84)``;
- in games that wait for FIRE to start play (Breakout), FIRE pressed as each life starts, as Stable-Baselines3's
  ``FireResetEnv`` does;
- for training only, the two tricks of Mnih et al. (2015): a lost life ends the episode (the game itself goes on at
  the next reset), and rewards are clipped to their sign.

Training returns are therefore per life and clipped; evaluation returns are the real game score. ALE ids
(``"ALE/Pong-v5"``) are registered with Gymnasium when first needed, so importing :mod:`envs` stays cheap; the older
ids (``"PongNoFrameskip-v4"``, ``"Pong-v0"``) are refused for their ``ALE/...-v5`` one (:func:`check_atari_id`).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TimeLimit

from errors import InputError

ATARI_PREFIX = "ALE/"
NOOP_MAX = 30  # Mnih et al. (2015), Extended Data Table 1: "no-op max"
FRAME_SKIP = 4  # Mnih et al. (2015): "action repeat"
SCREEN_SIZE = 84
FRAME_STACK = 4  # Mnih et al. (2015): "agent history length"
ATARI_FPS = 60  # the Atari 2600 draws 60 frames per second
ALE_ENTRY_POINT = "ale_py.env:AtariEnv"
# the ids ale-py registers besides ALE/<Game>-v5 (Pong-v0, PongNoFrameskip-v4), and those older versions of it did
# (BreakoutDeterministic-v4, Pong-ram-v4, Pong-ramNoFrameskip-v4)
LEGACY_ID = re.compile(r"(?P<game>[A-Za-z0-9]+?)(?P<ram>-ram)?(?P<frames>NoFrameskip|Deterministic)?-v[04]")
# keyword arguments of ALE's env that the toolkit sets itself, and why
SET_BY_TOOLKIT = {
    "frameskip": f"the preprocessing repeats each action {FRAME_SKIP} times",
    "obs_type": "the preprocessing reads the grayscale screen itself and gives 84x84 frames",
    "continuous": "the preprocessing and the agents play ALE's discrete actions",
    "render_mode": "the toolkit renders the evaluation envs itself (--video, recipes.evaluate --render)",
}


def is_atari(env_id: str) -> bool:
    """Return whether ``env_id`` names an Arcade Learning Environment game (``"ALE/..."``).

    Args:
        env_id: a Gymnasium id.

    Returns:
        True for ids in the ``ALE`` namespace, such as ``"ALE/Pong-v5"``, with or without a module to import
        first (``"ale_py:ALE/Pong-v5"``).

    Examples:
        >>> is_atari("ALE/Pong-v5"), is_atari("ale_py:ALE/Pong-v5"), is_atari("CartPole-v1")
        (True, True, False)
    """
    return isinstance(env_id, str) and env_id.rpartition(":")[2].startswith(ATARI_PREFIX)


def legacy_atari_id(env_id: str) -> str | None:
    """The ``"ALE/<Game>-v5"`` id replacing ``env_id`` where ``env_id`` is one of ALE's older ids, else None.

    An id counts where ale-py registers it (``"PongNoFrameskip-v4"``, ``"Pong-v0"``), or where it is not
    registered, names its frame skip or RAM observations (``"BreakoutDeterministic-v4"``, ``"Pong-ram-v4"``, ids
    of older ale-py versions) and ale-py has that game; ``"Taxi-v4"`` or ``"CartPole-v0"`` never do. ``ale_py`` is
    imported only for an id of that form not registered by another package, and never where it is missing.

    Examples:
        >>> legacy_atari_id("PongNoFrameskip-v4"), legacy_atari_id("CartPole-v0")
        ('ALE/Pong-v5', None)
    """
    match = LEGACY_ID.fullmatch(env_id) if isinstance(env_id, str) else None
    if match is None or importlib.util.find_spec("ale_py") is None:
        return None
    spec = gym.registry.get(env_id)
    if spec is not None and spec.entry_point != ALE_ENTRY_POINT:
        return None  # another package's env
    register_atari_envs()
    replacement = f"{ATARI_PREFIX}{match['game']}-v5"
    spec = gym.registry.get(env_id)
    if spec is not None:
        return replacement if spec.entry_point == ALE_ENTRY_POINT else None
    if not (match["ram"] or match["frames"]):
        return None  # Blackjack-v0 is not ALE/Blackjack-v5
    new_spec = gym.registry.get(replacement)
    return replacement if new_spec is not None and new_spec.entry_point == ALE_ENTRY_POINT else None


def check_atari_id(env_id: str) -> None:
    """Raise :class:`InputError` for one of ALE's older ids (:func:`legacy_atari_id`), naming its ``ALE/`` id."""
    replacement = legacy_atari_id(env_id)
    if replacement is not None:
        pixels = " Its observations are the screen's pixels: the toolkit does not train on the console's RAM."
        raise InputError(
            f"{env_id!r} is one of ALE's older ids, without this toolkit's preprocessing: use {replacement!r}, to "
            "which the toolkit applies the preprocessing of Machado et al. (2018) itself (frame skip, no-ops, "
            f"sticky actions).{pixels if '-ram' in env_id else ''}"
        )


def check_atari_kwargs(env_kwargs: dict[str, Any], option: str | None = None) -> None:
    """Raise :class:`InputError` for a keyword argument of ALE's env that the toolkit sets itself (``frameskip``,
    ``obs_type``, ``continuous``, ``render_mode``); ``option`` names where it was given (``"--env-kwargs"``)."""
    for key, reason in SET_BY_TOOLKIT.items():
        if key in env_kwargs:
            given = f"{option} {key}={env_kwargs[key]!r}: " if option else ""
            raise InputError(f"{given}{key} cannot be set for Atari envs: {reason}; drop it.")


def register_atari_envs() -> None:
    """Register the ``ALE/...`` ids with Gymnasium (importing ``ale_py`` does it; later calls cost nothing).

    Raises:
        InputError: ``ale-py`` is not installed.
    """
    try:
        import ale_py
    except ImportError:
        raise InputError(
            "Atari envs need the ale-py package, which is missing: pip install 'ale-py>=0.10' "
            "(it ships the game ROMs)."
        ) from None
    gym.register_envs(ale_py)


def lost_a_life(before: int, now: int) -> bool:
    """Whether the life count going from ``before`` to ``now`` is a lost life. Some games show 0 lives for a few
    frames before the game is over: only a drop to a positive count is one (as in Stable-Baselines3's
    EpisodicLifeEnv)."""
    return 0 < now < before


class EpisodicLife(gym.Wrapper):
    """Ends an episode when a life is lost, and resets the game only once it is really over.

    The episodic-life trick of Mnih et al. (2015): the value of a state just before a life is lost is not
    bootstrapped from the next life. After a lost life, :meth:`reset` goes on with the same game (one no-op step)
    instead of restarting it, so every life of the game is played. (Gymnasium's
    ``AtariPreprocessing(terminal_on_life_loss=True)`` restarts the whole game instead, so an agent would only ever
    play its first life.)

    Args:
        env: an ALE env, possibly wrapped (by ``AtariPreprocessing``: the no-op step then skips frames too).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if lost_a_life(self.lives, lives):
            terminated = True
        self.lives = lives
        return observation, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if self.game_over or seed is not None:
            observation, info = self.env.reset(seed=seed, options=options)
        else:
            observation, _, terminated, truncated, info = self.env.step(0)  # action 0 is NOOP in every game
            if terminated or truncated:
                observation, info = self.env.reset(options=options)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return observation, info


class FireAtLifeStart(gym.Wrapper):
    """Presses FIRE as each life starts, in games whose action set has it: at every reset and right after a lost
    life, within the step that lost it (its reward joins that step's).

    Breakout and many other games wait for FIRE to put the ball or the player in play; a deterministic policy that
    has not learnt to press it stands still until the game's frame limit (108,000 frames) and scores nothing.
    Stable-Baselines3's ``FireResetEnv`` and ALE's vector env (``use_fire_reset``) press it at reset; with
    :class:`EpisodicLife` outside this wrapper, training episodes (one life each) and evaluation games (every life)
    both get it at the start of each life.

    Args:
        env: an ALE env, possibly wrapped (by ``AtariPreprocessing``: the FIRE step then skips frames too); its
            action set must contain FIRE (:func:`needs_fire`).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.fire_action = env.unwrapped.get_action_meanings().index("FIRE")
        self.lives = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        self.env.reset(seed=seed, options=options)
        observation, _, terminated, truncated, info = self.env.step(self.fire_action)
        if terminated or truncated:  # the game ended on the very first press: start another
            observation, info = self.env.reset(options=options)
        self.lives = self.env.unwrapped.ale.lives()
        return observation, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if lost_a_life(self.lives, self.env.unwrapped.ale.lives()) and not (terminated or truncated):
            observation, fire_reward, terminated, truncated, info = self.env.step(self.fire_action)
            reward = float(reward) + float(fire_reward)
        self.lives = self.env.unwrapped.ale.lives()
        return observation, reward, terminated, truncated, info


def needs_fire(env: gym.Env) -> bool:
    """Whether an ALE env's action set has FIRE (the games that wait for it get :class:`FireAtLifeStart`)."""
    return "FIRE" in env.unwrapped.get_action_meanings()


class SignReward(gym.RewardWrapper):
    """Replaces each reward by its sign, -1.0, 0.0 or 1.0 (Mnih et al. 2015), keeping rewards Python floats.

    Args:
        env: the env whose rewards are clipped.
    """

    def reward(self, reward: SupportsFloat) -> float:
        return float(np.sign(reward))


class DirectAtariPreprocessing(AtariPreprocessing):
    """Gymnasium's ``AtariPreprocessing`` whose frame-skipping loop drives the emulator itself.

    Each skipped frame of the parent's loop is a ``step`` of the ALE env underneath, through Gymnasium's
    ``OrderEnforcing`` and ``PassiveEnvChecker``: an ``ale.act`` call, and a screen copy and an info dict the
    preprocessing never reads. Where the env underneath is exactly that (ALE's ``AtariEnv`` with discrete actions,
    one frame a step and no human rendering, under those two wrappers only, each past its first-step checks), this
    ``step`` makes the same ``ale.act`` calls and termination checks in the same order and returns what the parent
    returns (the info of the last frame included); any other env, and the first step, take the parent's loop. A
    quarter of an Atari env step on this project's 2-core CPU (0.36 to 0.27 ms).
    """

    def step(self, action):
        ale_env = self._direct_env()
        if ale_env is None:
            return super().step(action)
        ale = ale_env.ale
        action_index = ale_env._action_set[action]
        total_reward, terminated, truncated = 0.0, False, False
        for t in range(self.frame_skip):
            reward = 0.0  # AtariEnv.step's sum over its one frame
            reward += ale.act(action_index, 1.0)
            terminated, truncated = ale.game_over(with_truncation=False), ale.game_truncated()
            total_reward += reward
            self.game_over = terminated
            if self.terminal_on_life_loss:
                new_lives = ale.lives()
                terminated = terminated or new_lives < self.lives
                self.game_over = terminated
                self.lives = new_lives
            if terminated or truncated:
                break
            if t == self.frame_skip - 2:
                self._screen(self.obs_buffer[1])
            elif t == self.frame_skip - 1:
                self._screen(self.obs_buffer[0])
        return self._get_obs(), total_reward, terminated, truncated, ale_env._get_info()

    def _screen(self, buffer: np.ndarray) -> None:
        if self.grayscale_obs:
            self.ale.getScreenGrayscale(buffer)
        else:
            self.ale.getScreenRGB(buffer)

    def _direct_env(self):
        """The ALE env underneath when each frame's step would only pass through to it, else None."""
        from ale_py.env import AtariEnv
        from gymnasium.wrappers.common import OrderEnforcing, PassiveEnvChecker

        env = self.env
        while isinstance(env, (OrderEnforcing, PassiveEnvChecker)):
            if isinstance(env, OrderEnforcing) and not env.has_reset:
                return None
            if isinstance(env, PassiveEnvChecker) and not (env.checked_step and env.checked_data_reuse):
                return None
            env = env.env
        if type(env) is not AtariEnv or env.continuous or env._frameskip != 1 or env.render_mode == "human":
            return None
        return env


def make_atari_env(env_id: str, training: bool, render_mode: str | None = None, **env_kwargs: Any) -> gym.Env:
    """Build an ALE game with the standard preprocessing of Mnih et al. (2015) and Machado et al. (2018).

    The env is ``gymnasium.make(env_id, frameskip=1, obs_type="grayscale", ...)`` wrapped in Gymnasium's
    ``AtariPreprocessing`` (up to 30 no-op actions at reset, 4 frames per step max-pooled over the last two, 84x84
    grayscale ``uint8``) and
    ``FrameStackObservation(4)``; in games that wait for FIRE, FIRE is pressed as each life starts
    (:class:`FireAtLifeStart`). With ``training``, a lost life also ends the episode (:class:`EpisodicLife`) and
    rewards are clipped to their sign (:class:`SignReward`); without it, episodes are whole games with the game's
    score as return. ``max_episode_steps`` cuts each game at that many agent steps (a ``TimeLimit`` above the
    preprocessing, a truncation). Everything else is ALE v5's default, sticky actions (probability 0.25) included.

    Args:
        env_id: an ALE id such as ``"ALE/Pong-v5"``.
        training: apply the training-only tricks (episodic life, reward clipping).
        render_mode: ``None`` or ``"rgb_array"`` (frames of the full-colour screen, one per agent step).
        **env_kwargs: more keyword arguments for ``gymnasium.make`` (for example ``repeat_action_probability``
            or ``max_num_frames_per_episode``), and ``max_episode_steps`` in agent steps; not ``frameskip``,
            ``obs_type`` nor ``continuous``, which the preprocessing sets.

    Returns:
        A Gymnasium env with ``uint8`` observations of shape ``(4, 84, 84)``.

    Raises:
        InputError: ``env_id`` is not an ALE id (or is an older one, :func:`check_atari_id`), ``ale-py`` is
            missing, or ``frameskip``, ``obs_type`` or ``continuous`` is given (and ``render_mode`` in
            ``--env-kwargs``, refused by :func:`check_atari_kwargs` before this is called).

    Examples:
        >>> env = make_atari_env("ALE/Pong-v5", training=True)
        >>> observation, _ = env.reset(seed=0)
        >>> observation.shape, observation.dtype
        ((4, 84, 84), dtype('uint8'))
    """
    check_atari_id(env_id)
    if not is_atari(env_id):
        raise InputError(
            f"{env_id!r} is not an Atari id; Atari ids start with {ATARI_PREFIX!r} ('ALE/Pong-v5')."
        )
    check_atari_kwargs(env_kwargs)
    options = dict(env_kwargs)
    # in agent steps, above the preprocessing: gymnasium.make's TimeLimit would count the emulator's frames
    max_episode_steps = options.pop("max_episode_steps", None)
    register_atari_envs()
    # the preprocessing reads the screen itself; a grayscale frame is the cheapest one ALE makes at each of the
    # skipped frames (its full-colour screen is three times the bytes)
    env = gym.make(env_id, frameskip=1, obs_type="grayscale", render_mode=render_mode, **options)
    env = DirectAtariPreprocessing(
        env,
        noop_max=NOOP_MAX,
        frame_skip=FRAME_SKIP,
        screen_size=SCREEN_SIZE,
        terminal_on_life_loss=False,  # EpisodicLife below: this flag would restart the game at each lost life
        grayscale_obs=True,
        scale_obs=False,
    )
    if needs_fire(env):
        env = FireAtLifeStart(env)
    if max_episode_steps is not None:
        # below EpisodicLife: the limit cuts the game, whose next reset then starts a new one
        env = TimeLimit(env, max_episode_steps)
    if training:
        env = SignReward(EpisodicLife(env))
    env = FrameStackObservation(env, FRAME_STACK)
    env.metadata = {**env.metadata, "render_fps": ATARI_FPS // FRAME_SKIP}  # videos play in real time
    return env
