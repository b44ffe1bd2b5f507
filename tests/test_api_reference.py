"""The API reference (docs/api.md): pdoc builds it from the docstrings without a single warning, and every public
name of the package, and of the application's packages, has its entry in it."""

import importlib
import inspect
import re
import warnings
from pathlib import Path

import pdoc
import pdoc.render
import pytest

ROOT = Path(__file__).parents[1]

#: What the reference documents: the library (the package root, which re-exports its public names, and its
#: subpackages) and the application's packages, imported by name. A package's `__all__` says what its page shows.
MODULES = ("keras_attnconv", "keras_attnconv.training", "keras_attnconv.export", "keras_attnconv.bench")
DOCFORMAT = "google"  # the docstrings' Args:, Returns:, Raises: sections
# TensorFlow's import runs `uname -p`, which pdoc suppresses with a warning unless PDOC_ALLOW_EXEC is set.
BUILD_COMMAND = f"PDOC_ALLOW_EXEC=1 python -m pdoc -d {DOCFORMAT} {' '.join(MODULES)} -o build/api"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The reference built as docs/api.md's command builds it: its directory, and every warning raised meanwhile."""
    output = tmp_path_factory.mktemp("api")
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning recorded, none shown once and then hidden
        patch.setenv("PDOC_ALLOW_EXEC", "1")
        pdoc.render.configure(docformat=DOCFORMAT)
        try:
            pdoc.pdoc(*MODULES, output_directory=output)
        finally:
            pdoc.render.configure()  # pdoc's defaults again, for whatever else this process renders
    return output, caught


def page_of(output, module_name):
    return output / (module_name.replace(".", "/") + ".html")


def test_pdoc_builds_the_reference_without_a_warning(reference):
    output, caught = reference
    assert not caught, "pdoc warned:\n" + "\n\n".join(
        f"{w.category.__name__} ({w.filename}:{w.lineno}): {w.message}" for w in caught
    )
    assert (output / "index.html").is_file()


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_an_entry_in_the_reference(reference, module_name):
    output, _ = reference
    module = importlib.import_module(module_name)
    page = page_of(output, module_name).read_text()
    names = module.__all__
    assert names
    missing = []
    for name in names:
        if inspect.ismodule(getattr(module, name)):  # a subpackage: a page of its own, linked from this one
            found = (
                page_of(output, f"{module_name}.{name}").is_file()
                and f'href="{module_name.rpartition(".")[2]}/{name}.html"' in page
            )
        else:  # a class, function or constant: its section on the package's page
            found = f'<section id="{name}">' in page
        if not found:
            missing.append(name)
    assert not missing, f"names of {module_name}.__all__ without an entry in the reference: {missing}"


def test_docs_api_md_gives_the_command_that_builds_the_reference():
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    assert any(BUILD_COMMAND in block.splitlines() for block in blocks), BUILD_COMMAND
