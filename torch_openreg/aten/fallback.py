"""The global fallback: any ATen operator without an openreg kernel runs here.

For an operator call on openreg tensors the fallback

1. checks devices (one openreg device; CPU tensors only as 0-dim scalars),
2. infers the outputs' metadata by running the operator on ``meta`` tensors
   (this also raises shape and dtype errors synchronously, at the call),
3. allocates fresh outputs on the device, makes views share their base's
   storage, and resizes ``out=`` arguments as the operator would,
4. launches a kernel on the current stream that runs the CPU kernel over host
   views of the device buffers, writing straight into the outputs (through the
   operator's ``out=`` overload when it has one): no copy of the data.

Operators whose output shapes depend on the data (``nonzero``, ``unique``,
boolean indexing), that return non-tensors, or that have no meta kernel take the
synchronous path: wait for the stream, run the CPU kernel, copy the (new)
outputs to the device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import openreg
from torch_openreg import _C
from torch_openreg.device import sync_debug
from torch_openreg.timing import costs as timing_costs

from .launch import detach_frames, host_view, launch, launch_extents, run_sync

# LITERALINCLUDE START: NEVER FALLBACK
# Operators whose CPU kernel would be wrong for device memory: they raise instead.
NEVER_FALLBACK = {
    "aten::_pin_memory": "pinning applies to CPU tensors; openreg memory is device memory",
    "aten::_pin_memory.out": "pinning applies to CPU tensors; openreg memory is device memory",
    "aten::to_mkldnn": "MKL-DNN tensors live on the CPU only; copy the tensor to the CPU first",
}
# Operators that may take CPU index tensors alongside openreg tensors (as on CUDA).
CPU_INDICES_OK = {
    "aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"
}
# Operators whose meta kernel disagrees with their CPU kernel on output shapes or dtypes (the meta
# kernels follow CUDA: e.g. eval-mode batch norm statistics of size C, not 0; float statistics for
# bfloat16 inputs). The CPU kernel decides what they return: they take the synchronous path.
CPU_DECIDES_OUTPUTS = {"aten::_batch_norm_with_update", "aten::_embedding_bag", "aten::_embedding_bag_forward_only"}
# Normalizations whose statistics outputs (1 and 2) the CPU kernel shapes its own way: in the input's
# dtype unless a reduced-precision input meets float32 parameters, and empty when not training. The
# meta run's outputs are corrected by that rule (``_cpu_statistics``), so they stay asynchronous.
CPU_STATISTICS = {"aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::native_layer_norm"}
# The convolution's meta kernel gives a contiguous output where the CPU's oneDNN kernel keeps a
# channels-last input or weight channels-last: the meta run's output takes the CPU's layout (_cpu_layout).
CPU_LAYOUT = {"aten::convolution"}
# LITERALINCLUDE END: NEVER FALLBACK

FRESH, VIEW, INPLACE = "fresh", "view", "inplace"


# LITERALINCLUDE START: OP INFO
class OpInfo:
    """What the fallback needs to know about one operator overload, read once from its schema."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        self.blocked = NEVER_FALLBACK.get(self.name) or NEVER_FALLBACK.get(schema.name)
        self.arguments = schema.arguments
        self.positions = {a.name: i for i, a in enumerate(schema.arguments)}
        self.generators = [a.name for a in schema.arguments if "Generator" in str(a.type)]
        self.tensor_args = [i for i, a in enumerate(schema.arguments) if str(a.type) == "Tensor"]
        self.out_kwargs = [a.name for a in schema.arguments if a.kwarg_only and a.alias_info and a.alias_info.is_write]
        self.scratch_out = False  # its CPU out= kernel resizes ``out`` (learned at the first run)
        # Losses reduce through ``out``: their CPU out= kernels store the unreduced values there first.
        self.loss = "reduction" in self.positions
        # An optimizer's numbers (a learning rate, Adam's bias corrections) change every step but never
        # the output metadata: keying the meta cache by their values would re-run the meta kernel.
        self.numbers_by_type = schema.name.startswith(("aten::_foreach_", "aten::_fused_"))
        alias_args = {}
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None:
                for s in a.alias_info.before_set:
                    alias_args[s] = i
        self.mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        self.returns: list[tuple[str, int | None]] = []
        tensor_only = True
        for r in schema.returns:
            kind = str(r.type)
            if kind not in ("Tensor", "List[Tensor]", "Optional[Tensor]"):
                tensor_only = False
            if r.alias_info is None:
                self.returns.append((FRESH, None))
            else:
                arg = alias_args.get(next(iter(r.alias_info.before_set)))
                self.returns.append((INPLACE if r.alias_info.is_write else VIEW, arg))
        # Whether output metadata may depend on where the tensors sit in their storage: a view's offset
        # does, and so do written arguments (overlap checks); fresh outputs do not, so the slices of a
        # tensor share one call shape (one meta run, one checking run, one plan), not one each.
        self.placed = self.mutates or not self.returns or any(kind != FRESH for kind, _ in self.returns)
        # Random ops are queued like any other: they draw from the generator when they run, and the
        # generator waits for queued work before the host seeds it or reads or sets its state.
        self.sync_only = not tensor_only or schema.name in CPU_DECIDES_OUTPUTS
        # The host waits for the device because of the data, as it would on CUDA (not because of what the
        # simulator needs): PyTorch tags such operators. The sync debug mode reports these.
        self.host_waits = bool({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output} & set(op.tags))
        self.cpu_statistics = schema.name in CPU_STATISTICS
        self.cpu_layout = schema.name in CPU_LAYOUT
        self.out_names = self._out_overload_names(op)
        # Call plans by argument key (see _Plan), for the operators that run through an out= kernel or
        # return only fresh tensors, and need nothing but their arguments: no generator, no device argument.
        writes_out = self.out_names or (self.out_kwargs and all(kind != FRESH for kind, _ in self.returns))
        self.functional = bool(self.returns) and not self.mutates and all(
            kind == FRESH and str(r.type) == "Tensor" for (kind, _), r in zip(self.returns, schema.returns)
        )
        plannable = (writes_out or self.functional) and not (
            self.blocked or self.sync_only or self.generators or "device" in self.positions
        )
        self.plans: dict[tuple, _Plan] | None = {} if plannable else None

    def _out_overload_names(self, op: torch._ops.OpOverload) -> list[str] | None:
        """Names of the ``out=`` arguments of this functional op's out overload, if it has one."""
        if not self.returns or any(kind != FRESH for kind, _ in self.returns) or self.mutates:
            return None
        if any(str(r.type) != "Tensor" for r in op._schema.returns):
            return None
        # The out= overload is usually "out" or "<overload>_out", but some are named after their
        # output ("threshold_backward.grad_input"): any overload with the same inputs plus one
        # keyword-only written tensor per return qualifies, the conventional names first.
        packet, overload = op.overloadpacket, op._schema.overload_name
        first = "out" if overload in ("", "default") else f"{overload}_out"
        inputs = [(a.name, str(a.type)) for a in op._schema.arguments]
        for candidate in [first, *(o for o in packet.overloads() if o != first)]:
            out_op = getattr(packet, candidate, None)
            if out_op is None or out_op is op:
                continue
            out_args = out_op._schema.arguments
            names = [a.name for a in out_args if a.kwarg_only and a.alias_info and a.alias_info.is_write]
            rest = [(a.name, str(a.type)) for a in out_args if a.name not in names]
            if names and rest == inputs and len(names) == len(self.returns):
                if _copies_after_all(out_op):
                    return None
                self.out_op = out_op
                return names
        return None

    def value(self, args: tuple, kwargs: dict, index: int) -> Any:
        if index < len(args):
            return args[index]
        a = self.arguments[index]
        return kwargs.get(a.name, a.default_value if a.has_default_value() else None)
