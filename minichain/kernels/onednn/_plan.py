"""A primitive with its layout changes, cached per shape.

oneDNN's fast convolutions work on blocked layouts (channels in blocks of
8 or 16, innermost) that it picks itself when given ``format_tag_any``;
built on plain NCHW it falls back to slower GEMM-based code for 3x3. A
:class:`Plan` therefore runs: reorder each input from the NumPy array's
layout into the primitive's, execute, reorder each output back into a
fresh NumPy array. A reorder is skipped where the layouts already agree.
Blocked buffers never leave the plan: NumPy code only sees arrays it can
index.

The activations the kernels return are *channels-last*: an (N, C, H, W)
array over NHWC memory, seen through a transpose (``_dnnl.
empty_channels_last``; PyTorch's ``channels_last``), not a new array
type. Why: oneDNN's batch normalization has fast code for NHWC and
blocked layouts only (on NCHW a generic loop), and its convolutions run
NHWC directly (``brgconv``), so a conv -> batch norm -> conv chain on
NHWC arrays needs no reorder at all, where NCHW arrays paid one in and
one out of every primitive. NumPy code reads the arrays as NCHW through
their strides, and its elementwise ops keep the layout (a ufunc's output
follows its inputs' memory order).

A convolution's weights can keep their reordered copy from one call to
the next while the parameter does not change (``CACHE_WEIGHTS``, off):
the copy is keyed on the array's identity and its data pointer, and
valid while ``kernels.parameters_version()`` has not moved, which every
optimizer update moves. Off, because it saves nothing in training: the
forward reads the weights in one blocked layout (ABcd16b16a at batch 32)
and the backward data in another (ABcd16a16b), so each layout is made
once per update either way, and the copies would cost the weights' size
twice over in memory; over many forward passes between two updates (an
evaluation) it could pay, and measured nothing either: time off / on
0.95x (0.69-1.03) for a training step and 0.91x (0.77-1.39) for an
evaluation's forward at batch 200, ResNet-50 at 32 x 28, 7 interleaved
pairs each (bench/onednn_weight_cache.py, 2026-12-02, load average 10). Writes into parameters other than
an optimizer's update (a load, a broadcast) would have to call
``kernels.parameters_changed()`` for it to be safe.

Plans are cached by a key the kernels build from everything that fixes
the primitive (shapes, strides, hyper-parameters) plus OpenMP's thread
count, since a primitive keeps the count it was created with. A shape
oneDNN refuses is cached as None, so that it is refused once. Where a key
also holds a scalar that can change every step (MomentumSGD's momentum,
which oneDNN 3.2 takes at creation only), the kernel names a *slot* (the
key without the scalar): a slot keeps the plan of its latest key only.
"""
import weakref

import numpy

from minichain import kernels
from minichain.kernels.onednn import _dnnl

_cache = {}
_slots = {}   # slot -> the key of its plan in _cache
CACHE_WEIGHTS = False
# (id(array), data pointer, id(reorder)) -> (weak ref to the array, the
# parameters' version when reordered, the reordered copy)
_weights = {}


def cached(key, build, slot=None):
    """The plan for ``key``, built by ``build()`` on first use; None when
    oneDNN has no implementation for it (status unimplemented or invalid
    arguments: the kernel then declines). With a ``slot``, the plan
    replaces the one an earlier key of the same slot had."""
    key = key + (_dnnl.threads(),)
    try:
        return _cache[key]
    except KeyError:
        pass
    if slot is not None:
        _cache.pop(_slots.get(slot), None)
        _slots[slot] = key
    try:
        plan = build()
    except _dnnl.Error as e:
        if e.status not in (2, 3):  # invalid arguments, unimplemented
            raise
        plan = None
    _cache[key] = plan
    return plan


class Plan:
    """``primitive`` plus reorders for the arguments given by user mds.

    Args:
        primitive: a :class:`_dnnl.Primitive`.
        inputs: ``{DNNL_ARG_*: md of the NumPy array passed there}``.
        outputs: ``{DNNL_ARG_*: shape}`` of outputs returned as fresh
            arrays of ``dtype``, C-ordered unless named in
            ``channels_last``.
        weights: the input argument that holds a parameter (its reordered
            copy may be cached: ``CACHE_WEIGHTS``), or None.
        channels_last: output arguments returned over NHWC memory.
        dtype: the outputs' NumPy dtype (float32 or bfloat16), or
            ``{arg: dtype}`` (float32 where not named).
    Other arguments (bias, statistics, workspace) are passed as they are
    and must be in the layout the primitive was built with.
    """

    def __init__(self, primitive, inputs, outputs, weights=None,
                 channels_last=(), dtype=numpy.float32):
        self.primitive, self.weights = primitive, weights
        self.to_primitive = {}
        for arg, user in inputs.items():
            inner = primitive.md(arg)
            if not _dnnl.same(user, inner):
                self.to_primitive[arg] = _dnnl.reorder(user, inner)
        self.outputs = {}
        for arg, shape in outputs.items():
            inner = primitive.md(arg)
            last = arg in channels_last
            kind = numpy.dtype(dtype.get(arg, numpy.float32)
                               if isinstance(dtype, dict) else dtype)
            dt = _dnnl.dt_of(kind)
            user = (_dnnl.channels_last(shape, dt) if last else
                    _dnnl.plain(shape, dt=dt))
            back = None if _dnnl.same(user, inner) else _dnnl.reorder(
                inner, user)
            self.outputs[arg] = (shape, back, last, kind)

    def md(self, arg):
        return self.primitive.md(arg)

    def __call__(self, arrays):
        """Execute on ``{DNNL_ARG_*: array}``; return ``{arg: array}`` for
        the outputs named at construction."""
        args = dict(arrays)
        for arg, r in self.to_primitive.items():
            if CACHE_WEIGHTS and arg == self.weights:
                args[arg] = _reordered_weights(arrays[arg], r)
                continue
            inner = _dnnl.buffer(r.md(_dnnl.ARG_DST))
            r({_dnnl.ARG_SRC: arrays[arg], _dnnl.ARG_DST: inner})
            args[arg] = inner
        results = {}
        for arg, (shape, back, last, kind) in self.outputs.items():
            results[arg] = (_dnnl.empty_channels_last(shape, kind) if last
                            else numpy.empty(shape, kind))
            args[arg] = (results[arg] if back is None else
                         _dnnl.buffer(self.md(arg)))
        self.primitive(args)
        for arg, (shape, back, _, _) in self.outputs.items():
            if back is not None:
                back({_dnnl.ARG_SRC: args[arg], _dnnl.ARG_DST: results[arg]})
        return results


def _reordered_weights(array, reorder):
    """``array`` reordered by ``reorder``: the copy made earlier while the
    parameters have not changed since, else a new one (kept)."""
    key = (id(array), array.ctypes.data, id(reorder))
    version = kernels.parameters_version()
    hit = _weights.get(key)
    if hit is not None and hit[0]() is array and hit[1] == version:
        return hit[2]
    inner = _dnnl.buffer(reorder.md(_dnnl.ARG_DST))
    reorder({_dnnl.ARG_SRC: array, _dnnl.ARG_DST: inner})
    # the entry goes when the array does (its id may then be reused)
    ref = weakref.ref(array, lambda _, key=key: _weights.pop(key, None))
    _weights[key] = (ref, version, inner)
    return inner
