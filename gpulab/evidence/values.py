"""What the grader decodes evidence into: plain values, hashable where they can be, with readable reprs
(:func:`gpulab.evidence.codec.decode` builds them; the verdicts compare them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


class EvidenceError(ValueError):
    """Data that is not evidence of the expected form."""


@dataclass(frozen=True)
class Dtype:
    name: str

    def __repr__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True)
class Device:
    name: str

    def __repr__(self) -> str:
        return f"device(type='{self.name}')" if ":" not in self.name else f"device('{self.name}')"


@dataclass(frozen=True)
class Record:
    """A dataclass instance, as its type's name and its fields."""

    type: str
    fields: tuple

    def __repr__(self) -> str:
        return f"{self.type}(" + ", ".join(f"{k}={v!r}" for k, v in self.fields) + ")"


@dataclass(frozen=True)
class Container:
    """A namedtuple or a subclass of tuple or list: its type's name, its kind and its items. It
    equals another of the same type, and (as in Python) a plain sequence of its kind."""

    type: str
    kind: str  # namedtuple | tuple | list
    items: tuple

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Container):
            return (self.type, self.kind, self.items) == (other.type, other.kind, other.items)
        if isinstance(other, tuple) and self.kind != "list" or isinstance(other, list) and self.kind == "list":
            return self.items == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.type, self.items))

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Any:
        return iter(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]

    def __repr__(self) -> str:
        return f"{self.type}({', '.join(map(repr, self.items))})"


@dataclass(frozen=True)
class Other:
    """Any other object, as its type and repr."""

    type: str
    repr: str

    def __repr__(self) -> str:
        return self.repr


@dataclass(frozen=True)
class Raised:
    """An exception, as the names of its classes and its message."""

    types: tuple
    message: str

    def __repr__(self) -> str:
        return f"{self.types[0]}({self.message!r})" if self.types else f"exception({self.message!r})"


@dataclass(eq=False)
class Tensor:
    """A tensor's dtype, shape, device and values (None for the meta device)."""

    dtype: str
    shape: tuple
    device: str = "cpu"
    array: np.ndarray | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        if (self.dtype, self.shape, self.device) != (other.dtype, other.shape, other.device):
            return False
        if self.array is None or other.array is None:
            return self.array is None and other.array is None
        return bool(np.array_equal(self.array, other.array))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.array is not None and self.array.size <= 8:
            values = np.array2string(self.array, separator=", ", precision=4)
            return f"tensor({values}, dtype=torch.{self.dtype})"
        return f"tensor(shape={self.shape}, dtype=torch.{self.dtype}" + (
            f", device='{self.device}')" if self.device not in ("cpu",) else ")")
