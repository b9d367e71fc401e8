"""DoubleBuffered: the gradients of step t averaged while step t + 1 runs
(``create_multi_node_optimizer(..., double_buffering=True)``)."""
import copy

from minichain import backend
from minichain.dist.averaging.base import Averaging


class DoubleBuffered(Averaging):
    """Overlaps each step's NCCL allreduce with the next iteration.

    The allreduce of step k runs on a side CUDA stream while step k+1
    computes; step k+1 then applies the averaged gradients of step k (one
    step stale). Two packed buffers alternate so that the one being applied
    is never the one being reduced; the default stream waits for the side
    stream on the GPU, never on the host.

    Args:
        comm: a pure_nccl (or hierarchical) communicator.
        zero_fill: as for :class:`AfterBackward`.
    """

    can_join = False  # a rank without data has no step to be stale by

    def __init__(self, comm, zero_fill=True):
        from minichain.dist.pure_nccl import PureNcclCommunicator
        if not isinstance(comm, PureNcclCommunicator):
            raise ValueError('create_multi_node_optimizer: double_buffering '
                             'needs a pure_nccl (or hierarchical) '
                             'communicator, got {}'.format(type(comm).__name__))
        backend.check_cuda_available()
        self.comm, self.zero_fill = comm, zero_fill
        self.shadow = None      # a copy of the model holding the gradients
        self.stream = None      # being reduced, on this side stream
        self.done = None        # event: the side stream finished
        self.in_flight = None   # gradients the side stream still reads
        self.parity = 0
        self.ready = False      # the shadow holds averaged gradients

    def setup(self, model):
        self.shadow = None

    def discard(self):
        self.shadow = None  # the next average starts a fresh buffer

    def average(self, model, has_data=None):
        """Swap the model's gradients with the shadow's (averaged during
        this step, if ``ready``), and launch the averaging of the new ones
        on the side stream. Returns whether there is an averaged gradient
        to step on (not at the first step of a buffer)."""
        if self.shadow is None:  # after setup, a broadcast or a resume
            self._new_shadow(model)
        cupy = backend.get_cupy()
        if self.stream is None:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        current = cupy.cuda.get_current_stream()
        if self.done is not None:
            current.wait_event(self.done)
        self.in_flight = None  # later default-stream work is ordered after
        ready = self.ready
        for (_, p), (_, s) in zip(model.namedparams(),
                                  self.shadow.namedparams()):
            p.grad_var, s.grad_var = s.grad_var, p.grad_var
        start = current.record()
        self.stream.wait_event(start)
        self.in_flight = [s.grad for s in self.shadow.params()]
        self.comm.multi_node_mean_grad_async(
            self.shadow, self.zero_fill, self.stream,
            'double{}'.format(self.parity))
        self.done = self.stream.record()
        self.parity ^= 1
        self.ready = True
        return ready

    def _new_shadow(self, model):
        shadow = copy.deepcopy(model)
        for p in shadow.params():  # holds gradients only
            p.cleargrad()
            p.update_rule = None
        self.shadow, self.ready = shadow, False
