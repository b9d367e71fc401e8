"""ChainerMN's ``chainermn.nccl``: CuPy's NCCL module under that name.

Its names (``NcclCommunicator``, ``get_unique_id``, ``get_version``,
``NCCL_FLOAT32``, ``NCCL_SUM``...) are CuPy's ``cupy.cuda.nccl``, looked up
when first read, so that importing this module needs neither CuPy nor a GPU;
``_available`` says whether they can be read. Reading one where NCCL cannot
run is an AttributeError saying what is missing (CuPy, a GPU or NCCL).
"""
from minichain import backend


def __getattr__(name):
    if name.startswith('__'):
        raise AttributeError(name)
    try:
        nccl = backend.get_nccl()
    except RuntimeError as e:
        if name == '_available':
            return False
        raise AttributeError('minichain.dist.nccl.{}: NCCL is not usable '
                             'here: {}'.format(name, e)) from None
    return True if name == '_available' else getattr(nccl, name)
