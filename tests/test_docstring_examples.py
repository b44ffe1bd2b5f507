"""Every ``>>>`` example of the package's docstrings runs and prints what it shows.

The examples of every module of keras_attnconv, as the standard `doctest` module finds them, each one test
(its id: the example's qualified name, ``keras_attnconv.layers.downsampling.InvertibleDownsampling``). An
example sees its module's globals and ``np``, ``keras``, ``ops`` (``keras.ops``) and ``keras_attnconv``; its
output is compared with ELLIPSIS and NORMALIZE_WHITESPACE. An example that only illustrates (no output
shown) must still run without an error.
"""

import doctest
import importlib
import io
import pkgutil
import re
from pathlib import Path

import keras
import numpy as np
import pytest
from keras import ops

import keras_attnconv

OPTION_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: What every example may use without importing it; a module's own globals come on top.
SHARED_GLOBALS = {"np": np, "keras": keras, "ops": ops, "keras_attnconv": keras_attnconv}


def package_modules():
    """Every module of the package, imported (a module that fails to import fails the collection)."""
    names = sorted(info.name for info in pkgutil.walk_packages(keras_attnconv.__path__, "keras_attnconv."))
    return [keras_attnconv, *(importlib.import_module(name) for name in names)]


def docstring_examples():
    """The docstring examples of every module of the package, as `doctest.DocTest`s, by qualified name."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {}
    for module in package_modules():
        for test in finder.find(module, module.__name__, globs={**SHARED_GLOBALS, **vars(module)}):
            if not test.examples:
                continue  # a docstring without an example
            assert test.name not in found, f"two modules give examples named {test.name}"
            found[test.name] = test
    return [found[name] for name in sorted(found)]


EXAMPLES = docstring_examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=[test.name for test in EXAMPLES])
def test_the_docstring_example_runs_and_prints_what_it_shows(example):
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=OPTION_FLAGS)
    result = runner.run(example, out=report.write)
    assert result.attempted == len(example.examples) > 0
    if result.failed:
        pytest.fail(
            f"{result.failed} of {result.attempted} statements of {example.name} failed:\n{report.getvalue()}",
            pytrace=False,
        )


def test_every_example_in_the_source_is_one_the_tests_run():
    # A `>>>` line that the finder does not reach (a module walk_packages misses, a docstring of an object
    # defined elsewhere or nested in a function) would otherwise pass untested.
    package = Path(keras_attnconv.__file__).parent
    in_source = {}
    for path in sorted(package.rglob("*.py")):
        count = len(re.findall(r"^\s*>>>", path.read_text(), flags=re.M))
        if count:
            in_source[str(path.resolve())] = count
    collected = {}
    for test in EXAMPLES:
        key = str(Path(test.filename).resolve())
        collected[key] = collected.get(key, 0) + len(test.examples)
    assert collected == in_source
    assert sum(collected.values()) >= 30 and len(EXAMPLES) >= 13  # the layers' and conv_to_attention's
