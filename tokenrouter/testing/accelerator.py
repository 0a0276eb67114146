"""A stand-in accelerator: device placement and host syncs, checked on a CPU-only torch.

Code written for a GPU fails there in two ways a CPU run never shows: an op that mixes a host
tensor with a device tensor (CUDA raises "Expected all tensors to be on the same device"), and a
host sync in the middle of a step (`.item()`, `.tolist()`, `int(t)`, a blocking copy), which
stalls the GPU. Neither can be seen with `FakeTensorMode` and `cuda:0` on a CPU-only build (any
view of such a tensor raises "PyTorch is not linked with support for cuda devices"), nor with
the `meta` device alone (it has no data, and lets a host index or `searchsorted` values through).

Here, a tensor *on the accelerator* is a wrapper tensor (`AcceleratorTensor`) that reports
`meta` as its device and holds real CPU data; every op on it computes on that data. The
accelerator is a `TorchDispatchMode` that:
- raises, as CUDA does, when an op mixes accelerator tensors with a host tensor that is not
  0-dim (indexing an accelerator tensor with host indices is allowed, as on CUDA, and counts
  as an upload);
- makes factories called with `device=accel.device` (`torch.arange`, `zeros`, `full`,
  `empty`, `tensor`, `rand`, ...) create accelerator tensors;
- moves data with `.to(accel.device)`, `.to("meta")`, `.cpu()`, `.to("cpu")` and `copy_`;
- counts what would be a CUDA sync: *reads* (device to host: `_local_scalar_dense`, which
  `.item()`, `int()`, `float()` and `bool()` go through; a copy to the host, which `.cpu()` and
  `.tolist()` make; ops whose output size depends on the data: `nonzero`, `masked_select`,
  `unique`, boolean indexing, indexing with a 0-dim device tensor, `equal`), and *uploads*
  (every copy from the host, which `torch.tensor(..., device=...)` and `.to(device)` make, and
  host indices moved to the device by indexing). A copy from pageable memory waits for the
  device's queued work; `non_blocking=True` may avoid that only from pinned memory, which a
  CPU-only torch cannot make, so such copies count too (the log says which op made each).

    accel = StandInAccelerator()
    with accel:                      # factories with device=accel.device make accelerator tensors
        x = accel.put(torch.randn(4, 8))   # setup: not counted
        with accel.syncs() as s:
            y = policy_code(x)
        assert (s.reads, s.uploads) == (0, 0), s.log
        expected = accel.peek(y)     # its data on the host, not counted

Module parameters follow with `module.to(accel.device)` inside the mode. Outside the mode, ops
on accelerator tensors still work (and count), but factories cannot know the device: a plain
`meta` tensor (no data) reaching an op with accelerator tensors is an error.

Not emulated: streams and asynchrony, pinned memory (it needs a real accelerator), in-place
resizing of an accelerator tensor (an error here). `x[mask] = number` counts no read, as on
CUDA (which fills the mask in place), even when the number is an accelerator tensor.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

META = torch.device("meta")
HOST = torch.device("cpu")

# ops whose output size depends on the data (CUDA reads it back to size the output)
DATA_DEPENDENT = frozenset(
    {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "equal"}
)
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl", "_index_put_impl_"})
MOVES = frozenset({"_to_copy", "copy_", "copy"})


@dataclass
class Syncs:
    """Host syncs counted while a `StandInAccelerator.syncs()` block ran."""

    reads: int = 0  # device -> host: a scalar read, a copy to the host, a data-dependent size
    uploads: int = 0  # blocking host -> device copies
    log: list[str] = field(default_factory=list)  # "read aten.X" / "upload aten.X", in order

    @property
    def total(self) -> int:
        return self.reads + self.uploads


class AcceleratorTensor(torch.Tensor):
    """A tensor on the stand-in accelerator: reports `meta` as its device, holds `data_on_host`
    (a CPU tensor with the same shape, strides and storage offset) that ops compute on."""

    data_on_host: torch.Tensor
    accelerator: StandInAccelerator

    @staticmethod
    def __new__(cls, data: torch.Tensor, accelerator: StandInAccelerator):
        if type(data) is not torch.Tensor or data.device != HOST:
            raise TypeError(
                f"an accelerator tensor holds a plain CPU tensor, not a {type(data).__name__} on {data.device}"
            )
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=META,
            requires_grad=data.requires_grad,
        )
        wrapper.data_on_host = data.detach() if data.requires_grad else data
        wrapper.accelerator = accelerator
        return wrapper

    def __repr__(self) -> str:
        return f"AcceleratorTensor({self.data_on_host!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # no subclass wrapping at the torch-function level: placement is decided in dispatch
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist:
            return args[0].accelerator.tolist(args[0])
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        """Reached outside the accelerator's mode (inside it, the mode handles every op)."""
        owner = next(t.accelerator for t in tree_flatten((args, kwargs))[0] if isinstance(t, AcceleratorTensor))
        return owner.run(func, args, kwargs or {})


