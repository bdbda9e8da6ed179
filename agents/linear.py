"""Float32 linear layers on the CPU through oneDNN's matrix products where they beat torch's default (MKL).

Torch computes a float32 ``F.linear`` on the CPU with MKL's GEMM, whose AVX-512 kernels run on Intel CPUs only:
on AMD CPUs with AVX-512 (Zen 4 and 5) it takes AVX2 kernels. oneDNN, which torch also ships (its convolutions
run there already), picks its kernels by instruction set. On this project's 2-core AMD EPYC Zen 5 a 256x400 by
400x300 float32 product takes 0.70 ms through MKL and 0.36 ms through oneDNN on one thread (0.35 against 0.17 ms
on two), and the Nature CNN's 3136-to-512 layer at batch 256 4.9 against 1.9 ms on two; on a Zen 4, which runs
AVX-512 in 256-bit halves, oneDNN wins only on larger products (see :data:`ZEN4_MIN_MULTIPLY_ADDS`). oneDNN pays a
fixed 10-15 us a call, so the small products of 64-unit networks, of single observations and of DQN's batches of
64 stay with MKL. Both are IEEE float32 arithmetic; the results differ only in the order of the sums (as between
two MKL kernels).

:func:`linear` is ``F.linear`` that sends a float32 CPU product of at least :func:`onednn_min_multiply_adds`
multiply-adds to oneDNN (forward and both gradient products) while :func:`set_linear_kernels` says so, and
everything else (other dtypes and devices, small products, ``torch.compile``, ``torch.vmap``, tracing and ONNX
export, ``--matmul-precision`` other than ``highest``) to ``F.linear``. The gradient it defines is a first
derivative: a second one through it raises (``once_differentiable``). The networks of
:func:`agents.fast_paths.unrolled` and :func:`agents.actor_critic.direct_forward` (the lean policies, the
tensor losses of DQN, PPO, SAC, TD3 and DDPG, and the members of :class:`agents.actor_critic.StackedNetwork`,
which runs twin critics one by one where the largest layer's product goes to oneDNN) and the Nature CNN's linear
layer call it.

The default (``"auto"``) is oneDNN on AMD CPUs from Zen 5 on (AVX-512 at full width) from
:data:`MIN_MULTIPLY_ADDS`, and on Zen 4 from :data:`ZEN4_MIN_MULTIPLY_ADDS`, with torch built with oneDNN; torch's
kernels elsewhere. ``RunConfig.linear_kernels`` (``--linear-kernels torch|onednn|auto``) sets it per run;
``onednn`` takes oneDNN from :data:`MIN_MULTIPLY_ADDS` on any CPU.
"""

from __future__ import annotations

import functools
import math
import platform
from typing import Literal

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from errors import InputError

LinearKernels = Literal["auto", "torch", "onednn"]

MIN_MULTIPLY_ADDS = 1 << 23
"""Products of fewer multiply-adds (rows x inputs x outputs, about 8.4 million) stay with ``F.linear``. Timed
alone, oneDNN already wins at about two million (on the 2-core AMD EPYC a 64x256 by 256x256 product took 55 against
88 us, a 256x64 by 64x64 one 27 against 24 us, one thread), but in whole runs DQN's 256x256 network at RL Zoo's
batch of 64 (4.2 million) ran slower through oneDNN (CartPole-v1, 50k frames: 29.1 and 31.0 s against 22.2 and
24.8 s), while the off-policy recipes' 256-unit layers at batch 256 (16.8 million) and the Nature CNN's linear
layer ran faster."""

ZEN4_MIN_MULTIPLY_ADDS = 1 << 25
"""Where ``"auto"`` takes oneDNN on a Zen 4 (about 33.5 million multiply-adds). There oneDNN's AVX-512 kernels,
run in 256-bit halves, gain on large products and lose on 256-unit layers (on the 2-core EPYC, two threads,
forward and both gradients): 1.30x MKL's speed on the Nature CNN's 3136-to-512 layer at batch 256 (411 million),
1.12x at DQN's batch of 32 (51 million), 1.17-1.24x on 1024x1024 layers at batch 64-256, 1.05x on 512x512 at 256
(67 million), even (1.01x) on RL Zoo's 400x300 at 256 (31 million) and 0.75x on 256x256 at 256 (17 million), where
the twin critics' batched product also stays."""

ZEN5_FAMILY = 26
"""AMD's CPU family number of Zen 5 (0x1A)."""
ZEN4_FAMILY = 25
"""AMD's CPU family number of Zen 3 and Zen 4 (0x19); of the two, only Zen 4 has AVX-512."""


_onednn_from: float = math.inf
"""The fewest multiply-adds of a product that :func:`linear` sends to oneDNN; infinite: none."""


