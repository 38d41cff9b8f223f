"""DDP steps of torch's DistributedDataParallel, recorded in the worker's progress page.

`import ddp_torch` installs this: every DistributedDataParallel model, on any
backend, then marks its steps in the page ddprun's agent reads (straggler
scores, the live view's step times). Without an agent (no page) nothing is
written. How a step is recognised:

- a step begins with a forward pass of the DDP model while it trains
  (model.training) with autograd on; a forward under torch.no_grad() or in
  eval mode is not a step;
- its backward pass starts when the first of the forward's outputs that
  require a gradient receives one; at the end of that backward pass (the
  autograd engine's final callbacks) its gradients are ready;
- a synchronized step ends after DDP's own end of backward (which waits for
  the gradients' all-reduce); a step under no_sync() ends with its backward.

A step's compute time runs from the previous step's end to its gradients being
ready, so the wait for slower ranks is not in it. A forward whose outputs never
get a gradient (a loss computed from none of them) records no step.
"""

import functools

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_flatten

from ddp_torch import _C

_recorder = _C.StepRecorder()


def _queue_callback(callback):
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class _Step:
    """One forward pass's step: its backward marks it once, whichever output is first."""

    def __init__(self, synchronized):
        self.synchronized = synchronized
        self.marked = False

    def backward_started(self, _grad):
        if self.marked:
            return None
        self.marked = True
        _queue_callback(self.backward_ended)
        return None

    def backward_ended(self):
        if not self.synchronized:
            _recorder.step_end(False)
            return
        _recorder.gradients_ready()
        # Queued now, it runs after DDP's own end of backward, queued during the pass.
        _queue_callback(lambda: _recorder.step_end(True))


def _watch(output, synchronized):
    step = _Step(synchronized)
    tensors, _ = tree_flatten(output)
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            tensor.register_hook(step.backward_started)


def install():
    """Wraps DistributedDataParallel.forward to mark steps (once per process)."""
    original = DistributedDataParallel.forward
    if getattr(original, "_ddp_torch_steps", False):
        return

    @functools.wraps(original)
    def forward(self, *inputs, **kwargs):
        output = original(self, *inputs, **kwargs)
        if self.training and torch.is_grad_enabled():
            _watch(output, self.require_backward_grad_sync)
        return output

    forward._ddp_torch_steps = True
    DistributedDataParallel.forward = forward
