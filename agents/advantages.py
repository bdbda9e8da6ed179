"""TorchRL's GAE and TD(1) estimators with the critic run once over a batch instead of twice.

TorchRL's value estimators evaluate the critic on every observation and again on every next observation: twice
the batch, through ``torch.vmap`` (which also denies the Nature CNN its channels-last layout). In a collector's
batch, laid out ``[..., time]`` with auto-reset, the next observation of a step that did not end an episode *is*
the observation of the following step, so only the last step of each env's segment and the steps that ended an
episode (terminated or truncated) have a next observation the batch does not already hold. :class:`OneCallGAE` and
:class:`OneCallTD1` run the critic once, on the observations and those few next observations, and read every other
next value from the following step: the same values, the same advantages and targets as the parent classes' (up
to the last bits of float arithmetic), for about half the critic's work. On Atari with PPO's 8 x 128 batches this
is a third of the time between two collections.

With ``collected_values=True`` the batch's own value entries (``"state_value"``) are taken as the critic's values
of its observations, and the critic runs on the few next observations alone: for a collector that wrote them
with the current parameters (:class:`agents.fast_paths.LeanActor` given the critic, which then costs a value head
a step where the critic shares the actor's CNN trunk), so that the advantage step runs no trunk at all. A batch
without those entries takes the path above.

A recurrent critic (:mod:`agents.recurrent`) is covered in its sequential mode: each step's value comes from the
state stored with that step, and a step's next state is the following step's stored state unless the episode
ended, so the shortcut holds as it does for observations (TorchRL's own path would restart the state of the next
observation of every episode's first step). Anything else the shortcut does not cover takes the parent's path
unchanged: functional parameters or target parameters, a recurrent critic in recurrent mode, value chunking,
``shifted=True``, and inputs the ``"next"`` entry lacks.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.objectives.value import GAE, TD1Estimator

from agents.recurrent import recurrent_layers


class _OneCriticCall:
    """The value-network call of :class:`OneCallGAE` and :class:`OneCallTD1` (a mixin of a TorchRL estimator).

    ``collected_values`` (keyword, default False): the batch's value entries, where present, are the critic's
    current values of its observations (see the module)."""

    def __init__(self, *args, collected_values: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.collected_values = collected_values

    def _call_value_nets(
        self,
        data: TensorDictBase,
        params: TensorDictBase | None,
        next_params: TensorDictBase | None,
        single_call: bool,
        value_key: NestedKey,
        detach_next: bool,
        vmap_randomness: str = "error",
        *,
        value_net: TensorDictModuleBase | None = None,
    ):
        network = self.value_network if value_net is None else value_net
        in_keys = list(network.in_keys)
        next_data = data.get("next", default=None)
        covered = (
            params is None
            and next_params is None
            and not single_call
            and self.value_chunk_size is None
            and self.num_chunks is None
            and next_data is not None
            and not any(layer.recurrent_mode for layer in recurrent_layers(network))
            and all(next_data.get(key, default=None) is not None for key in in_keys)
        )
        if not covered:
            return super()._call_value_nets(
                data, params, next_params, single_call, value_key, detach_next, vmap_randomness,
                value_net=value_net,
            )  # fmt: skip
        # TorchRL's NaN placeholder check calls torch.isnan on each input, which a Dict observation (a TensorDict)
        # cannot take; the recipes' collectors never write NaN next observations (find_non_finite refuses them)
        data = self._sanitize_next_obs_nan(
            data, [key for key in in_keys if not isinstance(data.get(key, default=None), TensorDictBase)]
        )
        time_dim = data.names.index("time") if "time" in data.names else data.ndim - 1
        # the env's own done marks its resets, whatever done key the estimator reads (RND's intrinsic one)
        ended = torch.zeros(data.shape, dtype=torch.bool, device=data.device)
        for key in {("next", self.tensor_keys.done), ("next", "done")}:
            done = data.get(key, default=None)
            if done is not None:
                ended |= done.reshape(*data.shape, -1).any(-1)
        # the steps whose next observation is not the following step's observation
        fresh = ended.clone()
        fresh.select(time_dim, -1).fill_(True)
        next_inputs = data.get("next").select(*in_keys)[fresh]
        value = data.get(value_key, default=None) if self.collected_values else None
        if value is None:
            values = network(torch.cat([data.select(*in_keys).reshape(-1), next_inputs])).get(value_key)
            value = values[: data.numel()].reshape(*data.shape, *values.shape[1:])
            fresh_values = values[data.numel() :]
        else:  # the collector's values of the observations: only the next observations the batch lacks remain
            fresh_values = network(next_inputs).get(value_key)
        next_value = value.roll(-1, time_dim)
        next_value[fresh] = fresh_values
        data.set(value_key, value)
        data.set(("next", value_key), next_value)
        if detach_next:
            next_value = next_value.detach()
        return value, next_value, None


class OneCallGAE(_OneCriticCall, GAE):
    """TorchRL's :class:`~torchrl.objectives.value.GAE`, with the critic run once per batch (see the module).

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import ValueOperator
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     {"observation": torch.randn(2, 5, 3), "next": {"observation": torch.randn(2, 5, 3),
        ...      "reward": torch.ones(2, 5, 1), "done": torch.zeros(2, 5, 1, dtype=torch.bool),
        ...      "terminated": torch.zeros(2, 5, 1, dtype=torch.bool)}}, [2, 5])
        >>> OneCallGAE(gamma=0.99, lmbda=0.95, value_network=critic)(batch)["advantage"].shape
        torch.Size([2, 5, 1])
    """


class OneCallTD1(_OneCriticCall, TD1Estimator):
    """TorchRL's :class:`~torchrl.objectives.value.TD1Estimator`, with the critic run once per batch (see the
    module)."""
