"""summary(model, input_shape): each layer's output shape, parameters and activation bytes.

What ``torchsummary`` prints, written here (no extra dependency), and with two things it lacks:

- it says which outputs take no new memory: an in-place layer (``ReLU(inplace=True)``) or a view
  (``Flatten`` of a contiguous tensor) shares its input's storage, so it is marked and left out of
  the activation total;
- a shape mismatch does not end in a bare ``mat1 and mat2 shapes cannot be multiplied``: the
  :class:`ShapeMismatchError` names the layer that failed, the shape it was given and the table
  of every layer before it, where the wrong shape comes from.

The forward pass runs once, under ``torch.no_grad()`` and in eval mode (the training flags are
put back), on zeros of ``input_shape`` on the model's device. Activation bytes are the bytes of
each layer's output for that batch: in training about that much is kept for backward.

    print(summary(resnet(18), (1, 3, 224, 224)))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from gpulab.devices.batches import tree_tensors
from gpulab.devices.meter_report import format_bytes

__all__ = ["summary", "ModelSummary", "LayerRow", "ShapeMismatchError"]

Shape = tuple[int, ...]


@dataclass
class LayerRow:
    """One call of one layer."""

    name: str  # qualified name in the model, e.g. "stages.1.0.conv1"
    kind: str  # the class, e.g. "Conv2d"
    input_shape: Shape | list[Shape]
    output_shape: Shape | list[Shape]
    params: int  # its own parameters (counted on its first call only)
    activation_bytes: int  # bytes of its output tensors
    shares_input: bool  # an in-place or view output: no new memory


@dataclass
class ModelSummary:
    """What :func:`summary` returns: print it for the table."""

    input_shape: Shape | list[Shape]
    rows: list[LayerRow] = field(default_factory=list)
    total_params: int = 0
    trainable_params: int = 0
    param_bytes: int = 0
    unused: list[str] = field(default_factory=list)  # modules with parameters that were never called

    @property
    def activation_bytes(self) -> int:
        """Bytes of every layer output that takes new memory (in-place and view outputs excluded)."""
        return sum(r.activation_bytes for r in self.rows if not r.shares_input)

    def table(self) -> str:
        """The table, then the totals."""
        names = [f"{r.name} ({r.kind})" for r in self.rows]
        w = max([len("layer (type)")] + [len(n) for n in names])
        shapes = [_fmt(r.output_shape) for r in self.rows]
        ws = max([len("output shape")] + [len(s) for s in shapes])
        out = [f"{'layer (type)':<{w}}  {'output shape':<{ws}}  {'params':>12}  {'activations':>12}"]
        for name, shape, r in zip(names, shapes, self.rows):
            mark = " *" if r.shares_input else ""
            out.append(f"{name:<{w}}  {shape:<{ws}}  {r.params:>12,}  {format_bytes(r.activation_bytes):>12}{mark}")
        out.append(f"total params: {self.total_params:,} (trainable {self.trainable_params:,}), "
                   f"{format_bytes(self.param_bytes)}")
        out.append(f"activations for input {_fmt(self.input_shape)}: {format_bytes(self.activation_bytes)} "
                   "(* in-place or view: shares its input's memory, not counted)")
        if self.unused:
            out.append(f"modules with parameters never called: {', '.join(self.unused)}")
        return "\n".join(out)

    __str__ = table

    def __repr__(self) -> str:
        return self.table()


class ShapeMismatchError(RuntimeError):
    """A layer failed during :func:`summary`; ``.layer`` is its name, ``.summary`` the layers before it."""

    def __init__(self, message: str, layer: str, input_shape: Any, partial: ModelSummary) -> None:
        super().__init__(message)
        self.layer, self.input_shape, self.summary = layer, input_shape, partial


def _fmt(shape: Any) -> str:
    if isinstance(shape, list):
        return "[" + ", ".join(_fmt(s) for s in shape) + "]"
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _shapes(obj: Any) -> Shape | list[Shape]:
    ts = tree_tensors(obj)
    return tuple(ts[0].shape) if len(ts) == 1 else [tuple(t.shape) for t in ts]


def _storages(ts: list[torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in ts if t.layout == torch.strided}


def summary(model: nn.Module, input_shape: Sequence[int] | Sequence[Sequence[int]], *,
            dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> ModelSummary:
    """Run ``model`` once on zeros and describe every layer.

    Args:
        model: the model. Rows are its leaf modules (and any module holding parameters of its
            own), in call order; a module called twice gets two rows.
        input_shape: the input's full shape, batch included, e.g. ``(1, 3, 224, 224)``; or a list
            of shapes for a model taking several inputs.
        dtype: of the inputs (``torch.long`` for token ids: zeros are valid indices).
        device: where to run (default: the device of the model's first parameter, else the CPU).

    Returns:
        A :class:`ModelSummary`.

    Raises:
        ShapeMismatchError: if a layer fails; it names the layer and the shape it received.
        TypeError, ValueError: for a model that is not a module, or a shape that is not ints.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"summary() describes an nn.Module, got {type(model).__name__}")
    shapes = [tuple(input_shape)] if all(isinstance(d, int) for d in input_shape) else [tuple(s) for s in input_shape]
    if not shapes or any(not s or not all(isinstance(d, int) and d > 0 for d in s) for s in shapes):
        raise ValueError(f"input_shape must be the full input shape with the batch, e.g. (1, 3, 32, 32), "
                         f"or a list of such shapes; got {input_shape!r}")
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    inputs = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
    names = {m: n for n, m in model.named_modules()}
    listed = {m for m in names if m is not model and (not list(m.children()) or list(m.parameters(recurse=False)))}
    result = ModelSummary(shapes[0] if len(shapes) == 1 else shapes)
    stack: list[tuple[nn.Module, Any]] = []  # modules entered and not yet returned: the failing one is last
    seen_params: set[int] = set()
    called: set[nn.Module] = set()

    def pre(module: nn.Module, args: Any) -> None:
        stack.append((module, _shapes(args)))

    def post(module: nn.Module, args: Any, output: Any) -> None:
        stack.pop()
        called.add(module)
        if module not in listed:
            return
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen_params]
        seen_params.update(id(p) for p in own)
        outs = tree_tensors(output)
        shares = bool(outs) and _storages(outs) <= _storages(tree_tensors(args))
        result.rows.append(LayerRow(names[module], type(module).__name__, _shapes(args), _shapes(output),
                                    sum(p.numel() for p in own), sum(t.numel() * t.element_size() for t in outs),
                                    shares))

    handles = []
    for m in names:
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(*inputs)
    except Exception as err:  # re-raised with the layer named
        module, got = stack[-1] if stack else (model, _shapes(inputs))
        name = names.get(module) or "the model itself"
        _totals(model, result, called, finished=False)
        raise ShapeMismatchError(
            f"layer '{name}' ({module!r}) failed on input {_fmt(got)}: {type(err).__name__}: {err}\n"
            f"The {len(result.rows)} layers before it ran; their output shapes show where the shape "
            "comes from (print(err.summary)).", name, got, result) from err
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    _totals(model, result, called)
    return result


def _totals(model: nn.Module, result: ModelSummary, called: set[nn.Module], finished: bool = True) -> None:
    params = list(model.parameters())  # each shared parameter once
    result.total_params = sum(p.numel() for p in params)
    result.trainable_params = sum(p.numel() for p in params if p.requires_grad)
    result.param_bytes = sum(p.numel() * p.element_size() for p in params)
    if finished:  # after a failure, the layers after it were never reached: not "unused"
        result.unused = [n for n, m in model.named_modules() if list(m.parameters(recurse=False)) and m not in called]
