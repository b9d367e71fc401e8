"""A primitive with its layout changes, cached per shape.

oneDNN's fast convolutions work on blocked layouts (channels in blocks of
8 or 16, innermost) that it picks itself when given ``format_tag_any``;
built on plain NCHW it falls back to slower GEMM-based code for 3x3. A
:class:`Plan` therefore runs: reorder each input from the NumPy array's
layout into the primitive's, execute, reorder each output back into a
fresh C-ordered NumPy array. A reorder is skipped where the layouts
already agree. Blocked buffers never leave the plan: NumPy code only
sees plain arrays.

Plans are cached by a key the kernels build from everything that fixes
the primitive (shapes, strides, hyper-parameters) plus OpenMP's thread
count, since a primitive keeps the count it was created with. A shape
oneDNN refuses is cached as None, so that it is refused once.
"""
import numpy

from minichain.kernels.onednn import _dnnl

_cache = {}


def cached(key, build):
    """The plan for ``key``, built by ``build()`` on first use; None when
    oneDNN has no implementation for it (status unimplemented or invalid
    arguments: the kernel then declines)."""
    key = key + (_dnnl.threads(),)
    try:
        return _cache[key]
    except KeyError:
        pass
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
            C-ordered float32 arrays.
    Other arguments (bias, statistics, workspace) are passed as they are
    and must be in the layout the primitive was built with.
    """

    def __init__(self, primitive, inputs, outputs):
        self.primitive = primitive
        self.to_primitive = {}
        for arg, user in inputs.items():
            inner = primitive.md(arg)
            if not _dnnl.same(user, inner):
                self.to_primitive[arg] = _dnnl.reorder(user, inner)
        self.outputs = {}
        for arg, shape in outputs.items():
            inner = primitive.md(arg)
            user = _dnnl.plain(shape)
            back = None if _dnnl.same(user, inner) else _dnnl.reorder(
                inner, user)
            self.outputs[arg] = (shape, back)

    def md(self, arg):
        return self.primitive.md(arg)

    def __call__(self, arrays):
        """Execute on ``{DNNL_ARG_*: array}``; return ``{arg: array}`` for
        the outputs named at construction."""
        args = dict(arrays)
        for arg, r in self.to_primitive.items():
            inner = _dnnl.buffer(r.md(_dnnl.ARG_DST))
            r({_dnnl.ARG_SRC: arrays[arg], _dnnl.ARG_DST: inner})
            args[arg] = inner
        results = {}
        for arg, (shape, back) in self.outputs.items():
            results[arg] = numpy.empty(shape, numpy.float32)
            args[arg] = (results[arg] if back is None else
                         _dnnl.buffer(self.md(arg)))
        self.primitive(args)
        for arg, (shape, back) in self.outputs.items():
            if back is not None:
                back({_dnnl.ARG_SRC: args[arg], _dnnl.ARG_DST: results[arg]})
        return results
