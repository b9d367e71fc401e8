"""Count the CUDA kernels a block of code launches, through CUPTI's
callback API (ctypes): every ``cuLaunch*`` call of the CUDA driver, which
CuPy's kernels and cuBLAS's (through the runtime) alike go through.

    with Launches() as n:
        step()
    print(n.count)

libcupti comes with the CUDA toolkit and with PyTorch's CUDA wheels
(``nvidia/cuda_cupti/lib`` for CUDA 12, ``nvidia/cu13/lib`` for 13);
``MINICHAIN_CUPTI_LIBRARY`` names one file instead. :func:`problem` says
why none loads ('' when one does). Used by bench/gpu_step.py and
tests/cuda/test_launches.py.
"""
import ctypes
import glob
import os
import sys

_DRIVER_API = 1   # CUPTI_CB_DOMAIN_DRIVER_API
_API_ENTER = 0    # CUPTI_API_ENTER
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                             ctypes.c_uint32, ctypes.c_void_p)


class _CallbackData(ctypes.Structure):
    """The first two fields of CUPTI's ``CUpti_CallbackData``."""
    _fields_ = [('callbackSite', ctypes.c_int),
                ('functionName', ctypes.c_char_p)]


def _candidates():
    configured = os.environ.get('MINICHAIN_CUPTI_LIBRARY', '').strip()
    if configured:
        return [configured]
    found = []
    for entry in sys.path:
        entry = os.path.abspath(entry or '.')
        for pattern in ('nvidia/cuda_cupti/lib/libcupti.so*',
                        'nvidia/cu*/lib/libcupti.so*',
                        'torch/lib/libcupti*.so*'):
            found += sorted(glob.glob(os.path.join(entry, pattern)))
    found += sorted(glob.glob('/usr/local/cuda*/extras/CUPTI/lib64/'
                              'libcupti.so*'))
    return found + ['libcupti.so']


_lib = []


def _load():
    if not _lib:
        errors = []
        for path in _candidates():
            try:
                _lib.append(ctypes.CDLL(path))
                break
            except OSError as e:
                errors.append(str(e))
        else:
            raise OSError('no libcupti: ' + '; '.join(errors))
    return _lib[0]


def problem():
    """Why launches cannot be counted here, or ''."""
    try:
        _load()
        return ''
    except OSError as e:
        return str(e)


class Launches:
    """A context that counts kernel launches while it is open."""

    def __init__(self):
        self.count = 0
        self._callback = _CALLBACK(self._seen)  # kept alive while subscribed
        self._subscriber = ctypes.c_void_p()

    def _seen(self, userdata, domain, cbid, data):
        call = ctypes.cast(data, ctypes.POINTER(_CallbackData)).contents
        if call.callbackSite == _API_ENTER:
            name = call.functionName or b''
            if name.startswith(b'cuLaunch') and b'HostFunc' not in name:
                self.count += 1

    def __enter__(self):
        lib = _load()
        for call, args in (('cuptiSubscribe', (ctypes.byref(
                self._subscriber), self._callback, None)),
                ('cuptiEnableDomain', (1, self._subscriber, _DRIVER_API))):
            status = getattr(lib, call)(*args)
            if status:
                raise RuntimeError('{} failed: CUPTI error {}'.format(
                    call, status))
        return self

    def __exit__(self, *exc):
        _load().cuptiUnsubscribe(self._subscriber)
