"""A reference executor for Core ML packages on any OS: runs a saved .mlpackage's MIL functions op by op in numpy.

A verification tool, not a runtime for users (slow: Python per op, one BLAS call per row of every matmul). It reads
the package back from disk (coremltools' milproto loader: the program exactly as saved, compressed weights
included) and evaluates each op:
  * matmul / linear: every output element summed in float32 over k in order (`_rows_matmul`), then rounded to the
    op's dtype, so an element never depends on the shapes around it: row t of a pass is the same whatever T is (a
    reference of the batch invariance the Mac's kernels are measured for by the host check, not a claim about them);
  * softmax / reduce_*: float32, each reduced vector summed the same way whatever the shape around it;
  * every other op through its own `value_inference` (coremltools' compile-time evaluator: the op's documented
    semantics), given the input values;
  * const and constexpr ops (compressed weights: dequantized by their value_inference) are evaluated once per
    function;
  * states (iOS 18 MLState): a function's state inputs are looked up in a dict shared across calls and functions
    (`make_state`, what Core ML's `make_state()` is on a Mac): `read_state` returns the stored fp16 tensor,
    `coreml_update_state` replaces it.
fp16 programs run their elementwise ops in numpy float16 (correctly rounded per op); where the Mac's kernels round
differently (fused ops, fp16 accumulation on the ANE) results differ within the bounds the tests document.

    fn = load_functions(Path("B/coreml/program.mlpackage"))["target_1"]
    outputs = fn({"input_ids": ids, ...})  # dict of numpy arrays by feature name
    state = make_state(functions.values()); fn(feeds, state=state)  # a package with states
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_spec.errors import BundleError
from edge_spec.runtimes.coreml_tools import import_coremltools

_NP_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
              "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16}


def _np_dtype(mil_dtype) -> type:
    from coremltools.converters.mil.mil import types

    return _NP_DTYPES.get(types.builtin_to_string(mil_dtype), np.float32)


class _Value:
    """Stands in for a Var's symbolic value while an op's value_inference runs."""

    __slots__ = ("val",)

    def __init__(self, val):
        self.val = val


def _input_vars(op):
    for value in op.inputs.values():
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


CHUNK = 1 << 24  # elements of the product tensor per chunk of rows


def _rows_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [..., M, K] @ w [..., K, N] (broadcast over leading dims), every output element summed in float32 in k order.

    A reduction over a middle axis adds the K products one after another for each (m, n), so an element never
    depends on M or N (a BLAS call would pick kernels, blockings and SIMD tails by shape: measured here, a score's
    last bits changed with the number of columns)."""
    x32, w32 = x.astype(np.float32, copy=False), w.astype(np.float32, copy=False)
    m, k, n = x32.shape[-2], x32.shape[-1], w32.shape[-1]
    lead = np.broadcast_shapes(x32.shape[:-2], w32.shape[:-2])
    out = np.empty(lead + (m, n), dtype=np.float32)
    step = max(1, CHUNK // max(1, k * n * int(np.prod(lead, dtype=np.int64))))
    for start in range(0, m, step):
        rows = x32[..., start:start + step, :, None]  # [..., r, K, 1]
        out[..., start:start + step, :] = (rows * w32[..., None, :, :]).sum(axis=-2)
    return out


def _linear(op, get):
    x, w = get("x"), get("weight")  # weight [N, K]
    out = _rows_matmul(x, w.T)
    bias = get("bias")
    return out + bias.astype(np.float32) if bias is not None else out


def _matmul(op, get):
    x, y = get("x"), get("y")
    if get("transpose_x"):
        x = np.swapaxes(x, -1, -2)
    if get("transpose_y"):
        y = np.swapaxes(y, -1, -2)
    if x.ndim == 1 or y.ndim == 1:
        return np.matmul(x.astype(np.float32), y.astype(np.float32))
    return _rows_matmul(x, y)


def _softmax(op, get):
    x = get("x").astype(np.float32)
    axis = int(get("axis"))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _reduce(fn):
    """reduce_* over `axes` (all when absent), float32 for floats, `keep_dims` as MIL defines it (default False)."""
    def run(op, get):
        x = get("x")
        x = x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x
        axes = get("axes")
        axes = tuple(range(x.ndim)) if axes is None else tuple(int(a) for a in np.atleast_1d(axes))
        return fn(x, axis=axes, keepdims=bool(get("keep_dims")))
    return run


def _silu(op, get):
    x = get("x").astype(np.float32)
    return x / (1.0 + np.exp(-x))


def _gelu(op, get):
    x = get("x").astype(np.float32)
    mode = get("mode") or "EXACT"
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x ** 3)))
    if mode == "SIGMOID_APPROXIMATION":
        return x / (1.0 + np.exp(-1.702 * x))
    from scipy.special import erf  # noqa: PLC0415  (the exact GELU's erf)

    return 0.5 * x * (1.0 + erf(x / np.float32(np.sqrt(2.0))))


def _unary(fn):
    return lambda op, get: fn(get("x").astype(np.float32))


class _StateRef:
    """A state input's value in a function's environment: where `read_state` / `coreml_update_state` go."""

    __slots__ = ("store", "name")

    def __init__(self, store: dict, name: str):
        self.store, self.name = store, name


def _read_state(op, get):
    ref = get("input")
    return ref.store[ref.name].copy()


def _update_state(op, get):
    ref, value = get("state"), get("value")
    if value.shape != ref.store[ref.name].shape:
        raise ValueError(f"state {ref.name!r} is {ref.store[ref.name].shape}, op {op.name} writes {value.shape}")
    ref.store[ref.name] = value.astype(ref.store[ref.name].dtype)
    return value


