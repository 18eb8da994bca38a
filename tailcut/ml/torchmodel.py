"""A PyTorch ``nn.Module`` as a tailcut model: one flat float32 vector, one Layer per tensor.

A job names a user's model as ``training.model: torch`` with ``training.module:
"pkg.mod:factory"`` (an importable module) or ``"path/to/file.py:factory"``. The
factory is the whole contract::

    def factory(seed: int) -> tuple[nn.Module, loss, data]:
        # module: float32 parameters; its forward takes a batch of x_train's rows
        # loss:   loss(module(x), y) -> scalar tensor, the mean over the batch
        # data:   (x_train, y_train, x_test, y_test), numpy arrays or tensors; or any
        #         object with those four attributes (tailcut.ml.data.Dataset is one)

Every role calls it with the job's seed after ``torch.manual_seed(seed)``, so the
parameters and the data must follow from the seed alone (the PS and each worker
build them on their own host; nothing is shipped). Accuracy is the share of test
rows whose argmax output equals an integer label.

The parameters are laid out in ``module.named_parameters()`` order (registration
order, the forward order of an ``nn.Sequential``): the flat vector every transport
carries, each parameter a Layer, so CadentFlow tags one tensor per parameter.
Gradients come from autograd on one thread (roles share 2 cores).

torch is optional: importing this module does not import it; ``require()`` does,
and refuses clearly where it is missing. Debian's python3-torch (docs/pytorch.md)
was built against numpy 1.x, so next to numpy 2 its numpy bridge is off: arrays
cross by their buffers here instead, which works with either.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import io
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tailcut.ml import data
from tailcut.ml.models import Layer, check_params, layout

INSTALL_HINT = ("install PyTorch: `scripts/setup.sh --torch` does (Debian's CPU-only python3-torch, "
                "linked into .venv), or `apt-get install python3-torch` and link "
                "/usr/lib/python3/dist-packages/torch into your venv's site-packages, or "
                "`pip install torch` (docs/pytorch.md)")
_EVAL_BATCH = 1024


class TorchMissing(ImportError):
    """PyTorch is not importable in this Python."""


def require() -> Any:
    """Import torch with one thread per process, or raise TorchMissing naming the fix."""
    if sys.modules.get("torch") is not None:
        return sys.modules["torch"]
    try:
        # An old build next to numpy 2 prints a warning block on its first numpy call:
        # make that call here, quietly; _bridge() then knows which way arrays cross.
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            _numpy_bridge(torch)
    except ImportError as err:
        raise TorchMissing(f"PyTorch is not installed in this Python ({sys.executable}): "
                           f"{err}; {INSTALL_HINT}") from None
    torch.set_num_threads(1)   # several roles share 2 cores
    with contextlib.suppress(RuntimeError):   # only settable before any parallel work
        torch.set_num_interop_threads(1)
    return torch


def available() -> bool:
    try:
        require()
    except TorchMissing:
        return False
    return True


_bridge: list[bool] = []   # [whether torch.from_numpy works], once known


def _numpy_bridge(torch: Any) -> bool:
    if not _bridge:
        try:
            torch.from_numpy(np.zeros(1, dtype=np.float32))
            _bridge.append(True)
        except RuntimeError:
            _bridge.append(False)
    return _bridge[0]


def to_tensor(array: np.ndarray) -> Any:
    """A tensor with ``array``'s values (shared memory where the numpy bridge is on)."""
    torch = require()
    array = np.ascontiguousarray(array)
    if _numpy_bridge(torch):
        return torch.from_numpy(array)
    kinds = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
             np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}
    if array.size == 0:
        return torch.empty(array.shape, dtype=kinds[array.dtype])
    flat = array.reshape(-1)
    if not flat.flags.writeable:
        flat = flat.copy()
    return torch.frombuffer(flat, dtype=kinds[array.dtype]).reshape(array.shape)


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy copy of ``tensor``'s values."""
    torch = require()
    t = tensor.detach().contiguous()
    if _numpy_bridge(torch):
        return np.array(t.numpy(), copy=True)
    kinds = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
             torch.int32: np.int32, torch.uint8: np.uint8, torch.bool: np.bool_}
    dtype = np.dtype(kinds[t.dtype])
    if t.numel() == 0:
        return np.empty(tuple(t.shape), dtype=dtype)
    raw = (ctypes.c_char * (t.numel() * dtype.itemsize)).from_address(t.data_ptr())
    return np.frombuffer(raw, dtype=dtype).reshape(tuple(t.shape)).copy()