# LITERALINCLUDE END: OP INFO


def _copies_after_all(out_op: torch._ops.OpOverload) -> bool:
    """Whether an out= overload is PyTorch's generated one for the CPU (``convolution.out``,
    ``native_layer_norm.out``, ``clone.out``): it runs the functional kernel into a new tensor and copies
    that into ``out``. The functional kernel, with its outputs allocated in device memory, does better."""
    name = out_op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return not has(name, "CPU") and has(name, "CompositeExplicitAutograd")


_infos: dict[torch._ops.OpOverload, OpInfo] = {}


def _map(value: Any, fn) -> Any:
    """Apply ``fn`` to every tensor in an argument (tensors and lists of tensors)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(fn(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


# LITERALINCLUDE START: DEVICE CHECK
def _device_of(info: OpInfo, tensors: list[torch.Tensor], kwargs: dict) -> torch.device:
    """The one openreg device of the call; mixed devices are the user's error, reported like CUDA's.

    ``get_device()`` is the cheap test (openreg is this process's only accelerator): it is -1 for
    CPU and meta tensors and the index for openreg ones.
    """
    index = -1
    for name in info.out_kwargs:  # an out= tensor is written by the kernel: a CPU one is never a scalar operand
        for t in _tensors((kwargs.get(name),), {}):
            if t.get_device() < 0:
                raise RuntimeError(f"Expected all tensors to be on the same device, but the out= tensor '{name}' "
                                   f"of {info.name} is on {t.device} while its inputs are on openreg")
    for t in tensors:
        i = t.get_device()
        if i >= 0:
            if index < 0:
                index = i
            elif i != index:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"openreg:{index} and openreg:{i}! (in {info.name})"
                )
        elif not (t.is_cpu and (t.dim() == 0 or info.name in CPU_INDICES_OK)):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{'openreg' if index < 0 else f'openreg:{index}'} and {t.device}! "
                f"(in {info.name}; only 0-dim CPU tensors mix with openreg)"
            )
    if index >= 0:
        return _DEVICES[index]
    requested = kwargs.get("device")
    if requested is None:
        raise RuntimeError(f"{info.name}: no openreg tensor or device in the call")
    device = torch.device(requested)
    if device.index is None:
        device = torch.device("openreg", torch.openreg.current_device())
    return device


_DEVICES = [torch.device("openreg", i) for i in range(openreg.device_count())]
# LITERALINCLUDE END: DEVICE CHECK


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    if t.get_device() < 0:
        # A 0-dim CPU tensor is a scalar operand: on meta it promotes the same way, and meta kernels
        # refuse to mix it with meta outputs (mul.out(cpu_scalar, x, out=y) would fail and go synchronous).
        return torch.empty((), dtype=t.dtype, device="meta") if t.dim() == 0 else t
    numel = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(numel, dtype=t.dtype, device="meta").as_strided(t.size(), t.stride(), t.storage_offset())


def _swap(args: tuple, kwargs: dict, info: OpInfo, device: torch.device, tensor_fn, target: str) -> tuple:
    """Arguments for a run on ``target`` ('meta' or 'cpu'): tensors mapped, device and generators replaced."""
    new_args = tuple(_map(a, tensor_fn) for a in args)
    new_kwargs = {k: _map(v, tensor_fn) for k, v in kwargs.items()}
    if "device" in new_kwargs and new_kwargs["device"] is not None:
        new_kwargs["device"] = torch.device(target)
    if info.generators:
        new_args, new_kwargs = _with_generators(new_args, new_kwargs, info, device, target)
    return new_args, new_kwargs


def _with_generators(args: tuple, kwargs: dict, info: OpInfo, device: torch.device, target: str) -> tuple:
    """Random ops draw from the device's generator (its CPU state), never the CPU default one."""
    args = list(args)
    for name in info.generators:
        index = info.positions[name]
        gen = info.value(args, kwargs, index)
        if target == "meta":
            cpu_gen = None
        else:
            cpu_gen = _C._cpu_generator(gen if gen is not None else _C._default_generator(device.index))
        if index < len(args):
            args[index] = cpu_gen
        else:
            kwargs[name] = cpu_gen
    return tuple(args), kwargs


def _pack(results: list) -> Any:
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)