class _Mode(TorchDispatchMode):
    def __init__(self, accelerator: StandInAccelerator):
        super().__init__()
        self.accelerator = accelerator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.accelerator.run(func, args, kwargs or {})


class _Factories(TorchFunctionMode):
    """What dispatch cannot see: `torch.tensor(data, device=...)` builds its tensor on the
    target device below the dispatcher, and `.tolist()` refuses tensor subclasses."""

    def __init__(self, accelerator: StandInAccelerator):
        super().__init__()
        self.accelerator = accelerator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        accel = self.accelerator
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and kwargs.get("device") is not None:
            if accel.placed(func, kwargs["device"]) and not isinstance(args[0], AcceleratorTensor):
                data = func(*args, **{**kwargs, "device": HOST})
                accel.count("upload", func.__name__)
                return AcceleratorTensor(data, accel)
        if func is torch.Tensor.tolist and isinstance(args[0], AcceleratorTensor):
            return accel.tolist(args[0])
        return func(*args, **kwargs)


class StandInAccelerator:
    """The stand-in accelerator (see the module's docstring). Enter it (`with accel:`) to run
    code: its mode routes every op."""

    device = META  # what code compares and passes as the accelerator's device

    def __init__(self):
        self.counts: list[Syncs] = []  # the open `syncs()` blocks, innermost last
        self.modes: list[contextlib.ExitStack] = []

    def __enter__(self) -> StandInAccelerator:
        modes = contextlib.ExitStack()
        modes.enter_context(_Factories(self))
        modes.enter_context(_Mode(self))
        self.modes.append(modes)
        return self

    def __exit__(self, *exc) -> None:
        self.modes.pop().__exit__(*exc)

    def tolist(self, t: AcceleratorTensor) -> list:
        self.count("read", "Tensor.tolist")
        return t.data_on_host.tolist()

    @contextlib.contextmanager
    def syncs(self):
        """Count the host syncs made inside the block."""
        counted = Syncs()
        self.counts.append(counted)
        try:
            yield counted
        finally:
            self.counts.remove(counted)

    def put(self, t: torch.Tensor) -> AcceleratorTensor:
        """A copy of host tensor `t` on the accelerator (test setup: not counted)."""
        data = self.peek(t) if isinstance(t, AcceleratorTensor) else t.detach().clone()
        return AcceleratorTensor(data, self)

    def peek(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of an accelerator tensor's data (test inspection: not counted)."""
        if not isinstance(t, AcceleratorTensor):
            raise TypeError(f"not on the accelerator: a tensor on {t.device}")
        return t.data_on_host.clone()

    @staticmethod
    def holds(t) -> bool:
        return isinstance(t, AcceleratorTensor)

    def count(self, kind: str, func) -> None:
        for counted in self.counts:
            setattr(counted, kind + "s", getattr(counted, kind + "s") + 1)
            counted.log.append(f"{kind} {func}")

    # --- dispatch -----------------------------------------------------------------------------

    def run(self, func, args: tuple, kwargs: dict):
        name = func.overloadpacket.__name__
        flat = tree_flatten((args, kwargs))[0]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        on_device = [t for t in tensors if isinstance(t, AcceleratorTensor)]
        for t in tensors:
            if t.device == META and not isinstance(t, AcceleratorTensor):
                raise RuntimeError(
                    f"{func}: a meta tensor without data (made with device=meta outside `with accelerator:`?)"
                )
        device = kwargs.get("device")
        if name in MOVES:
            return self.move(func, name, args, kwargs)
        if device is not None:  # a factory (or *_like / new_*): placed where it says
            return self.compute(func, args, {**kwargs, "device": HOST}, on_device=self.placed(func, device))
        if not on_device:
            return func(*args, **kwargs)
        if name in INDEXING:
            self.check_indexing(func, args, kwargs)
        else:
            self.check_same_device(func, tensors)
            if name in DATA_DEPENDENT or (name == "repeat_interleave" and kwargs.get("output_size") is None):
                self.count("read", func)
            elif name == "_local_scalar_dense":
                self.count("read", func)
        return self.compute(func, args, kwargs, on_device=True)

    @staticmethod
    def placed(func, device) -> bool:
        device = torch.device(device)
        if device.type not in ("meta", "cpu"):
            raise RuntimeError(f"{func}: the stand-in accelerator has no device {device}")
        return device.type == "meta"

    @staticmethod
    def check_same_device(func, tensors: list[torch.Tensor]) -> None:
        if any(not isinstance(t, AcceleratorTensor) and t.dim() > 0 for t in tensors):
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"meta (the stand-in accelerator) and cpu! (in {func})"
            )

    def check_indexing(self, func, args: tuple, kwargs: dict) -> None:
        """CUDA indexes a device tensor with host indices (copying them over, a blocking upload)
        but not a host tensor with device indices; a boolean index is read to size the output."""
        indexed, indices = args[0], [i for i in args[1] if i is not None]
        rest = [t for t in tree_flatten((args[2:], kwargs))[0] if isinstance(t, torch.Tensor)]
        if not isinstance(indexed, AcceleratorTensor):
            raise RuntimeError(
                f"indices should be either on cpu or on the same device as the indexed tensor (cpu) (in {func})"
            )
        self.check_same_device(func, [indexed, *rest])
        for i in indices:
            if not isinstance(i, AcceleratorTensor):
                self.count("upload", func)
        value = args[2] if len(args) > 2 else None
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        if value is not None and not accumulate and len(indices) == 1 and value.dim() == 0:
            if indices[0].dtype == torch.bool:
                # `x[mask] = number`: CUDA makes the number a host scalar and fills the mask in
                # place (masked_fill_), no read (here the number arrives on the meta device)
                return
        if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
            self.count("read", func)

    def move(self, func, name: str, args: tuple, kwargs: dict):
        if name == "copy_":
            dst, src = args[0], args[1]
            dst_on, src_on = isinstance(dst, AcceleratorTensor), isinstance(src, AcceleratorTensor)
            if dst.device == META and not dst_on:
                raise RuntimeError(f"{func}: copying into a meta tensor without data")
            if dst_on != src_on:
                self.count("read" if src_on else "upload", func)
            return self.compute(func, args, kwargs, on_device=dst_on)
        src = args[0]
        src_on = isinstance(src, AcceleratorTensor)
        device = kwargs.get("device")
        to_device = src_on if device is None else self.placed(func, device)
        if src_on != to_device:
            self.count("upload" if to_device else "read", func)
        if device is not None:
            kwargs = {**kwargs, "device": HOST}
        return self.compute(func, args, kwargs, on_device=to_device)

    def compute(self, func, args: tuple, kwargs: dict, on_device: bool):
        """Run `func` on the host data; new tensors it returns are on the accelerator when
        `on_device`; a returned input (in-place and out= ops) is that input itself."""
        flat, spec = tree_flatten((args, kwargs))
        inputs = {}
        for t in flat:
            if isinstance(t, AcceleratorTensor):
                inputs[id(t.data_on_host)] = t
            elif isinstance(t, torch.Tensor):
                inputs[id(t)] = t
        host_args, host_kwargs = tree_unflatten(
            [t.data_on_host if isinstance(t, AcceleratorTensor) else t for t in flat], spec
        )
        out = func(*host_args, **host_kwargs)

        def place(t):
            if not isinstance(t, torch.Tensor):
                return t
            if id(t) in inputs:
                given = inputs[id(t)]
                if given.shape != t.shape or given.stride() != t.stride():
                    raise NotImplementedError(f"{func} resized an accelerator tensor in place")
                return given
            return AcceleratorTensor(t, self) if on_device else t

        return tree_map(place, out)
