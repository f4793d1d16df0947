import doctest

import topologies


def test_package_docstring_example_runs():
    result = doctest.testmod(topologies)
    assert result.attempted >= 2 and result.failed == 0


def test_public_names_exist():
    for name in topologies.__all__:
        assert getattr(topologies, name) is not None, name