# LITERALINCLUDE START: META CACHE
_META_CACHE_SIZE = 8192
_meta_cache: dict[tuple, Any] = {}
SYNC = object()  # what _meta_outputs gives for a call shape that must run synchronously


class _Uncacheable(TypeError):
    """An argument whose values, not only its metadata, shape the outputs: the call is not memoized."""


def _key_of(value: Any, placed: bool = True) -> Any:
    """A hashable description of an argument as far as output metadata can depend on it (``placed``: with
    where an openreg tensor sits in its storage, which only views and written arguments depend on)."""
    if isinstance(value, torch.Tensor):
        if value.get_device() >= 0:
            if not placed:
                return (value.dtype, value.shape, value.stride())
            return (value.dtype, value.shape, value.stride(), value.storage_offset(), value.untyped_storage().nbytes())
        if value.dim() and value.dtype in (torch.bool, torch.uint8):
            # A CPU boolean mask: the meta run reads it (its True count is the output's length), so two
            # masks of one shape give different outputs. (An openreg mask makes the meta run fail: sync.)
            raise _Uncacheable("CPU mask")
        return (value.device, value.dtype, value.shape, value.stride())  # CPU scalars and indices
    if isinstance(value, (list, tuple)):
        return tuple(_key_of(v, placed) for v in value)
    if isinstance(value, torch.Generator):
        return None
    if isinstance(value, (bool, int, float, complex)):
        return (type(value), value)  # 2, 2.0 and True are equal but promote differently
    return value


def _type_key_of(value: Any, placed: bool = True) -> Any:
    """:func:`_key_of` for operators whose numbers never shape their outputs (only their types promote)."""
    if isinstance(value, (bool, int, float, complex)):
        return type(value)
    if isinstance(value, (list, tuple)):
        return tuple(_type_key_of(v, placed) for v in value)
    return _key_of(value, placed)


def _meta_outputs(op, info: OpInfo, args: tuple, kwargs: dict, device: torch.device) -> tuple[Any, Any]:
    """``(key, output metadata)``: a meta run, memoized by operator and argument metadata (the key;
    None for arguments that cannot be hashed).

    A meta run costs 20-200 us; the same call shapes recur every training step.
    The cached meta tensors are only ever read.
    """
    key_of, placed = _type_key_of if info.numbers_by_type else _key_of, info.placed
    try:
        key = (op, key_of(args, placed), tuple((k, key_of(v, placed)) for k, v in kwargs.items()))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _meta_cache:
        return key, _meta_cache[key]
    meta_args, meta_kwargs = _swap(args, kwargs, info, device, _to_meta, "meta")
    try:
        with _C._WarningRecorder():  # dropped: the CPU kernel gives the caller the operator's warnings
            meta = op(*meta_args, **meta_kwargs)
    except Exception:
        # No meta kernel, data-dependent output shapes (a boolean mask), or a check that needs the
        # data: this call shape goes the synchronous way, where the CPU kernel decides. Remembered per
        # call shape only: an index with a boolean mask must not make integer indexing synchronous.
        meta = SYNC
    if meta is not SYNC and info.cpu_statistics:
        meta = _cpu_statistics(info, args, kwargs, meta)
    if meta is not SYNC and info.cpu_layout:
        meta = _cpu_layout(args, meta)
    if key is not None:
        if len(_meta_cache) >= _META_CACHE_SIZE:
            _meta_cache.clear()
            _checked.clear()
        _meta_cache[key] = meta
    return key, meta
# LITERALINCLUDE END: META CACHE


# LITERALINCLUDE START: CPU STATISTICS
_REDUCED = (torch.bfloat16, torch.float16)


def _cpu_statistics(info: OpInfo, args: tuple, kwargs: dict, meta: tuple) -> tuple:
    """The outputs of a CPU batch or layer norm: the meta kernel describes CUDA's statistics.

    The CPU kernels keep statistics in the parameters' type: float32 only for a reduced-precision
    input with float32 weights or running statistics (a "mixed" call), else the input's dtype; and a
    batch norm that is not training returns empty statistics.
    """
    x, *params = _tensors(args, kwargs)
    mixed = x.dtype in _REDUCED and any(p.dtype == torch.float32 for p in params)
    dtype = torch.float32 if mixed else x.dtype
    training = info.value(args, kwargs, info.positions["training"]) if "training" in info.positions else True
    stats = [torch.empty(m.shape if training else (0,), dtype=dtype, device="meta") for m in meta[1:3]]
    return (meta[0], *stats, *meta[3:])


def _cpu_layout(args: tuple, meta: torch.Tensor) -> torch.Tensor:
    """A convolution's output in the memory format the CPU would give it: PyTorch's own choice of
    convolution backend and of its memory format, asked for CPU stand-ins of the input and weight
    (allocated, never touched; once per call shape, as the meta run is memoized)."""
    input, weight, _, *rest = args
    stand_ins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for t in (input, weight)]
    try:
        backend = torch._C._select_conv_backend(*stand_ins, None, *rest)
        layout = torch._C._conv_determine_backend_memory_format(*stand_ins, backend)
    except RuntimeError:  # arguments the CPU's selection refuses: the meta kernel's layout stands
        return meta
    return meta.contiguous(memory_format=layout)
