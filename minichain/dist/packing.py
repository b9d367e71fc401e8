"""Packing gradients into one contiguous buffer and back.

The buffer is allocated once per (model, layout) and reused at every step;
its segments follow the ``namedparams()`` order, so the layout is the same on
every rank. After the allreduce each ``param.grad`` becomes a view of its
segment (no unpack copy) when the dtypes agree; gradient arrays themselves
are never written (the engine may share one between parameters, or hand out
a read-only broadcast view).
"""
import bisect
import contextlib
import weakref

import numpy

from minichain import backend

# Ranges of packed host gradients up to this size are packed in one
# concatenate (see Packer._pack_small).
SMALL_BYTES = 1 << 20


class BufferCache:
    """Buffers keyed by model (held weakly) and a tag, reused while the
    requested array module, dtype and length stay the same."""

    def __init__(self):
        self._by_model = weakref.WeakKeyDictionary()

    def get(self, model, tag, like, dtype, n):
        """A 1-d array of ``n`` ``dtype`` elements (stale contents) on the
        device of the array ``like`` (None: on the host)."""
        slots = self._by_model.setdefault(model, {})
        buf = slots.get(tag)
        device = -1 if like is None else backend.get_device_id(like)
        if (buf is None or backend.get_device_id(buf) != device
                or buf.dtype != dtype or buf.size != n):
            if device < 0:
                buf = numpy.empty(n, dtype=dtype)
            else:
                with backend.cuda_device(device):
                    buf = backend.get_array_module(like).empty(n, dtype)
            slots[tag] = buf
        return buf


def grad_dtype(entries, override=None):
    """The buffer dtype: ``override``, else the widest parameter dtype."""
    if override is not None:
        return numpy.dtype(override)
    return numpy.result_type(*[p.array.dtype for _, p, _ in entries])


class Packer:
    """Packs ``[(path, param, grad_or_None)]`` into a flat buffer.

    ``offsets[i]`` is where parameter ``i`` starts; ``total`` the length.
    ``pack`` may fill any element range, so that a caller can pipeline:
    pack a chunk while it is hot in cache, reduce it, go on.
    """

    def __init__(self, entries):
        self.entries = entries
        self.offsets = [0]
        for _, p, _ in entries:
            self.offsets.append(self.offsets[-1] + p.array.size)
        self.total = self.offsets[-1]
        self._flat = None

    def pack(self, buf, scale=None, lo=0, hi=None):
        """Write elements ``[lo, hi)`` of the gradients (times ``scale``)
        into ``buf[lo:hi]``; a None gradient writes zeros. A CuPy ``buf``
        is written on its own device."""
        with _device_of(buf):
            self._pack(buf, scale, lo, hi)

    def _pack(self, buf, scale, lo, hi):
        hi = self.total if hi is None else hi
        xp = backend.get_array_module(buf)
        if self._flat is None:  # a copy only for a non-contiguous gradient
            self._flat = [None if g is None else g.reshape(-1)
                          for _, _, g in self.entries]
        i = bisect.bisect_right(self.offsets, lo) - 1
        if self._pack_small(buf, scale, lo, hi, i):
            return
        while i < len(self.entries) and self.offsets[i] < hi:
            start = self.offsets[i]
            a, b = max(lo, start), min(hi, self.offsets[i + 1])
            seg, src = buf[a:b], self._flat[i]
            if src is None:
                seg.fill(0)
            else:
                src = src[a - start:b - start]
                if scale is None:
                    seg[...] = src
                elif src.dtype == seg.dtype:
                    xp.multiply(src, scale, out=seg)
                else:  # a transfer dtype: scale in the gradient's precision
                    seg[...] = src * scale
            i += 1

    def _pack_small(self, buf, scale, lo, hi, i):
        """A host range of at most SMALL_BYTES: one concatenate of its
        segments, then one multiply, instead of a multiply per segment
        (the same products, so the same bits). Over many small gradients
        the per-call cost of NumPy dominates (2 us a segment); in a large
        range the second pass over the buffer would cost more than it
        saves. False when it does not apply (CuPy, a None gradient, a
        transfer dtype)."""
        if ((hi - lo) * buf.itemsize > SMALL_BYTES
                or backend.get_device_id(buf) >= 0):
            return False
        parts, k = [], i
        while k < len(self.entries) and self.offsets[k] < hi:
            src, start = self._flat[k], self.offsets[k]
            if src is None or src.dtype != buf.dtype:
                return False
            parts.append(src[max(lo, start) - start:
                             min(hi, self.offsets[k + 1]) - start])
            k += 1
        seg = buf[lo:hi]
        numpy.concatenate(parts, out=seg)
        if scale is not None:
            numpy.multiply(seg, scale, out=seg)
        return True

    def unpack(self, buf):
        """Set each ``param.grad`` from its segment of ``buf``: a view when
        dtype and device agree, else a converted copy."""
        with _device_of(buf):
            self._unpack(buf)

    def _unpack(self, buf):
        here = backend.get_device_id(buf)
        for (_, p, _), o in zip(self.entries, self.offsets):
            a = p.array  # its attributes directly: this runs every step
            seg = buf[o:o + a.size].reshape(a.shape)
            if seg.dtype != a.dtype:
                seg = seg.astype(a.dtype)
            if here >= 0 or type(a) is not numpy.ndarray:
                device = backend.get_device_id(a)
                if device != here:
                    seg = (backend.to_cpu(seg) if device < 0
                           else backend.to_gpu(seg, device))
            p.grad = seg


def _device_of(buf):
    """The CUDA device of a CuPy ``buf`` made current; nothing for NumPy."""
    device = backend.get_device_id(buf)
    return contextlib.nullcontext() if device < 0 else backend.cuda_device(
        device)


def param_layout(named_params):
    """``[(path, shape, dtype)]`` of ``(path, Parameter)`` pairs, the same
    on every rank for the same model (the dtype object itself: cheaper to
    read than its name, and shown as one); an uninitialized parameter has
    shape and dtype None."""
    return [(name, None, None) if p.array is None
            else (name, p.array.shape, p.array.dtype)
            for name, p in named_params]
