"""The guards layer: no collective hangs unnoticed or mixes with another.

:class:`Guarded`, put in front of a communicator class by
:func:`minichain.dist.create_communicator`, swaps the protocol's seams
(:class:`~minichain.dist.communicator_base.CommunicatorBase`'s ``make_wire``,
``collective``, ``header``, ``plan_grads``...) for guarded ones:

* every message goes through a :class:`~minichain.dist.guards.watchdog.Wire`
  (the stall watchdog: a rank never waits forever);
* every collective is numbered and opens with the header of
  :mod:`minichain.dist.guards.agreement` (ranks in different collectives, or
  with different arguments, raise the same error instead of hanging);
* a gradient averaging agrees on the model's layout, the training step and
  the missing gradients first (:func:`minichain.dist.guards.safety.
  plan_grads`), and ``bcast_data`` on the layout;
* an uncaught exception on one rank ends the whole job
  (:func:`minichain.dist.guards.safety.install_abort_hook`).
"""
from minichain.dist import mpi, shm_files
from minichain.dist.guards import agreement, safety, watchdog


class Guarded:
    """Layer: the guards above around a communicator's protocol."""

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        # MPICH's files are not needed by name once every rank has opened
        # them: an aborted job (the guards' way out) then leaves none.
        shm_files.release_after_init(self.mpi_comm,
                                     mpi.import_mpi().COMM_WORLD)
        safety.install_abort_hook()

    def make_wire(self, mpi_comm, label):
        return watchdog.Wire(mpi_comm, label)

    def header(self, agree=None, on_mismatch=None, maxes=(), root=None,
               root_values=()):
        return agreement.header(self.wire, agree, on_mismatch, maxes, root,
                                root_values)

    def agree_layout(self, wire, layout, where, step=None):
        safety.agree(wire, layout, where, step=step)

    def raise_everywhere(self, error):
        agreement.raise_everywhere(self.wire, error)

    def plan_grads(self, model, zero_fill=False, step=None, active=None):
        # The header is the step's first collective: a rank that arrives
        # early waits here for the slower one.
        return safety.plan_grads(self.wire, model.namedparams(), zero_fill,
                                 self.layout_extra(model), step, active)

    def bcast_data(self, model):
        with self.collective('bcast_data'):
            safety.agree(self.wire, safety.param_layout(model.namedparams())
                         + safety.persistent_layout(model.namedpersistents()),
                         'bcast_data')
            super().bcast_data(model)

    def split(self, color, key):
        with self.collective('split'):
            self.header()
            return super().split(color, key)