# LITERALINCLUDE END: CPU STATISTICS


_NUMBERS = (bool, int, float, complex)
_WIDE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


# LITERALINCLUDE START: WRAP NUMBERS
def _wrap_numbers(info: OpInfo, args: tuple, kwargs: dict) -> tuple:
    """Turn Python numbers passed for ``Tensor`` arguments back into 0-dim CPU tensors.

    ``t % 2`` reaches the fallback as ``remainder.Tensor_out(t, 2)``: PyTorch hands a boxed kernel
    a wrapped-number tensor as a plain number, and most operators refuse a number when called
    again. The tensor gets the dtype the number takes in the operation, so promotion is unchanged.
    """
    numbers = [i for i in info.tensor_args if isinstance(info.value(args, kwargs, i), _NUMBERS)]
    if not numbers:
        return args, kwargs
    ref = next(iter(_tensors(args, kwargs)), None)
    args, kwargs = list(args), dict(kwargs)
    for i in numbers:
        value = info.value(args, kwargs, i)
        # Kept at full width, as a wrapped number is: kernels read a CPU scalar operand in their
        # computation type (float for bfloat16), so rounding it to the tensor's dtype first would
        # change results (bfloat16 x * 0.7071). Cast only where a full-width 0-dim tensor would
        # promote differently from a number (an integer tensor times 2.5 is float32, not float64).
        wrapped = torch.tensor(value, dtype=_WIDE[type(value)])
        if ref is not None:
            want = torch.result_type(ref, value)
            if torch.result_type(ref, wrapped) != want:
                wrapped = wrapped.to(want)
        if i < len(args):
            args[i] = wrapped
        else:
            kwargs[info.arguments[i].name] = wrapped
    return tuple(args), kwargs
# LITERALINCLUDE END: WRAP NUMBERS