def onednn_available() -> bool:
    """Whether this torch has oneDNN's linear product (``torch.ops.mkldnn._linear_pointwise``)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def onednn_by_default() -> float:
    """What ``"auto"`` chooses, as the fewest multiply-adds a product needs to go to oneDNN: on an AMD x86 CPU
    with AVX-512 where this torch has oneDNN, :data:`MIN_MULTIPLY_ADDS` from family 26 (Zen 5) on and
    :data:`ZEN4_MIN_MULTIPLY_ADDS` on family 25 (Zen 4); elsewhere infinite (torch's kernels throughout).

    MKL's AVX-512 kernels are Intel's alone, so on AMD CPUs torch's products take MKL's AVX2 ones. Zen 5's
    512-bit units run oneDNN's AVX-512 kernels at twice that speed. Zen 4 runs each AVX-512 instruction as two
    256-bit halves: there oneDNN's products lose to MKL's on 256-unit layers, and the twin critics, which oneDNN's
    path runs one by one instead of as one batched product, made a whole TD3 or SAC gradient step 20-40% slower
    (256-unit networks, batch 256, two threads), while the Nature CNN's linear layer and wider layers gain."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not onednn_available():
        return math.inf
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return math.inf
    vendor, family = _cpu_identity()
    if vendor != "AuthenticAMD" or family < ZEN4_FAMILY:
        return math.inf
    return MIN_MULTIPLY_ADDS if family >= ZEN5_FAMILY else ZEN4_MIN_MULTIPLY_ADDS


def _cpu_identity() -> tuple[str, int]:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``) and family number, from the first processor
    in /proc/cpuinfo; ``("", -1)`` for what cannot be read."""
    vendor, family = "", -1
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == "vendor_id":
                    vendor = value.strip()
                elif name.strip() == "cpu family" and value.strip().isdigit():
                    family = int(value)
                if not line.strip() or (vendor and family >= 0):  # the first processor's entries end
                    break
    except OSError:
        pass
    return vendor, family


def set_linear_kernels(kernels: LinearKernels) -> bool:
    """Route :func:`linear`'s float32 CPU products of at least :data:`MIN_MULTIPLY_ADDS` to oneDNN
    (``"onednn"``), all to ``F.linear`` (``"torch"``), or as :func:`onednn_by_default` says (``"auto"``), for
    this process. Returns whether oneDNN is now used; ``"onednn"`` on a torch without it is an
    :class:`InputError`."""
    global _onednn_from
    if kernels == "auto":
        _onednn_from = onednn_by_default()
    elif kernels == "onednn":
        if not onednn_available():
            raise InputError(
                "--linear-kernels onednn needs a torch built with oneDNN (torch.backends.mkldnn), which this one "
                "is not; use --linear-kernels torch or auto."
            )
        _onednn_from = MIN_MULTIPLY_ADDS
    elif kernels == "torch":
        _onednn_from = math.inf
    else:
        raise InputError(f"linear kernels {kernels!r}: use 'auto', 'torch' or 'onednn'.")
    return uses_onednn()


def uses_onednn() -> bool:
    """Whether :func:`linear` sends large float32 CPU products to oneDNN in this process."""
    return _onednn_from < math.inf


def onednn_min_multiply_adds() -> float:
    """The fewest multiply-adds (rows x inputs x outputs) of a float32 CPU product that :func:`linear` sends to
    oneDNN in this process; infinite while it sends none."""
    return _onednn_from


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN where :func:`set_linear_kernels` chose it and the product is
    a float32 CPU one of at least :func:`onednn_min_multiply_adds` multiply-adds (see the module docstring)."""
    # the size first: most calls (small layers, single observations) leave here for F.linear
    if (
        _onednn_from == math.inf
        or weight.dim() != 2
        or x.dim() == 0
        or x.numel() * weight.shape[0] < _onednn_from
        or not _onednn_applies(x, weight, bias)
    ):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        output = _OneDNNLinear.apply(rows, weight, bias)
    else:
        output = _product(rows, weight, bias)
    return output.reshape(*x.shape[:-1], weight.shape[0])


def _onednn_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether a product large enough for oneDNN (2-D ``weight``, checked by :func:`linear`) may go there."""
    if (
        x.dtype is not torch.float32
        or weight.dtype is not torch.float32
        or x.device.type != "cpu"
        or weight.device.type != "cpu"
        or x.shape[-1] != weight.shape[1]  # F.linear says what is wrong
    ):
        return False
    if bias is not None and (
        bias.dtype is not torch.float32 or bias.device.type != "cpu" or bias.shape != weight.shape[:1]
    ):
        return False
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return False  # ONNX export and torch.compile see F.linear
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    if wrapped(x) or wrapped(weight) or (bias is not None and wrapped(bias)):
        return False  # torch.vmap and torch.func transforms: oneDNN's op has no batching rule
    return not (
        torch.get_float32_matmul_precision() != "highest"
        or torch._C._is_any_autocast_enabled()
        or x.is_sparse
        or weight.is_sparse
        or torch.onnx.is_in_onnx_export()
    )


def _product(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``rows @ weight.T (+ bias)`` for 2-D ``rows`` and ``weight``, through oneDNN (strided operands are read
    as they are)."""
    return torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """``rows @ weight.T + bias`` with its gradients (``grad @ weight`` and ``grad.T @ rows``) through oneDNN.

    ``forward`` takes the context itself: with a separate ``setup_context``, every ``apply`` binds its arguments
    to ``forward``'s signature through ``inspect`` (about 20 us a call)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(rows, weight)
        ctx.has_bias = bias is not None
        return _product(rows, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        rows, weight = ctx.saved_tensors
        grad_rows = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_rows = _product(grad, weight.t(), None)
        if ctx.needs_input_grad[1]:
            grad_weight = _product(grad.t(), rows.t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_rows, grad_weight, grad_bias


set_linear_kernels("auto")
