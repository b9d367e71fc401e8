"""Each rank's outcome of one test, and the one report made of them all.

The pytest plugin (:mod:`minichain.dist.testing.pytest_plugin`) turns every
rank's ``TestReport`` of a phase (setup, call, teardown) into a small dict, a
*record* that travels as JSON (a relaunched job's files) or over MPI (a job
started by the user), and :func:`combine` turns the records of all ranks
into one outcome and one message: which ranks failed, in which phase and
with what report (ranks with the same report are shown once), which passed,
which did not finish and where they were.
"""
import collections

from minichain.dist.failures import format_ranks

PHASES = ('collect', 'setup', 'call', 'teardown')
_WHERE = {'collect': 'while collecting', 'setup': 'in setup',
          'call': 'in the test body', 'teardown': 'in teardown'}

Result = collections.namedtuple('Result',
                                'outcome when longrepr sections wasxfail')


def record(report):
    """A JSON-able dict of a pytest ``TestReport`` (or ``CollectReport``)."""
    rec = {'nodeid': report.nodeid, 'outcome': report.outcome,
           'when': getattr(report, 'when', None) or 'collect',
           'duration': getattr(report, 'duration', 0.0)}
    if report.failed:
        rec['text'] = report.longreprtext
        rec['sections'] = [list(s) for s in report.sections]
        crash = getattr(report.longrepr, 'reprcrash', None)
        if crash is not None:
            rec['crash'] = [str(crash.path), crash.lineno, crash.message]
    elif report.skipped:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            rec['skip'] = [str(longrepr[0]), longrepr[1], str(longrepr[2])]
        else:
            rec['skip'] = [None, None, report.longreprtext]
    wasxfail = getattr(report, 'wasxfail', None)
    if wasxfail is not None:
        rec['wasxfail'] = wasxfail
    return rec


def failure(when, text):
    """A record of a failure that pytest did not report (the plugin's own)."""
    return {'nodeid': '', 'outcome': 'failed', 'when': when, 'text': text,
            'sections': [], 'duration': 0.0}


def same_outcome(a, b):
    """Whether two records of one phase tell the same outcome."""
    return _state([a]) == _state([b])


def _state(records):
    """``('failed' | 'skipped' | 'passed', key)`` of one rank's records."""
    failed = [r for r in records if r['outcome'] == 'failed']
    if failed:
        # The same error at the same place: a traceback also shows the
        # arguments of the failing call, which differ by rank (comm).
        return 'failed', tuple((r['when'], tuple(r['crash']) if r.get(
            'crash') else r['text']) for r in failed)
    skipped = [r for r in records if r['outcome'] == 'skipped']
    if skipped:
        return 'skipped', (skipped[0].get('wasxfail') is not None,)
    return 'passed', (records[0].get('wasxfail') is not None,)


def combine(records, size, unfinished=None, launched=''):
    """One report for the test from every rank's records.

    Args:
        records: ``{rank: [record, ...]}`` of the ranks that finished.
        size: the job's rank count; a rank in neither ``records`` nor
            ``unfinished`` did not finish either.
        unfinished: ``{rank: text}``, why (and where) a rank did not finish.
        launched: how the job was started (``'mpiexec -n 2'``), for the
            first line.
    Returns:
        A Result: the outcome (``'passed'``, ``'skipped'``, ``'failed'``),
        the phase to report it in, the longrepr (the first rank's skip
        tuple, or the text of a failure), captured-output sections of the
        failing ranks, and ``wasxfail`` when every rank had it.
    """
    unfinished = dict(unfinished or {})
    for rank in range(size):
        if not records.get(rank) and rank not in unfinished:
            unfinished[rank] = 'it reported nothing'
    states = {rank: _state(recs) for rank, recs in records.items() if recs
              and rank not in unfinished}
    kinds = {}
    for rank in sorted(states):
        kinds.setdefault(states[rank][0], []).append(rank)
    first = records[min(states)] if states else []
    if not unfinished and list(kinds) in (['passed'], ['skipped']):
        same = len({states[r] for r in states}) == 1
        if same and 'passed' in kinds:
            return Result('passed', 'call', None, [], _wasxfail(first))
        if same:
            skip = next(r for r in first if r['outcome'] == 'skipped')
            reason = tuple(skip['skip'])
            return Result('skipped', skip['when'], reason, [],
                          skip.get('wasxfail'))
    return _failed(records, states, kinds, unfinished, launched)


def _wasxfail(recs):
    return next((r['wasxfail'] for r in recs if 'wasxfail' in r), None)


def _failed(records, states, kinds, unfinished, launched):
    groups = collections.OrderedDict()  # same failure text -> ranks
    for rank in kinds.get('failed', ()):
        groups.setdefault(states[rank][1], []).append(rank)
    summary, phases = [], []
    for key, ranks in groups.items():
        where = ', '.join(_WHERE[w] for w in dict.fromkeys(w for w, _ in key))
        summary.append('failed on {} ({})'.format(format_ranks(ranks), where))
        phases.extend(w for w, _ in key)
    if unfinished:
        summary.append('did not finish on {}'.format(
            format_ranks(sorted(unfinished))))
    for kind in ('skipped', 'passed'):
        if kinds.get(kind):
            summary.append('{} on {}'.format(kind, format_ranks(kinds[kind])))
    lines = ['{}{}.'.format(launched + ': ' if launched else '',
                            '; '.join(summary))]
    if not groups and not unfinished:
        lines.append('Every rank must run the test the same way (a test '
                     'skipped on some ranks only leaves the others waiting in '
                     'their collectives).')
        for rank in kinds.get('skipped', ()):
            skip = next(r for r in records[rank] if r['outcome'] == 'skipped')
            lines.append('  rank {}: {}'.format(rank, skip['skip'][2]))
    sections = []
    for ranks in groups.values():
        same = ' (the same error on each; rank {}\'s report)'.format(
            ranks[0]) if len(ranks) > 1 else ''
        for rec in records[ranks[0]]:
            if rec['outcome'] == 'failed':
                lines += ['', '==== {}, {}{} ===='.format(
                    format_ranks(ranks), _WHERE[rec['when']], same),
                    rec['text'].rstrip()]
        for rec in records[ranks[0]]:
            for title, content in rec.get('sections', ()):
                sections.append(('{} ({})'.format(
                    title, format_ranks(ranks)), content))
    alike = collections.OrderedDict()  # same text -> ranks
    for rank in sorted(unfinished):
        alike.setdefault(unfinished[rank].rstrip(), []).append(rank)
    for text, ranks in alike.items():
        lines += ['', '==== {} did not finish ===='.format(
            format_ranks(ranks)), text]
    when = min(phases, key=PHASES.index) if phases else 'call'
    return Result('failed', when, '\n'.join(lines), sections, None)
