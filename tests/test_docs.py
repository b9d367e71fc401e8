"""Run every ```python block of each docs/*.md page: the docs never go stale.

The blocks of one page run in order in one namespace (like pasting them into
one Python session), inside a temporary working directory. Markers, each an
HTML comment on a line of its own (docs/README.md explains them):

    <!-- docs-test: skip -->          the next code block is not run
    ```python no-run                  this block is not run
    <!-- docs-test: skip-page REASON -->   no block of the page runs
    <!-- docs-test: gpu -->           the page runs only when a GPU exists
    <!-- docs-test: mpiexec -n N -->  the page runs as N MPI ranks

The code that does not run here is checked without running it
(tests/_docs_names.py): blocks marked not to run, the branch of a
top-level ``if`` that was not taken (``if gpu:`` without a GPU), and the
whole of a page skipped here (a GPU page without a GPU, a skip-page):
names defined, imports done, attributes present, calls that bind to their
function's signature.

Usage as a script (what the mpiexec mode launches on every rank):
``python tests/test_docs.py docs/page.md``.
"""
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'
RUNNABLE = ('python', 'py')
_DIRECTIVE = re.compile(r'^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$')
_FENCE = re.compile(r'^(\s*)(`{3,}|~{3,})(.*)$')
_MPIEXEC = re.compile(r'^mpiexec\s+-n\s+([1-9][0-9]*)$')


class Block(NamedTuple):
    line: int     # 1-based line of the block's first code line in the page
    code: str
    run: bool
    layer: str = ''  # the layer it shows: not run where that is deleted


# ``<!-- docs-test: layer NAME -->``: the next block shows layer NAME, and is
# skipped where its folder was deleted (make test-peeled).
LAYERS = {'kernels': 'minichain.kernels', 'guards': 'minichain.dist.guards',
          'trace': 'minichain.dist.trace',
          'transports': 'minichain.dist.transports',
          'testing': 'minichain.dist.testing'}


def installed(layer):
    import importlib.util
    return importlib.util.find_spec(LAYERS[layer]) is not None


class Page(NamedTuple):
    name: str
    path: str
    blocks: tuple
    skip: str     # reason, or '' to run the page
    gpu: bool
    nprocs: int   # 0: run in this process


def parse_page(text, name='<page>', path=None):
    """Split a Markdown page into code blocks and read its markers.

    Raises:
        ValueError naming the page and line: an unknown ``docs-test``
        directive, a ``skip`` marker not right above a code block, or a
        fence that is never closed.
    """
    lines = text.splitlines()
    blocks, skip_next, layer_next = [], None, None
    page = dict(skip='', gpu=False, nprocs=0)
    i = 0
    while i < len(lines):
        line, where = lines[i], '{}:{}'.format(name, i + 1)
        directive = _DIRECTIVE.match(line)
        fence = _FENCE.match(line)
        if fence and fence.group(2)[0] == '`' and '`' in fence.group(3):
            fence = None  # inline code such as ```` ```python ````, not a fence
        if directive:
            word, _, rest = directive.group(1).partition(' ')
            mpi = _MPIEXEC.match(directive.group(1))
            if word == 'skip' and not rest:
                skip_next = where
            elif word == 'layer' and rest in LAYERS:
                layer_next = (rest, where)
            elif word == 'skip-page':
                page['skip'] = rest or 'marked skip-page'
            elif word == 'gpu' and not rest:
                page['gpu'] = True
            elif mpi:
                page['nprocs'] = int(mpi.group(1))
            else:
                raise ValueError('{}: unknown docs-test directive {!r} (known: '
                                 'skip, skip-page REASON, gpu, mpiexec -n N, '
                                 'layer NAME)'
                                 .format(where, directive.group(1)))
        elif fence:
            indent, ticks, info = fence.groups()
            close = re.compile(r'^\s*' + ticks[0] + '{' + str(len(ticks))
                               + r',}\s*$')
            end = next((j for j in range(i + 1, len(lines))
                        if close.match(lines[j])), None)
            if end is None:
                raise ValueError('{}: code fence is never closed'.format(where))
            words = info.split()
            lang = words[0].lower() if words else ''
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                    for ln in lines[i + 1:end]]
            run = (lang in RUNNABLE and 'no-run' not in words[1:]
                   and skip_next is None)
            if lang in RUNNABLE:
                blocks.append(Block(i + 2, '\n'.join(body) + '\n', run,
                                    layer_next[0] if layer_next else ''))
            skip_next = layer_next = None
            i = end
        elif (skip_next or layer_next) and line.strip():
            raise ValueError('{}: the docs-test skip or layer marker must sit '
                             'right above a code block'.format(
                                 skip_next or layer_next[1]))
        i += 1
    if skip_next is not None:
        raise ValueError('{}: the docs-test skip marker is not followed by a '
                         'code block'.format(skip_next))
    return Page(name, path or name, tuple(blocks), **page)


