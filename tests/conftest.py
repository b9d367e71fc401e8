"""The session-wide check of minichain's own suite: the files in /dev/shm
and the temporary folder are listed as the session starts, and
tests/test_leftovers.py, which runs last, compares (see there)."""
from tests import test_leftovers


def pytest_configure(config):
    test_leftovers.take_first_listing(config)


def pytest_collection_modifyitems(items):
    last = [item for item in items if item.module is test_leftovers]
    items[:] = [item for item in items if item.module is not test_leftovers]
    items.extend(last)