# ops without a value_inference in coremltools 9.0, and the ones whose numerics the executor fixes
_EXPLICIT = {"linear": _linear, "matmul": _matmul, "softmax": _softmax, "reduce_mean": _reduce(np.mean),
             "reduce_sum": _reduce(np.sum), "reduce_max": _reduce(np.max), "reduce_min": _reduce(np.min), "silu": _silu,
             "gelu": _gelu, "sigmoid": _unary(lambda x: 1.0 / (1.0 + np.exp(-x))), "tanh": _unary(np.tanh),
             "rsqrt": lambda op, get: 1.0 / np.sqrt(get("x").astype(np.float32) + np.float32(get("epsilon") or 0.0)),
             "relu": _unary(lambda x: np.maximum(x, 0)), "read_state": _read_state,
             "coreml_update_state": _update_state}


class MilFunction:
    """One function of a MIL program as a callable: dict of named numpy inputs -> dict of named outputs."""

    def __init__(self, name: str, function):
        from coremltools.converters.mil.mil import types

        self.name, self.function = name, function
        self.states = {k: (tuple(v.shape), _np_dtype(v.sym_type.wrapped_type().get_primitive()))
                       for k, v in function.inputs.items() if types.is_state(v.sym_type)}
        self.inputs = {k: (tuple(v.shape), _np_dtype(v.dtype)) for k, v in function.inputs.items() if k not in self.states}
        self.outputs = [v.name for v in function.outputs]
        self.constants: dict[str, np.ndarray] = {}
        self.ops = []
        for op in function.operations:
            if op.op_type == "const" or op.op_type.startswith("constexpr_"):
                for var, value in zip(op.outputs, self._values(op)):
                    self.constants[var.name] = value
            else:
                self.ops.append(op)

    def _values(self, op) -> list:
        if op.op_type == "const":
            return [op.outputs[0].val]
        infer = getattr(op, "materialized_val_inference", None)  # iOS 18 compression ops (dequantize their weights)
        result = infer() if infer is not None else op.value_inference()
        return list(result) if len(op.outputs) > 1 else [result]

    def __call__(self, feeds: dict[str, np.ndarray], state: dict | None = None) -> dict[str, np.ndarray]:
        """Run the function on `feeds`; `state` (from `make_state`) is read and updated in place."""
        env = dict(self.constants)
        for name, (shape, _) in self.states.items():
            if state is None or name not in state:
                raise KeyError(f"function {self.name} reads state {name!r}: pass state=make_state(functions)")
            if state[name].shape != shape:
                raise ValueError(f"state {name!r} is {state[name].shape}, function {self.name} declares {shape}")
            env[name] = _StateRef(state, name)
        for name, (shape, dtype) in self.inputs.items():
            if name not in feeds:
                raise KeyError(f"function {self.name} needs input {name!r}")
            value = np.asarray(feeds[name])
            if value.shape != shape:
                raise ValueError(f"function {self.name} input {name!r}: shape {value.shape}, the function takes {shape}")
            env[name] = value.astype(dtype, copy=False)
        with np.errstate(over="ignore"):  # fp16 programs cast the masks' -1e30 to -inf, as Core ML does
            for op in self.ops:
                self._run(op, env)
        return {name: np.asarray(env[name]) for name in self.outputs}

    def _run(self, op, env: dict) -> None:
        explicit = _EXPLICIT.get(op.op_type)
        if explicit is not None:
            def get(param):
                var = op.inputs.get(param)
                if var is None:
                    return None
                return env[var.name] if var.name in env else var.val

            results = [explicit(op, get)]
        else:
            saved = []
            for var in _input_vars(op):
                if var.name in env:
                    saved.append((var, var._sym_val))
                    var._sym_val = _Value(env[var.name])
            try:
                result = op.value_inference()
            except Exception as err:
                raise NotImplementedError(f"the MIL executor cannot evaluate op {op.name} ({op.op_type}): {err}") from err
            finally:
                for var, old in saved:
                    var._sym_val = old
            results = list(result) if len(op.outputs) > 1 else [result]
        for var, value in zip(op.outputs, results):
            env[var.name] = np.asarray(value).astype(_np_dtype(var.dtype), copy=False)


def make_state(functions) -> dict[str, np.ndarray]:
    """Zeroed states for the given functions (name -> array; functions that share a state must agree on it)."""
    state = {}
    for fn in functions:
        for name, (shape, dtype) in fn.states.items():
            if name in state and state[name].shape != shape:
                raise BundleError(f"state {name!r} is {state[name].shape} in one function and {shape} in {fn.name}",
                                  "re-export the bundle: edge-spec export --format coreml --kv state --out DIR")
            state.setdefault(name, np.zeros(shape, dtype=dtype))
    return state


def load_functions(package: Path) -> dict[str, MilFunction]:
    """Every function of a saved .mlpackage (a multifunction package has several), read back from disk."""
    ct = import_coremltools()
    from coremltools.converters.mil.frontend.milproto.load import load

    package = Path(package)
    if not (package / "Manifest.json").is_file():
        raise BundleError(f"{package} is not an .mlpackage (no Manifest.json)",
                          "re-export the bundle: edge-spec export --format coreml --out DIR")
    try:
        spec = ct.utils.load_spec(str(package))
        weights = package / "Data" / "com.apple.CoreML" / "weights"
        program = load(spec, spec.specificationVersion, file_weights_dir=str(weights))
    except Exception as err:
        raise BundleError(f"{package}: coremltools cannot read this package ({str(err).strip()[:200]})",
                          "re-export the bundle: edge-spec export --format coreml --out DIR") from err
    return {name: MilFunction(name, fn) for name, fn in program.functions.items()}