def read_page(path):
    path = Path(path).resolve()
    try:
        name = str(path.relative_to(ROOT))
    except ValueError:
        name = path.name
    return parse_page(path.read_text(encoding='utf-8'), name, str(path))


def run_page(page):
    """Execute the page's runnable blocks in order in one fresh namespace.

    Line numbers in tracebacks are those of the Markdown page. Then the
    code that did not run is checked (:func:`check_unrun`).

    Raises:
        AssertionError naming the page and the block's first line, chained
        to the block's own exception.
    """
    namespace = {'__name__': '__main__'}
    for block in page.blocks:
        if not block.run or (block.layer and not installed(block.layer)):
            continue
        # Padding puts each code line at its line number in the page.
        code = compile('\n' * (block.line - 1) + block.code, page.path, 'exec')
        try:
            exec(code, namespace)
        except Exception as e:
            raise AssertionError('{}: the python block starting at line {} '
                                 'raised {}: {}'.format(page.name, block.line,
                                                        type(e).__name__, e)
                                 ) from e
    check_unrun(page, namespace)
    return namespace


def check_unrun(page, namespace, all_blocks=False):
    """Raise AssertionError listing, by page line, what is wrong in the code
    of ``page`` that did not run (every block with ``all_blocks``)."""
    from tests._docs_names import unrun_errors
    errors = unrun_errors(page, namespace, all_blocks)
    if errors:
        raise AssertionError('{}: code that does not run here is wrong:\n{}'
                             .format(page.name, '\n'.join(
                                 '  line {}: {}'.format(*e) for e in errors)))


def _page_param(path):
    marks = []
    try:
        page = read_page(path)
    except ValueError:
        page = None  # the test itself reports the error
    if page is not None and page.nprocs:
        marks.append(pytest.mark.mpi)
    if page is not None and page.gpu:
        marks.append(pytest.mark.gpu)
    return pytest.param(path, marks=marks, id=path.name)


PAGES = sorted(DOCS.glob('*.md'))


@pytest.fixture
def clean_state(tmp_path, monkeypatch):
    """A temporary cwd; minichain.config restored afterwards."""
    from minichain import config
    saved = dict(config.__dict__)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    config.__dict__.clear()
    config.__dict__.update(saved)


@pytest.mark.parametrize('path', [_page_param(p) for p in PAGES])
def test_page(path, clean_state):
    page = read_page(path)
    if page.skip:
        check_unrun(page, {'__name__': '__main__'}, all_blocks=True)
        pytest.skip('{}: {}'.format(page.name, page.skip))
    if page.gpu:
        from minichain import backend
        if not backend.gpu_available():
            check_unrun(page, {'__name__': '__main__'}, all_blocks=True)
            pytest.skip('{} needs a CUDA GPU (its code was checked without '
                        'running)'.format(page.name))
    if not page.nprocs:
        run_page(page)
        return
    _run_under_mpiexec(page, clean_state)


def _run_under_mpiexec(page, cwd, timeout=300):
    from tests.dist._launch import mpi_command
    # ``-m mpi4py`` aborts every rank when one raises, instead of leaving
    # the others blocked in a collective until the timeout.
    cmd = mpi_command(page.nprocs, sys.executable, '-m', 'mpi4py', __file__,
                      page.path)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError('{} failed under {} (exit {}):\n{}'.format(
            page.name, ' '.join(cmd[:cmd.index(sys.executable)]),
            proc.returncode,
            (proc.stdout + proc.stderr)[-6000:]))


def test_index_lists_every_page():
    """docs/README.md links every page, and every .md link there exists."""
    index = (DOCS / 'README.md').read_text(encoding='utf-8')
    links = set(re.findall(r'\]\(([^)#\s]+\.md)(?:#[^)]*)?\)', index))
    missing = [p.name for p in PAGES
               if p.name != 'README.md' and p.name not in links]
    assert not missing, ('add a line for {} to docs/README.md (the index of '
                         'the docs pages)'.format(', '.join(missing)))
    broken = sorted(link for link in links if not (DOCS / link).exists())
    assert not broken, 'docs/README.md links missing pages: {}'.format(broken)


