"""Copying and moving the arrays of a link tree across host and devices.

What ``Link.copyparams``, ``Link.serialize``, ``Link.to_cpu`` and
``Link.to_gpu`` do to arrays, kept apart from link.py, which is about the
tree of layers itself (registration, enumeration in sorted order). The
functions take links as they come and import nothing of link.py.
"""
import numpy

from minichain import backend


def copy_into(dst, src, where):
    """Copy array ``src`` into ``dst`` in place, across host and devices;
    ``where`` names the caller in the error."""
    if dst.shape != src.shape:
        raise ValueError('{}: shape {} does not match the destination shape '
                         '{}'.format(where, src.shape, dst.shape))
    dev = backend.get_device_id(dst)
    if dev < 0:
        numpy.copyto(dst, backend.to_cpu(src), casting='unsafe')
    else:
        if backend.get_device_id(src) != dev:
            src = backend.to_gpu(backend.to_cpu(src), dev)
        with backend.cuda_device(dev):
            dst[...] = src


def copy_params(dst, src, copy_persistent):
    """The body of ``dst.copyparams(src, copy_persistent)``: values matched
    by path, parameters first, then persistents (see Link.copyparams)."""
    params = dict(src.namedparams())
    where = '{}.copyparams'.format(type(dst).__name__)
    for path, param in dst.namedparams():
        if path not in params:
            raise ValueError('{}: {} has no parameter {}'.format(
                where, type(src).__name__, path))
        s = params[path]
        if not s.is_initialized:
            if param.is_initialized:
                raise ValueError('{}: source parameter {} is not '
                                 'initialized'.format(where, path))
            continue
        if not param.is_initialized:
            param.initialize(s.shape)
        copy_into(param.array, s.array, '{} ({})'.format(where, path))
    if not copy_persistent:
        return
    others = dict(src.namedlinks())
    for path, link in dst.namedlinks():
        for name in link._persistent:
            full = ('' if path == '/' else path) + '/' + name
            if path not in others or name not in others[path]._persistent:
                raise ValueError('{}: {} has no persistent {}'.format(
                    where, type(src).__name__, full))
            value = getattr(others[path], name)
            mine = getattr(link, name)
            if backend.is_array(mine):
                copy_into(mine, value, '{} ({})'.format(where, full))
            else:
                setattr(link, name, value)


def move(root, device_id):
    """Move the parameters, gradients and array persistents of every link
    under ``root`` to the host (``device_id < 0``) or to GPU ``device_id``,
    in place."""
    for link in root.links():
        for _, param in link._own_params():
            if device_id < 0:
                param.to_cpu()
            else:
                param.to_gpu(device_id)
        for name in link._persistent:
            value = getattr(link, name)
            if backend.is_array(value):
                setattr(link, name, backend.to_cpu(value) if device_id < 0
                        else backend.to_gpu(value, device_id))
        link._device_id = device_id