# LITERALINCLUDE START: FALLBACK
def fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` for openreg tensors: meta for metadata, the CPU kernel on device memory for data."""
    if openreg.timing.active:  # the timing model prices the launch this call makes (torch_openreg/timing)
        timing_costs.price_op(op, args, kwargs)
    info = _infos.get(op)
    if info is None:
        info = _infos[op] = OpInfo(op)
    described = None
    if info.plans is not None:  # the fast path: a call of a shape seen (and checked) before runs its plan
        described = _C._describe_call(args, kwargs, info.numbers_by_type, info.placed)
        if described is not None:
            try:
                plan = info.plans.get(described[0])
            except TypeError:  # an unhashable argument: only the general path takes it
                plan = described = None
            if plan is not None:
                return _run(plan, described, args, kwargs, False)
    if info.blocked:
        raise NotImplementedError(f"{info.name} is not supported on the openreg device: {info.blocked}")
    try:
        given = args, kwargs
        args, kwargs = _wrap_numbers(info, args, kwargs)
        tensors = _tensors(args, kwargs)
        device = _device_of(info, tensors, kwargs)
        if not info.sync_only:
            key, meta = _meta_outputs(op, info, args, kwargs, device)
            if meta is not SYNC:
                # The first call of a call shape runs synchronously, on this thread: the checks of the CPU
                # kernel's host code raise here, with the CPU's exception, and its warnings are this
                # caller's (see _checked). Later calls of a clean shape are queued. A graph capture records
                # the first call like any launch: nothing runs on the host during a capture (openreg.graph).
                check = key is None or key not in _checked
                check = check and not openreg.is_capturing(openreg.current_stream(device.index))
                plan = _plan(op, info, args, kwargs, tensors, device, meta, given) if info.plans is not None else None
                if plan is not None and not (described is not None and plan.cacheable):
                    described = [None, *_swap(args, kwargs, info, device, _host_view_or_snapshot, "cpu"),
                                 _C._extents(tensors)]
                try:
                    with _Warnings(check) as warned:
                        if plan is None:
                            result = _run_async(op, info, args, kwargs, tensors, device, meta, check)
                        else:
                            result = _run(plan, described, args, kwargs, check)
                except _CpuDisagrees:
                    _meta_cache[key] = SYNC  # the CPU kernel decides this call shape's outputs from now on
                else:
                    if check and not warned and key is not None:
                        _checked[key] = None
                        if plan is not None and described and described[0] is not None:
                            _remember(info, described[0], plan)
                    return result
        return _run_sync(op, info, args, kwargs, tensors, device)
    except BaseException as exc:
        if described:  # this frame stays in the traceback: its host views must not (see _run)
            described.clear()
        # Nor may the frames below it: they hold the call's outputs (device memory a caller that keeps
        # the exception would keep) and host views. Their traceback is kept as text.
        detach_frames(exc, "fallback")
        raise


# Call shapes (meta-cache keys) whose first call ran synchronously without an error or a warning. A call
# shape that warned is never entered: each of its calls runs synchronously, so each warns, as on the CPU.
_checked: dict[tuple, None] = {}


class _CpuDisagrees(RuntimeError):
    """A CPU kernel's output differs in shape or dtype from what the meta kernel said (``nansum(x, dim=[])``
    reduces everything on the CPU, nothing on meta): raised before any output is written."""


def _check_output(name: str, view: torch.Tensor, result: torch.Tensor) -> None:
    """Raise :class:`_CpuDisagrees` unless ``result`` (the CPU's) fits ``view`` (the meta kernel's output)."""
    if result.shape != view.shape or result.dtype != view.dtype:
        raise _CpuDisagrees(
            f"{name}: the CPU kernel gave an output of shape {tuple(result.shape)} and dtype {result.dtype} where "
            f"the meta kernel said {tuple(view.shape)} and {view.dtype}"
        )


class _Warnings:
    """Around a checked call: counts the warnings its kernel raised on this thread, passing them on to the
    caller's handler (unless the call is to run again on the synchronous path, which warns for itself)."""

    def __init__(self, active: bool) -> None:
        self.recorder = _C._WarningRecorder() if active else None

    def __enter__(self) -> _Warnings:
        if self.recorder is not None:
            self.recorder.__enter__()
        return self

    def __exit__(self, kind, value, tb) -> None:
        if self.recorder is not None:
            self.recorder.__exit__(kind, value, tb)
            if kind is None or not issubclass(kind, _CpuDisagrees):
                self.recorder.flush()

    def __bool__(self) -> bool:
        return self.recorder is not None and self.recorder.count > 0


# LITERALINCLUDE END: FALLBACK


# LITERALINCLUDE START: OUTPUTS
def _outputs(info: OpInfo, args: tuple, kwargs: dict, device: torch.device, meta: Any) -> list:
    """Allocate fresh outputs, build views, and resize mutated outputs to what the meta run says."""
    metas = [meta] if len(info.returns) == 1 else list(meta or ())
    outs = []
    for (kind, arg), m in zip(info.returns, metas):
        if kind == FRESH:
            outs.append(_map(m, lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)))
        elif kind == VIEW:
            base = info.value(args, kwargs, arg)
            outs.append(_map(m, lambda t, base=base: _view_of(base, t, device)))
        else:
            real = info.value(args, kwargs, arg)
            if isinstance(real, torch.Tensor):
                _match(real, m)
            else:
                for r, mm in zip(real, m):
                    _match(r, mm)
            outs.append(real)
    return outs


def _view_of(base: torch.Tensor, m: torch.Tensor, device: torch.device) -> torch.Tensor:
    view = torch.empty(0, dtype=m.dtype, device=device)
    view = view.set_(base.untyped_storage(), m.storage_offset(), m.size(), m.stride())
    if base.is_conj() and view.is_complex():  # a view of a lazily conjugated/negated tensor is one too
        view = view.conj()
    if base.is_neg():
        view = torch._neg_view(view)
    return view


def _match(real: torch.Tensor, m: torch.Tensor) -> bool:
    """Give an ``out=``/in-place argument the shape and strides the operator gives it (resizing storage);
    returns whether it already had them."""
    if real.size() != m.size() or (real.numel() > 1 and real.stride() != m.stride()):
        real.set_(real.untyped_storage(), real.storage_offset(), m.size(), m.stride())
        return False
    return True
# LITERALINCLUDE END: OUTPUTS


# LITERALINCLUDE START: RUN ASYNC
def _run_async(op, info: OpInfo, args, kwargs, tensors, device: torch.device, meta, check: bool = False) -> Any:
    outs = _outputs(info, args, kwargs, device, meta)
    if not info.mutates and all(kind == VIEW for kind, _ in info.returns):
        return _pack(outs)  # a pure view: metadata only, nothing to compute
    cpu_args, cpu_kwargs = _swap(args, kwargs, info, device, _host_view_or_snapshot, "cpu")
    fresh = [(i, o) for i, ((kind, _), o) in enumerate(zip(info.returns, outs)) if kind == FRESH]
    written = [t for _, o in fresh for t in (o if isinstance(o, (list, tuple)) else [o]) if t is not None]
    targets = [(i, _map(o, host_view)) for i, o in fresh]
    kernel = _CopyKernel(op, cpu_args, cpu_kwargs, targets, len(info.returns), _call_shape(op, tensors))
    launch(device.index, kernel, tensors=[*tensors, *written], name=info.name, sync=check)
    return _pack(outs)


def _call_shape(op, tensors: list) -> tuple:
    """What a functional kernel's order of allocations may depend on (see ``_CopyKernel._learn``)."""
    return (op, *((t.shape, t.dtype) for t in tensors))


def host_view_or_self(t: torch.Tensor) -> torch.Tensor:
    return host_view(t) if t.get_device() >= 0 else t


def _host_view_or_snapshot(t: torch.Tensor) -> torch.Tensor:
    """For a queued kernel: CPU scalars and indices are read now, as CUDA copies them at the call."""
    return host_view(t) if t.get_device() >= 0 else t.clone()
# LITERALINCLUDE END: RUN ASYNC


# LITERALINCLUDE START: PLAN
_PLANS_SIZE = 8192
_plan_count = 0


class _Plan:
    """How calls of one shape run: everything the general path works out from the arguments' metadata
    (outputs, kernel, scratch rule, numbers to wrap), kept under the key ``_C._describe_call`` gives.

    A call whose key has a plan costs one bridge call for its key, host views and extents, one per
    fresh output, the kernel object and the launch: no meta run, no walk over the arguments in Python.
    """

    __slots__ = ("op", "info", "index", "metas", "wrapped", "scratch", "shape", "cacheable")

    def __init__(self, op, info: OpInfo, index: int, metas: list | None, wrapped: tuple, scratch: bool,
                 shape: tuple | None = None) -> None:
        self.op, self.info, self.index, self.metas = op, info, index, metas
        self.wrapped, self.scratch = wrapped, scratch
        self.shape = shape  # for a functional kernel: the call's shape (see _CopyKernel); else None
        self.cacheable = True  # whether a later call with the same key may run this plan as it is

    def run(self, host_args, host_kwargs: dict, extents: list, args: tuple, kwargs: dict, check: bool) -> Any:
        info = self.info
        if self.wrapped:
            host_args = list(host_args)
            for i, number in self.wrapped:
                host_args[i] = number
        if self.shape is not None:  # the functional kernel, its outputs' allocations served from device memory
            outs, targets = [], []
            for i, m in enumerate(self.metas):
                out, view, where = _C._empty_like_meta(m, self.index)
                outs.append(out)
                targets.append((i, view))
                extents.append(where)
            kernel = _CopyKernel(self.op, host_args, host_kwargs, targets, len(outs), self.shape)
        elif self.metas is not None:  # a functional operator, computed by its out= overload into fresh outputs
            outs = []
            for name, m in zip(info.out_names, self.metas):
                out, host_kwargs[name], where = _C._empty_like_meta(m, self.index)
                outs.append(out)
                extents.append(where)
            kernel = _OutKernel(info, info.out_op, host_args, host_kwargs, info.out_names, self.scratch, self.op)
        else:  # an out= overload called directly: it returns its out= arguments
            outs = [info.value(args, kwargs, arg) for _, arg in info.returns]
            kernel = _OutKernel(info, self.op, host_args, host_kwargs, info.out_kwargs, self.scratch)
        launch_extents(self.index, kernel, extents=extents, name=info.name, sync=check)
        return _pack(outs)


def _run(plan: _Plan, described: list, args: tuple, kwargs: dict, check: bool) -> Any:
    """Run a plan over a call's ``[key, host args, host kwargs, extents]`` (``check``: synchronously).

    An error (out of memory, a forked child) leaves without the frames below this one, and with
    ``described`` emptied: the host views of device memory in them would fault a debugger or test
    runner that formats the frames' variables.
    """
    try:
        return plan.run(described[1], described[2], described[3], args, kwargs, check)
    except Exception as exc:  # noqa: BLE001 - re-raised below, without the frames that hold the views
        error = exc
    described.clear()
    detach_frames(error, "fallback")
    raise error


def _plan(op, info: OpInfo, args, kwargs, tensors, device: torch.device, meta, given: tuple) -> _Plan | None:
    """The plan of a call the general path has checked and inferred (``meta``), for an operator that runs
    through an out= kernel; None when an output is absent (the general path runs it)."""
    metas = [meta] if len(info.returns) == 1 else list(meta or ())
    if any(not isinstance(m, torch.Tensor) for m in metas) and (info.out_names or info.functional):
        return None
    numbers = [i for i in info.tensor_args if isinstance(info.value(*given, i), _NUMBERS)]
    wrapped = tuple((i, args[i]) for i in numbers if i < len(args))
    if info.out_names:
        plan = _Plan(op, info, device.index, metas, wrapped, _reduces(info, metas, tensors))
    elif info.functional:
        plan = _Plan(op, info, device.index, metas, wrapped, False, _call_shape(op, tensors))
    else:
        outs_given = _tensors(tuple(info.value(args, kwargs, info.positions[n]) for n in info.out_kwargs), {})
        plan = _Plan(op, info, device.index, None, wrapped, _reduces(info, outs_given, tensors))
        for (_, arg), m in zip(info.returns, metas):
            real = info.value(args, kwargs, arg)
            for r, mm in ((real, m),) if isinstance(real, torch.Tensor) else zip(real, m):
                plan.cacheable &= _match(r, mm)  # a resize depends on more than the key: not remembered
    # Numbers passed for Tensor arguments: the key has their values, so their wrapped tensors are the plan's.
    if numbers and (info.numbers_by_type or numbers[-1] >= len(args)):
        plan.cacheable = False
    return plan


def _remember(info: OpInfo, key: tuple, plan: _Plan) -> None:
    global _plan_count
    if _plan_count >= _PLANS_SIZE:
        for other in _infos.values():
            if other.plans:
                other.plans.clear()
        _plan_count = 0
    info.plans[key] = plan
    _plan_count += 1
# LITERALINCLUDE END: PLAN


def _reduces(info: OpInfo, outputs: list, tensors: list) -> bool:
    """Whether a loss reduces (every output smaller than an input): its CPU out= kernel uses ``out``
    as scratch space for the unreduced values and so resizes it. Other reductions (``sum``, a matrix
    product with a small result) write ``out`` directly; one that does not is learned at its first run."""
    if not info.loss:
        return False
    biggest = max((t.numel() for t in tensors), default=0)
    return bool(outputs) and all(o.numel() < biggest for o in outputs)


class _OutKernel:
    """A queued ``out=`` kernel. A class, not a closure: a closure is a function and one cell per
    captured name, all of which the cyclic garbage collector walks while the launch is queued (with a
    thousand launches queued, collections doubled the cost of a launch)."""

    __slots__ = ("info", "out_op", "cpu_args", "cpu_kwargs", "names", "scratch", "functional")

    def __init__(self, info: OpInfo, out_op, cpu_args, cpu_kwargs, names, scratch: bool, functional=None) -> None:
        self.info, self.out_op, self.cpu_args, self.cpu_kwargs = info, out_op, cpu_args, cpu_kwargs
        self.names, self.scratch, self.functional = names, scratch, functional

    def __call__(self) -> None:
        info, out_op, cpu_args, cpu_kwargs, names = self.info, self.out_op, self.cpu_args, self.cpu_kwargs, self.names
        if not (self.scratch or info.scratch_out):
            views = [v for v in (cpu_kwargs[n] for n in names) if isinstance(v, torch.Tensor)]
            shapes = [(v.shape, v.stride()) for v in views]
            try:
                out_op(*cpu_args, **cpu_kwargs)
                for view, (shape, stride) in zip(views, shapes):
                    if view.shape != shape:  # shrunk in place: the CPU's output shape is not the meta kernel's
                        raise _CpuDisagrees(f"{info.name}: the CPU kernel resized an output from "
                                            f"{tuple(shape)} to {tuple(view.shape)}")
                    if view.stride() != stride:
                        _restride_back(view, stride)
                return
            except RuntimeError as exc:
                if "not resizable" not in str(exc):
                    raise
                info.scratch_out = True
        # Some CPU out= kernels use ``out`` as scratch space and resize it (losses with a reduction
        # do). A host view of device memory cannot grow: compute into host tensors (through the
        # functional operator when there is one), then copy the results in.
        inputs = {k: v for k, v in cpu_kwargs.items() if k not in names}
        if self.functional is not None:
            result = self.functional(*cpu_args, **inputs)
            results = [result] if len(names) == 1 else list(result)
        else:
            host = {n: _map(cpu_kwargs[n], lambda t: torch.empty(0, dtype=t.dtype)) for n in names}
            out_op(*cpu_args, **inputs, **host)
            results = [host[n] for n in names]
        pairs = []
        for n, result in zip(names, results):
            views = cpu_kwargs[n]
            pairs.extend(zip(*(([views], [result]) if isinstance(views, torch.Tensor) else (views, result))))
        for view, r in pairs:
            _check_output(info.name, view, r)
        for view, r in pairs:
            view.copy_(r)


def _restride_back(view: torch.Tensor, stride: tuple) -> None:
    """Undo an out= kernel's restriding of a host view (``max_unpool2d`` lays a channels-last result out
    channels-last): the device tensor keeps the strides it was given, so the values are moved to them."""
    values = view.clone()
    view.as_strided_(view.size(), stride)
    view.copy_(values)


class _CopyKernel:
    """A queued kernel that runs the operator itself (in place, or functional with its results copied
    into the outputs' host views); a class for the same reason as :class:`_OutKernel`."""

    __slots__ = ("op", "cpu_args", "cpu_kwargs", "targets", "nreturns", "shape")

    def __init__(self, op, cpu_args, cpu_kwargs, targets, nreturns: int, shape: tuple) -> None:
        self.op, self.cpu_args, self.cpu_kwargs = op, cpu_args, cpu_kwargs
        self.targets, self.nreturns, self.shape = targets, nreturns, shape  # shape: the call's, for _SKIPS

    # LITERALINCLUDE START: COPY KERNEL
    def __call__(self) -> None:
        # The CPU kernel's allocations of the outputs' sizes come from the outputs' device memory
        # (csrc/cpu_outputs.cpp): a result that lands there in the output's layout is computed in place.
        serve = self.op not in _KEEPS_BUFFERS
        outputs = [(i, view) for i, view in self.targets if isinstance(view, torch.Tensor)] if serve else []
        views = [view for _, view in outputs]
        _C._set_cpu_output_targets(views, [_SKIPS.get((self.shape, i), 0) for i, _ in outputs])
        try:
            result = self.op(*self.cpu_args, **self.cpu_kwargs)
        finally:
            seen = _C._set_cpu_output_targets([], [])
        if self.nreturns:  # some return nothing (e.g. _amp_foreach_non_finite_check_and_unscale_)
            results = [result] if self.nreturns == 1 else list(result)
            self._learn(outputs, results, seen)
            self._copy_results(results, {v.data_ptr() for v in views})
            del results
        del result
        if serve and _C._cpu_outputs_held():
            _KEEPS_BUFFERS.add(self.op)
            raise RuntimeError(
                f"the CPU kernel of {self.op} kept memory it allocated during its call; its outputs are no "
                "longer computed in device memory (report this: that memory belongs to openreg tensors)"
            )

    def _learn(self, outputs: list, results: list, seen: list) -> None:
        """Note which allocation of its size each result was: a temporary of the same size allocated
        first (a convolution copies an input of the output's size) takes the buffer, and next time that
        many allocations of the size are let through before one is served."""
        sizes = [view.numel() * view.element_size() for _, view in outputs]
        for ((i, _), allocations, size) in zip(outputs, seen, sizes):
            result = results[i]
            if isinstance(result, torch.Tensor) and allocations and sizes.count(size) == 1:
                ptr = _storage_ptr(result)
                if ptr in allocations:
                    if len(_SKIPS) >= _META_CACHE_SIZE:
                        _SKIPS.clear()
                    _SKIPS[(self.shape, i)] = allocations.index(ptr)

    def _copy_results(self, results: list, served: set[int]) -> None:
        copies = []
        for i, view in self.targets:
            if view is None:
                continue
            pairs = [(view, results[i])] if isinstance(view, torch.Tensor) else zip(view, results[i])
            for v, r in pairs:
                _check_output(str(self.op), v, r)
                if not _in_place(r, v):
                    # Moved out of memory served for another output (or held in another layout) before any copy.
                    copies.append((v, r.clone() if _storage_ptr(r) in served else r))
        for v, r in copies:
            v.copy_(r)
    # LITERALINCLUDE END: COPY KERNEL


def _storage_ptr(t: torch.Tensor) -> int | None:
    """Where a result's storage starts; None for a tensor without one (a ``ZeroTensor``)."""
    return None if t._is_zerotensor() else t.untyped_storage().data_ptr()


_KEEPS_BUFFERS: set = set()  # operators whose CPU kernel held on to memory served to it (see _CopyKernel)
# (call shape, output) -> allocations of the output's size its CPU kernel makes before the output
_SKIPS: dict[tuple, int] = {}


def _in_place(result: torch.Tensor, view: torch.Tensor) -> bool:
    """Whether a CPU kernel's result already is the output (same memory, layout, type and lazy bits:
    ``dot`` of two conjugates returns the conjugate of what it computed)."""
    return (result.data_ptr() == view.data_ptr() and result.dtype == view.dtype and result.shape == view.shape
            and result.stride() == view.stride() and result.is_conj() == view.is_conj()
            and result.is_neg() == view.is_neg())


# LITERALINCLUDE START: SYNC PATH
def _run_sync(op, info: OpInfo, args, kwargs, tensors, device: torch.device) -> Any:
    """Wait for the stream, run the CPU kernel now, and bring new outputs to the device."""
    if sync_debug.mode:  # reported only where CUDA would wait too (not for what the simulator needs)
        with sync_debug.reported(info.name if info.host_waits else None):
            return _run_sync_now(op, info, args, kwargs, tensors, device)
    return _run_sync_now(op, info, args, kwargs, tensors, device)


def _run_sync_now(op, info: OpInfo, args, kwargs, tensors, device: torch.device) -> Any:
    cpu_args, cpu_kwargs = _swap(args, kwargs, info, device, host_view_or_self, "cpu")
    outs_by_name = {}
    for name in list(cpu_kwargs):
        index = info.positions.get(name)
        a = info.arguments[index] if index is not None else None
        if a is not None and a.kwarg_only and a.alias_info is not None and a.alias_info.is_write:
            outs_by_name[name] = kwargs[name]  # out=: let the CPU kernel size a host tensor, copy after
            cpu_kwargs[name] = _map(kwargs[name], lambda t: torch.empty(0, dtype=t.dtype))
    try:
        result = run_sync(device.index, lambda: op(*cpu_args, **cpu_kwargs), tensors=tensors, name=info.name)
    except BaseException:
        cpu_args = cpu_kwargs = None  # this frame stays in the traceback: it must not show the host views
        raise
    if not info.returns:
        return None
    results = [result] if len(info.returns) == 1 else list(result)
    final = []
    for (kind, arg), r in zip(info.returns, results):
        if kind == FRESH:
            final.append(_map(r, lambda t: t.to(device)))
        elif kind == VIEW:
            base = info.value(args, kwargs, arg)
            final.append(_map(r, lambda t, base=base: _host_alias_to_device(t, base, device)))
        else:
            real = info.value(args, kwargs, arg)
            name = info.arguments[arg].name
            if name in outs_by_name:
                if real.size() != r.size():  # as resize_output: an out= of the right shape keeps its strides
                    _match(real, r)
                real.copy_(r)
            final.append(real)
    return _pack(final)
# LITERALINCLUDE END: SYNC PATH


def _host_alias_to_device(t: torch.Tensor, base: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU view the kernel returned, re-expressed as a view of the openreg ``base``."""
    start = _C._storage_base(base)
    offset = (t.data_ptr() - start) // t.element_size()
    view = torch.empty(0, dtype=t.dtype, device=device)
    return view.set_(base.untyped_storage(), offset, t.size(), t.stride())


# LITERALINCLUDE START: OVERRIDEABLE
def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch sends convolutions of non-CPU/CUDA backends here; compute them as ``aten::convolution``."""
    conv = torch.ops.aten.convolution.default
    return fallback(conv, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def convolution_backward_overrideable(
    grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    """The backward of :func:`convolution_overrideable`, as ``aten::convolution_backward``."""
    bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]
    return fallback(
        torch.ops.aten.convolution_backward.default, grad_output, input, weight, bias_sizes, stride, padding,
        dilation, transposed, output_padding, groups, output_mask,
    )
# LITERALINCLUDE END: OVERRIDEABLE


def _aten_op(packet: str, overload: str) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _route_directly(lib: torch.library.Library, wanted: Callable[[str, str, str], bool]) -> int:
    """Register the fallback as the PrivateUse1 kernel of every ``aten`` overload without one that
    ``wanted(name, packet, overload)`` accepts; returns the count."""
    count = 0
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        packet, _, overload = name[len("aten::"):].partition(".")
        if wanted(name, packet, overload):
            lib.impl(name[len("aten::"):], functools.partial(fallback, _aten_op(packet, overload)), "PrivateUse1")
            count += 1
    return count


# LITERALINCLUDE START: DIRECT STRUCTURED
def register_structured(lib: torch.library.Library) -> int:
    """Send structured operators' functional forms straight to the fallback.

    Without a PrivateUse1 kernel, ``add.Tensor`` resolves to PyTorch's
    CompositeExplicitAutogradNonFunctional wrapper, which allocates an empty output, resizes it and
    calls ``add.out`` through the boxed fallback. Registering the fallback as the per-operator kernel
    of each such form skips the wrapper (and the boxed call, ~9 us, for a per-operator one, ~1.4 us);
    the fallback then allocates the output itself from the inferred metadata. Returns the count.
    In-place forms keep the wrapper (its out= meta run checks self-overlap at the call), and so does
    ``new_empty_strided`` (its wrapper puts the result on the ``device`` asked for).
    """
    return _route_directly(lib, lambda name, packet, overload: (
        torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutogradNonFunctional")
        and not packet.endswith("_")
        and not any(a.name == "device" for a in _aten_op(packet, overload)._schema.arguments)
    ))
# LITERALINCLUDE END: DIRECT STRUCTURED


# LITERALINCLUDE START: DIRECT FOREACH
FOREACH_KEEP_LOOP = {"_foreach_copy", "_foreach_copy_"}  # their lists may mix CPU and openreg tensors


def register_foreach(lib: torch.library.Library) -> int:
    """Send ``_foreach_*`` operators straight to the fallback: one launch for the whole list.

    Without a PrivateUse1 kernel they resolve to PyTorch's CompositeExplicitAutograd loop, which
    calls the single-tensor operator once per tensor: an Adam step over 24 parameters was some 150
    launches. The fallback runs the CPU's ``_foreach_*`` kernel over host views of every tensor in
    the lists in one kernel instead. Returns the count.
    """
    return _route_directly(
        lib, lambda name, packet, overload: packet.startswith("_foreach_") and packet not in FOREACH_KEEP_LOOP
    )
# LITERALINCLUDE END: DIRECT FOREACH