def _as_numpy(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else to_numpy(value)


class ModuleError(ValueError):
    """``training.module`` cannot be loaded or breaks the factory contract."""


def split_ref(ref: str) -> tuple[str, str]:
    """(module or file, factory name) of ``ref``; ModuleError if it has not that form.
    Imports nothing."""
    where, sep, name = ref.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ModuleError("must be \"package.module:factory\" or "
                          "\"path/to/file.py:factory\"")
    return where, name


def load_factory(ref: str) -> Any:
    """The factory ``ref`` ("pkg.mod:name" or "path/file.py:name") names; ModuleError
    says what is wrong (the caller names the field)."""
    where, name = split_ref(ref)
    require()
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ModuleError(f"no file {path}")
            spec = importlib.util.spec_from_file_location(f"tailcut_user_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ModuleError:
        raise
    except Exception as err:  # the user's code: any error is theirs to see
        raise ModuleError(f"importing {where} failed: "
                          f"{type(err).__name__}: {err}") from err
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ModuleError(f"{where} has no callable {name!r}")
    return factory


def build(ref: str, seed: int) -> tuple[TorchModel, data.Dataset]:
    """Call the factory with ``seed``; the model and its data, checked against the
    contract. A ModuleError names ``ref``."""
    try:
        return _build(ref, seed)
    except ModuleError as err:
        raise ModuleError(f"{ref}: {err}") from err


def _build(ref: str, seed: int) -> tuple[TorchModel, data.Dataset]:
    torch = require()
    factory = load_factory(ref)
    torch.manual_seed(seed)
    try:
        made = factory(seed)
    except Exception as err:
        raise ModuleError(f"the factory raised {type(err).__name__}: {err}") from err
    if not (isinstance(made, tuple) and len(made) == 3):
        raise ModuleError(f"the factory must return (module, loss, data), not "
                          f"{type(made).__name__}")
    module, loss, raw = made
    if not isinstance(module, torch.nn.Module):
        raise ModuleError(f"the factory's first item must be a torch.nn.Module, "
                          f"not {type(module).__name__}")
    if not callable(loss):
        raise ModuleError("the factory's second item must be a loss function")
    names = ("x_train", "y_train", "x_test", "y_test")
    if isinstance(raw, tuple) and len(raw) == 4:
        arrays = list(raw)
    elif all(hasattr(raw, n) for n in names):
        arrays = [getattr(raw, n) for n in names]
    else:
        raise ModuleError(f"the factory's third item must be (x_train, y_train, "
                          "x_test, y_test)")
    x_train, y_train, x_test, y_test = (_as_numpy(a) for a in arrays)
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ModuleError(f"x and y differ in rows ({len(x_train)} and "
                          f"{len(y_train)} train, {len(x_test)} and {len(y_test)} test)")
    classes = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1 \
        if y_train.dtype.kind in "iu" else 0
    dataset = data.Dataset(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                           num_classes=classes,
                           sizes=getattr(raw, "sizes", {}) if not isinstance(raw, tuple)
                           else {})
    return TorchModel(module, loss, name=f"torch:{ref}"), dataset


class TorchModel:
    """The Model protocol (tailcut.ml.models) over an nn.Module: params in and gradient
    out as flat float32 vectors; autograd in between."""

    def __init__(self, module: Any, loss: Any, name: str = "torch") -> None:
        torch = require()
        self.torch = torch
        self.module = module
        self.loss = loss
        self.name = name
        named = list(module.named_parameters())
        for pname, p in named:
            if p.dtype != torch.float32:
                raise ModuleError(f"parameter {pname} is {p.dtype}; tailcut carries float32")
        self.layers: tuple[Layer, ...] = layout([(n, tuple(p.shape)) for n, p in named])
        self.num_params = sum(layer.size for layer in self.layers)
        # The module's parameters become views of one flat tensor: setting the flat
        # vector sets them all with one copy.
        self.flat = torch.cat([p.detach().reshape(-1) for _, p in named]) if named \
            else torch.zeros(0)
        self.initial = to_numpy(self.flat)
        with torch.no_grad():
            for layer, (_, p) in zip(self.layers, named, strict=True):
                p.data = self.flat[layer.offset:layer.offset + layer.size].view(layer.shape)
        self.params = [p for _, p in named]

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """The module's parameters as the factory made them (seeded by the job's seed;
        ``rng`` is not used: torch.manual_seed(seed) decided them)."""
        return self.initial.copy()

    def _load(self, params: np.ndarray) -> None:
        check_params(params, self.num_params)
        with self.torch.no_grad():
            self.flat.copy_(to_tensor(params.astype(np.float32, copy=False)))

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray,
                      y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean loss over the batch and its gradient, flat like ``params``."""
        torch = self.torch
        self._load(params)
        self.module.train()
        for p in self.params:
            p.grad = None
        loss = self.loss(self.module(to_tensor(x)), to_tensor(y))
        loss.backward()
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                 for p in self.params]
        grad = to_numpy(torch.cat(grads)) if grads else np.zeros(0, dtype=np.float32)
        return float(loss.item()), grad.astype(np.float32, copy=False)

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean loss and accuracy (argmax against integer labels) over all rows of ``x``."""
        torch = self.torch
        self._load(params)
        self.module.eval()
        total, correct = 0.0, 0
        with torch.no_grad():
            for lo in range(0, len(x), _EVAL_BATCH):
                xb, yb = to_tensor(x[lo:lo + _EVAL_BATCH]), to_tensor(y[lo:lo + _EVAL_BATCH])
                out = self.module(xb)
                total += float(self.loss(out, yb).item()) * len(xb)
                if y.dtype.kind in "iu" and out.dim() == 2:
                    correct += int((out.argmax(dim=1) == yb).sum().item())
        n = max(len(x), 1)
        return total / n, correct / n
