"""tests/_docs_names.py: the docs code that does not run here is checked
anyway, so that a renamed attribute in a GPU-only or cluster-only block
fails a test on this machine."""
import re

import pytest

from tests.test_docs import check_unrun, parse_page, run_page

GPU_PAGE = '''```python
from minichain import backend, dist
from minichain import links as L

comm = dist.create_communicator('flat', layers=())
gpu = False
rank = 1
```

```python
if gpu:
    nccl_comm = dist.create_communicator('pure_nccl')
    model = L.Linear(3, 2)
    model.to_gpu(0)
    nccl_comm.multi_node_mean_grad(model)
    assert nccl_comm.nccl_device == 0
    print(model.W.grad, comm.mpi_comm, backend.to_cpu)
if rank == 0:
    trace = {'traceEvents': []}
if rank == 0:
    print(trace['traceEvents'])
```
'''


def _errors(text, line_after):
    """The check's complaint about GPU_PAGE with ``line_after`` added to
    the end of the ``if gpu:`` body ('' if none)."""
    text = text.replace("    print(model.W.grad", line_after + "\n    print("
                        "model.W.grad")
    try:
        run_page(parse_page(text, 'p.md'))
    except AssertionError as e:
        return str(e)
    return ''


def test_a_gpu_branch_that_is_right_passes():
    assert _errors(GPU_PAGE, '') == ''


@pytest.mark.parametrize('line, message', [
    ('    nccl_comm._nccl_device', "line 17: PureNcclCommunicator object has "
     "no attribute '_nccl_device'"),
    ('    model.to_gpu(0, 1, 2)', 'line 17: call of Link.to_gpu: too many '
     'positional arguments'),
    ('    nccl_comm.multi_node_mean_grad(model, zero_fil=True)',
     "line 17: call of .*multi_node_mean_grad: got an unexpected keyword "
     "argument 'zero_fil'"),
    ('    backend.to_cpuu(model)', "line 17: minichain.backend has no "
     "attribute 'to_cpuu'"),
    ('    print(devce)', "line 17: name 'devce' is not defined"),
    ('    from minichain.device import get_rank_devices',
     "line 17: minichain.device has no attribute 'get_rank_devices'"),
    ('    import minichain.dist.no_such', 'line 17: import '
     'minichain.dist.no_such'),
    ('    comm.mpi_comn', "line 17: FlatCommunicator object has no "
     "attribute 'mpi_comn'"),
])
def test_a_wrong_line_in_a_gpu_branch_fails_naming_it(line, message):
    found = _errors(GPU_PAGE, line)
    assert found.startswith('p.md: code that does not run here is wrong'), \
        found
    assert re.search(message, found), found


def test_a_fragment_not_run_may_leave_names_undefined():
    page = parse_page('```python no-run\nfrom minichain import dist\n'
                      'opt = dist.create_multi_node_optimizer(\n'
                      '    MyOptimizer(), comm, overlap=True, bucket_mb=25)\n'
                      'import chainer  # not installed here\n```\n', 'p.md')
    run_page(page)
    page = parse_page(page.blocks[0].code.join(['```python no-run\n', '```\n'])
                      .replace('bucket_mb', 'bucket_mib'), 'p.md')
    with pytest.raises(AssertionError, match="line 3: call of create_multi_"
                       "node_optimizer: got an unexpected keyword argument "
                       "'bucket_mib'"):
        run_page(page)


def test_a_page_that_does_not_run_here_is_checked_whole():
    page = parse_page('<!-- docs-test: gpu -->\n' + GPU_PAGE.replace(
        'nccl_device', 'nccl_devic'), 'p.md')
    with pytest.raises(AssertionError, match="line 17: .*'nccl_devic'"):
        check_unrun(page, {}, all_blocks=True)