def test_readme_opens_with_the_two_commands_then_the_reading_order():
    """The first screen is the way in: ``make train`` and ``make test``
    (targets of the Makefile), then the reading order."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    block = text.split('```\n')[1]  # the first code block
    assert [line.split('#')[0].strip() for line in block.splitlines()] == [
        'make train', 'make test'], block
    makefile = (ROOT / 'Makefile').read_text(encoding='utf-8')
    assert re.search(r'^train:', makefile, re.M) and re.search(
        r'^test:', makefile, re.M)
    headings = re.findall(r'^## (.+)$', text, re.M)
    assert headings[0] == 'Reading order', headings
    order = text.split('## Reading order')[1].split('\n## ')[0]
    for path in ('minichain/variable.py', 'minichain/function_node.py',
                 'docs/tape.md', 'minichain/dist/optimizers.py',
                 'minichain/dist/averaging/after_backward.py',
                 'docs/data_parallel.md', 'minichain/dist/pure_nccl.py',
                 'docs/dist.md#a-default-step-from-optupdate-to-the-bytes-'
                 'summed'):
        assert '({})'.format(path) in order, path


@pytest.mark.parametrize('page', ['README.md', 'models/README.md',
                                  'docs/README.md'])
def test_relative_links_exist(page):
    path = ROOT / page
    text = path.read_text(encoding='utf-8')
    links = re.findall(r'\]\(([^)#\s:]+)(?:#[^)]*)?\)', text)
    assert links, page
    missing = sorted(link for link in links
                     if not (path.parent / link).exists())
    assert not missing, '{} links missing files: {}'.format(page, missing)


def test_own_pages_have_runnable_blocks():
    for name in ('tape.md', 'new_function.md'):
        page = read_page(DOCS / name)
        assert not page.skip and not page.nprocs
        assert sum(b.run for b in page.blocks) >= 5, name


# -- the harness itself --------------------------------------------------------
SAMPLE = '''# Title
```python
a = 1
```
Text with `<!-- docs-test: skip -->` inline is prose.

```bash
echo not python
```
<!-- docs-test: skip -->

```python
raise SystemExit('skipped block ran')
```
```python no-run
raise SystemExit('no-run block ran')
```
```` ```python ```` is inline code, not a fence.
- a list item:

  ```py
  b = a + 1
  ```
'''


def test_parse_blocks_lines_and_markers():
    page = parse_page(SAMPLE, 'sample.md')
    assert [(b.line, b.run) for b in page.blocks] == [
        (3, True), (13, False), (16, False), (22, True)]
    assert page.blocks[3].code == 'b = a + 1\n'
    assert (page.skip, page.gpu, page.nprocs) == ('', False, 0)
    assert run_page(page)['b'] == 2


def test_page_markers():
    page = parse_page('<!-- docs-test: skip-page needs two GPUs -->\n'
                      '<!-- docs-test: gpu -->\n'
                      '<!-- docs-test: mpiexec -n 3 -->\n', 'p.md')
    assert (page.skip, page.gpu, page.nprocs) == ('needs two GPUs', True, 3)


@pytest.mark.parametrize('text, message', [
    ('<!-- docs-test: skp -->\n', "p.md:1: unknown docs-test directive 'skp'"),
    ('<!-- docs-test: mpiexec -n two -->\n', 'unknown docs-test directive'),
    ('x\n<!-- docs-test: skip -->\nprose\n```python\n```\n',
     'p.md:2: the docs-test skip or layer marker must sit right above'),
    ('<!-- docs-test: skip -->\n\n', 'is not followed by a code block'),
    ('```python\nx = 1\n', 'p.md:1: code fence is never closed'),
])
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_page(text, 'p.md')


def test_failing_block_names_page_and_markdown_line():
    page = parse_page('```python\nx = 1\n```\n\n```python\ny = x\n'
                      'assert y == 2, "y is " + str(y)\n```\n', 'p.md')
    with pytest.raises(AssertionError, match='p.md: the python block starting '
                       'at line 6 raised AssertionError: y is 1') as info:
        run_page(page)
    tb = info.value.__cause__.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_lineno == 7


@pytest.mark.mpi
def test_mpiexec_mode_runs_every_rank(tmp_path):
    page_path = tmp_path / 'two.md'
    page_path.write_text('<!-- docs-test: mpiexec -n 2 -->\n```python\n'
                         'from mpi4py import MPI\nc = MPI.COMM_WORLD\n'
                         'assert c.size == 2\n'
                         'open("rank%d" % c.rank, "w").close()\n```\n')
    _run_under_mpiexec(read_page(page_path), tmp_path)
    assert (tmp_path / 'rank0').exists() and (tmp_path / 'rank1').exists()
    page_path.write_text(page_path.read_text().replace('== 2', '== 5'))
    with pytest.raises(AssertionError, match='two.md failed under'):
        _run_under_mpiexec(read_page(page_path), tmp_path)


if __name__ == '__main__':  # a rank of _run_under_mpiexec
    from mpi4py import MPI

    # after the package's folder: make test-peeled puts a copy first
    sys.path.append(str(ROOT))  # tests._docs_names
    from minichain.dist import shm_files
    # A page that fails ends in mpi4py's MPI_Abort, which skips MPICH's
    # cleanup: unlink its files now, as minichain's communicators do.
    MPI.COMM_WORLD.Barrier()
    shm_files.release_after_init(MPI.COMM_WORLD, MPI.COMM_WORLD)
    run_page(read_page(sys.argv[1]))
