"""The naive communicator: one MPI Allreduce per parameter."""
import numpy

from minichain import backend
from minichain.dist import hooks, mpi
from minichain.dist.communicator_base import CommunicatorBase


class NaiveCommunicator(CommunicatorBase):
    """Averages each gradient with its own MPI Allreduce.

    The simplest correct scheme and the reference for the others: per
    parameter, copy the gradient to host memory (zeros where it is None),
    Allreduce in place, divide by the size, set it back (on the GPU if the
    parameter lives there). Many small messages: slow for large models.
    """

    name = 'naive'
    can_overlap = False  # one allreduce per parameter already

    def mean_grads(self, model, entries):
        MPI = mpi.import_mpi()
        for _, p, g in entries:
            dtype = numpy.dtype(p.dtype if self.allreduce_grad_dtype is None
                                else self.allreduce_grad_dtype)
            nbytes = p.size * dtype.itemsize
            with hooks.span('pack', nbytes):
                host = (numpy.zeros(p.shape, dtype=dtype) if g is None else
                        numpy.array(mpi.to_host(g)[0], dtype=dtype,
                                    order='C'))
            with hooks.span('allreduce', nbytes):
                mpi.allreduce_buffer(self.wire, host, MPI.SUM)
            device = backend.get_device_id(p.array)
            with hooks.span('unpack', nbytes, sync=device >= 0):
                host /= self.size
                value = host.astype(p.dtype, copy=False)
                p.grad = value if device < 0 else backend.to_gpu(value, device)
