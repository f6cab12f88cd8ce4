"""Pieces every optimizer of this package shares."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch


def closure_loss(closure: Callable[[], torch.Tensor] | None):
    """The loss of ``step(closure)``: the closure re-evaluated with gradients on (``step`` runs under no_grad)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class StepGate(Protocol):
    """What an optimizer asks of the hook that compressed its step (the hook's state, ``birder_repro.comm``):
    ``end_step()`` closes the step and says whether it is to be skipped (some rank's gradient was non-finite)."""

    def end_step(self) -> bool: ...


@runtime_checkable
class LocalSteps(Protocol):
    """The rule every local-step optimizer obeys (DiLoCo and its variants: the workers take steps of their own
    between synchronisations, so between two of them no process holds the model a user would deploy).

    ``synchronised()``: inside the context the model's parameters (and the buffers the method synchronises) hold
    the last synchronised outer model, theta_{t-1}, the same on every rank; the workers' own are restored on
    exit. Evaluate, and write a model for deployment, only inside it. Not collective.

    ``finish()``: end the run on a synchronisation: an outer step now if inner steps were taken since the last
    one, nothing otherwise. Collective: every rank calls it at the same point, after the last step and before
    the final evaluation and the final checkpoint.

    A training loop recognises one by ``hasattr(optimizer, "synchronised")`` (birder_repro.train.loop)."""

    def synchronised(self) -> contextlib.AbstractContextManager[None]: ...

    def finish(self) -> None: ...


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """``p.grad``, for a parameter the step has already found to have one."""
    if p.grad is None:
        raise RuntimeError("a parameter without a gradient reached the update")
    return p.grad


# ------------------------------------------------------------------------------- GradScaler's handover
# The optimizers of this package set ``_step_supports_amp_scaling``: torch.amp.GradScaler.step then calls their
# step() directly, with ``grad_scale`` (the scale still in the gradients; None once the script called
# ``scaler.unscale_``) and ``found_inf`` (its Inf / NaN verdict) set on the optimizer for that call, instead of
# unscaling the gradients itself and skipping the call on an Inf. So the step sees that a scaler drives it, and
# a hook that was not given that scaler (it compressed S g, not g) is refused in one line rather than training
# on gradients off by the scale.
class ScaledStepGate(StepGate, Protocol):
    @property
    def loss_scale(self) -> torch.Tensor | None: ...

    def end_step(self, found_inf: torch.Tensor | None = None) -> bool: ...


def amp_handover(
    optimizer, hook: ScaledStepGate | None, attach: str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(grad_scale, found_inf) as GradScaler.step left them on ``optimizer`` for this call; (None, None) when
    no scaler drives the step. Raises where ``hook`` compresses without knowing the scaler."""
    found_inf = getattr(optimizer, "found_inf", None)
    grad_scale = getattr(optimizer, "grad_scale", None)
    if found_inf is not None and hook is not None and hook.loss_scale is None:
        raise RuntimeError(
            f"a GradScaler steps this {type(optimizer).__name__}, but its hook compressed the scaled gradients "
            f"without knowing the scale: pass the scaler to the hook ({attach}(..., grad_scaler=scaler), or "
            "state.use_grad_scaler(scaler) before the first backward; the birder_repro.integrations do this "
            "for Accelerate, the Trainer and Lightning)"
        )
    return grad_scale, found_inf


def scaled_step_skips(optimizer, hook: ScaledStepGate | None, attach: str) -> bool:
    """The start of ``step()``: True where the step is to be skipped (some rank's bucket was non-finite, or a
    GradScaler found an Inf or NaN: the hook's state is then restored). Otherwise the gradients a GradScaler
    left scaled are unscaled here, with GradScaler's own arithmetic (times the float32 reciprocal)."""
    grad_scale, found_inf = amp_handover(optimizer, hook, attach)
    if hook is not None:
        skip = hook.end_step(found_inf)
    else:
        skip = found_inf is not None and bool(found_inf.item() > 0)
    optimizer.step_skipped = skip  # what a framework that wraps the step reads (Accelerate's step_was_skipped)
    if skip:
        return True
    if grad_scale is not None:
        inv = grad_scale.double().reciprocal().float().reshape(())
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, inv)
    return False


@contextlib.contextmanager
def synchronised_parameters(params: list[torch.Tensor], outer: list[torch.Tensor] | None) -> Iterator[None]:
    """Inside, ``params`` hold ``outer`` (the outer model; None: the parameters are it already); restored after."""
    if outer is None:
        yield
        return
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p, o in zip(params, outer):
            p.copy_(o)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def outer_state(outer, momentum, params) -> dict[str, Any]:
    """What a local-step optimizer keeps beside AdamW's state, for a checkpoint: theta_{t-1} and the outer
    momentum (None before the first step), and this worker's own parameters (between syncs the workers differ,
    and the model file holds rank 0's only). Shared by DiLoCo and Streaming DiLoCo."""
    return {
        "outer": [t.clone() for t in outer] if outer is not None else None,
        "momentum": [t.clone() for t in momentum] if momentum is not None else None,
        "local": [p.detach().clone() for p in params],
    }


def restore_outer_state(own: Mapping[str, Any], params: list[torch.Tensor]):
    """:func:`outer_state`'s inverse: the worker's own parameters copied back in place, and (theta_{t-1}, the
    outer momentum) returned on the parameters' devices."""

    def on_devices(saved):
        return None if saved is None else [t.to(p.device).clone() for t, p in zip(saved, params)]

    with torch.no_grad():
        for p, local in zip(params, own["local"]):
            p.copy_(local)
    return on_devices(own["outer"]), on_devices(own["momentum"])
