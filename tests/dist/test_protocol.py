"""A student's path through minichain.dist reads as the protocol: each
step within its file's first screen, and no guard or timeline line in it
(those are layers: guards/guarded.py, trace/traced.py)."""
import os

import minichain.dist as dist

HERE = os.path.dirname(os.path.abspath(dist.__file__))
SCREEN = 60  # lines


def _screen(name):
    with open(os.path.join(HERE, name)) as f:
        return ''.join(f.readlines()[:SCREEN])


def _in_order(text, steps):
    positions = [text.find(s) for s in steps]
    assert -1 not in positions, dict(zip(steps, positions))
    assert positions == sorted(positions), dict(zip(steps, positions))


def test_flat_packs_allreduces_and_unpacks_in_its_first_screen():
    text = _screen('flat.py')
    _in_order(text, ['packer.pack(', 'self.allreduce_packed(',
                     'packer.unpack(', 'self.wire.Allreduce(MPI.IN_PLACE'])


def test_pure_nccl_opens_with_unique_id_broadcast_and_init():
    _in_order(_screen('pure_nccl.py'), [
        'def init_nccl_comm(', 'get_unique_id()', 'bcast(uid, root=0)',
        'NcclCommunicator('])


def test_the_base_averages_in_its_first_screen():
    _in_order(_screen('communicator_base.py'), [
        'def multi_node_mean_grad(', 'self.plan_grads(',
        'self.mean_grads(model, entries)'])


def test_the_protocol_imports_no_guard_and_flat_no_timeline():
    for name in ('communicator_base.py', 'flat.py', 'pure_nccl.py',
                 'hierarchical.py', 'naive.py'):
        with open(os.path.join(HERE, name)) as f:
            imports = [line for line in f if line.startswith(
                ('import ', 'from '))]
        banned = ('guards', 'trace') if name in (
            'communicator_base.py', 'flat.py') else ('guards',)
        assert not [line for line in imports
                    if any(b in line for b in banned)], (name, imports)
