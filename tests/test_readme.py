"""The README and the pages of docs/: their figures are what the commands they name print, and every name, import,
link, recipe and file they give exists in the package as it is."""

import ast
import importlib
import importlib.util
import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FRONT_PAGE_LINES = 300
SET_UP_COMMAND = "pip install -e . && attnconv train --recipe quick"  # .ci/run runs it verbatim
TEST_COMMAND = (
    "python -m pytest && KERAS_BACKEND=jax python -m pytest tests/layers tests/models tests/training/test_training.py"
)


def pages():
    """The README, then every page of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def the_page_holding(marker):
    """The text of the one page that holds `marker`."""
    found = [page for page in pages() if marker in page.read_text()]
    assert len(found) == 1, f"{marker!r} should be on one page; it is on {[str(p) for p in found]}"
    return found[0].read_text()


def table_rows(text, header):
    """The rows (lists of cells) of the markdown table whose header line starts with `header`."""
    lines = text[text.index(header) :].split("\n\n")[0].splitlines()
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def prose(text):
    """`text` without its fenced code blocks (whose `# comments` are not headings)."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def code_blocks(language, page_list=None):
    """(where, code) of every fenced block of `language`, dedented (a block may sit in a list item)."""
    for page in page_list or pages():
        blocks = re.findall(rf"^([ \t]*)```{language}\n(.*?)^\1```", page.read_text(), flags=re.S | re.M)
        for number, (_, block) in enumerate(blocks, 1):
            yield f"{page.relative_to(ROOT)}, {language} block {number}", textwrap.dedent(block)


def test_the_model_zoo_table_is_what_attnconv_list_prints():
    from keras_attnconv.models.summary import markdown_table, model_rows

    text = the_page_holding("Made by `attnconv list`")
    start = text.index("Made by `attnconv list`")
    table = re.search(r"\n(\| model \| paper row .*?)\n\n", text[start:], re.S).group(1)
    counted = model_rows(recount=True)  # every model built and counted
    assert table == markdown_table(counted)
    assert model_rows() == counted  # the counts `attnconv list` prints without building: the package's record


def test_every_layer_in_the_layers_table_is_importable_from_the_package_root():
    import keras_attnconv

    header = "| layer | what it is |"
    names = re.findall(r"`([A-Z]\w+)`", " ".join(row[0] for row in table_rows(the_page_holding(header), header)))
    assert "AttentionSpan" in names and "PixelNormalization" in names
    for name in names:
        assert getattr(keras_attnconv, name).__name__ == name


# One spelling per concept in names and docs: the public names say `center` and `neighbourhood`
# (`plot_attention_centers`, `Neighbourhood`), so the prose does too. A cited title keeps its own.
OTHER_SPELLINGS = re.compile(r"centre|centred|centring|neighborhood(?! Attention Transformer)", re.IGNORECASE)


def test_the_package_and_its_documentation_spell_each_concept_one_way():
    files = [*pages(), *sorted((ROOT / "keras_attnconv").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    assert DOCS / "models.md" in files  # docs/ is searched too
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OTHER_SPELLINGS.search(line) and path != Path(__file__)
    ]
    assert not found, "\n".join(found)


def test_every_function_the_documentation_names_is_reachable_after_importing_the_package():
    # `name(` or `name` for a function at the package's root.
    import keras_attnconv

    text = "\n".join(page.read_text() for page in pages())
    for name in (
        "prune_degenerate_heads",
        "with_attention_options",
        "count_flops",
        "compile_for_fine_tuning",
        "build_model",
        "from_preset",
        "save_to_preset",
        "list_models",
        "get_model_config",
        "get_paper_figures",
        "conv_to_attention",
    ):
        assert f"`{name}(" in text or f"`{name}`" in text, name  # the documentation still names it
        assert callable(getattr(keras_attnconv, name)), name
    from keras_attnconv.models import with_attention_options  # noqa: F401 (the issue's failing import)


# `keras_attnconv.a.b.c`, not a file name (`.keras_attnconv.json`), a path (`keras_attnconv/models`) or a wheel.
DOTTED_NAME = re.compile(r"(?<![\w./-])keras_attnconv(?:\.[A-Za-z_]\w*)+")


def resolve(dotted):
    """The object `dotted` names: its longest importable module prefix, imported, then attributes of it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            value = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and (module_name == error.name or module_name.startswith(error.name + ".")):
                continue  # no such module: a shorter prefix is the module, the rest attributes
            raise  # the module exists and fails on something it imports
        for part in parts[end:]:
            value = getattr(value, part)  # an AttributeError names what the documentation promises and lacks
        return value
    raise AssertionError(dotted)


def test_every_dotted_name_in_the_documentation_resolves():
    names = sorted({(name, page.name) for page in pages() for name in DOTTED_NAME.findall(page.read_text())})
    assert any(name == "keras_attnconv.export.export_model" for name, _ in names)  # the search finds names
    failed = []
    for name, page in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as error:
            failed.append(f"{page}: {name}: {type(error).__name__}: {error}")
    assert not failed, "\n".join(failed)


def test_every_python_block_of_the_documentation_is_valid_python():
    failed = []
    for where, block in code_blocks("python"):
        try:
            ast.parse(block)
        except SyntaxError as error:
            failed.append(f"{where}, line {error.lineno}: {error.msg}")
    assert not failed, "\n".join(failed)


def test_every_import_in_a_python_block_of_the_documentation_runs():
    # Every `import ...` and `from ... import ...` of a block, one statement at a time. A third-party module
    # that this environment lacks (an extra not installed) is passed over; the package's own never are.
    ran = 0
    for where, block in code_blocks("python"):
        for node in ast.walk(ast.parse(block)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
            if not all(
                m.split(".")[0] == "keras_attnconv" or importlib.util.find_spec(m.split(".")[0]) for m in modules
            ):
                continue
            statement = ast.unparse(node)
            try:
                exec(compile(statement, where, "exec"), {})
            except ImportError as error:
                pytest.fail(f"{where}: {statement}: {type(error).__name__}: {error}")
            ran += "keras_attnconv" in statement
    assert ran >= 10  # the blocks import the package


def test_the_front_page_is_at_most_300_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= FRONT_PAGE_LINES, f"README.md has {lines} lines; move a topic into docs/"


def test_the_front_page_links_every_page_of_docs():
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)(?:#[\w-]*)?\)", README.read_text()))
    written = {page.name for page in DOCS.glob("*.md")}
    assert written, "docs/ has no pages"
    assert not written - linked, f"pages the README does not link: {sorted(written - linked)}"


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page):
    return {slug(heading) for heading in re.findall(r"^#+ (.+)$", prose(page.read_text()), flags=re.M)}


def test_every_link_of_the_documentation_leads_to_a_page_and_heading_that_exist():
    failed, checked = [], 0
    for page in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            checked += 1
            if not linked.is_file():
                failed.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and anchor not in anchors(linked):
                failed.append(f"{page.relative_to(ROOT)}: {target}: no such heading in {linked.name}")
    assert checked > len(pages())
    assert not failed, "\n".join(failed)


def test_the_front_page_gives_the_set_up_and_test_commands_verbatim():
    lines = {line.strip() for _, block in code_blocks("bash", [README]) for line in block.splitlines()}
    assert SET_UP_COMMAND in lines  # the first command of "Install and run", which CI runs verbatim
    assert TEST_COMMAND in lines


def test_the_front_pages_python_tensorflow_and_keras_are_the_oldest_the_package_installs_with():
    import configparser

    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    requirements = setup["options"]["install_requires"]
    floors = {
        "Python": setup["options"]["python_requires"].removeprefix(">="),
        "TensorFlow": re.search(r"^tensorflow>=(\S+)$", requirements, flags=re.M)[1],
        "Keras": re.search(r"^keras>=([^,\s]+)", requirements, flags=re.M)[1],
    }
    said = re.search(r"Python (\S+) or newer, TensorFlow (\S+) and Keras (\S+) or newer", README.read_text())
    assert said, "the front page should say which Python, TensorFlow and Keras the package needs"
    assert dict(zip(floors, said.groups())) == floors


@pytest.mark.backend_independent
@pytest.mark.parametrize("failing_pass", ["TensorFlow", "JAX"])
def test_ci_runs_the_test_command_verbatim_and_fails_when_either_pass_fails(tmp_path, failing_pass):
    # `set -e` does not stop at a failure before the last command of an `&&` list: CI once passed with a failed
    # TensorFlow pass (and no JAX pass). Its test line runs here with a `python` that fails on one pass.
    import os
    import subprocess

    line = next(line for line in (ROOT / ".ci/run").read_text().splitlines() if line.startswith(TEST_COMMAND))
    on_jax = "exit 1" if failing_pass == "JAX" else "exit 0"
    on_tensorflow = "exit 1" if failing_pass == "TensorFlow" else "exit 0"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nif [ "$KERAS_BACKEND" = jax ]; then {on_jax}; fi\n{on_tensorflow}\n')
    fake.chmod(0o755)
    environment = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    environment.pop("KERAS_BACKEND", None)
    script = f"set -euo pipefail\n{line}\necho carried on"
    result = subprocess.run(["bash", "-c", script], env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "carried on" not in result.stdout, (line, result.stdout, result.stderr)


def test_every_recipe_the_documentation_names_is_a_recipe_of_the_package():
    from keras_attnconv.training.recipe import is_recipe_name, recipe_names

    named = set()
    for page in pages():
        text = page.read_text()
        for recipe in re.findall(r"--recipe ([^\s`|)]+)", text) + re.findall(r"load_recipe\(\"([^\"]+)\"", text):
            if is_recipe_name(recipe) and not recipe.isupper() and not recipe.startswith("<"):  # not NAME, <x>
                named.add((recipe, page.name))
    assert ("quick", "README.md") in named
    unknown = sorted(f"{page}: {recipe}" for recipe, page in named if recipe not in recipe_names())
    assert not unknown, "\n".join(unknown)


# A file or directory of the repository named by its path (a glob such as `recipes/*.toml` matches one; one with a
# placeholder, `scale-<host>.json`, is no path).
REPOSITORY_PATH = re.compile(r"(?<![\w./-])((?:keras_attnconv|tests|docs|training|\.ci)/[\w./*-]*[\w*/])(?![\w./*-]*<)")


def test_every_package_and_test_file_the_documentation_names_exists():
    failed, checked = [], 0
    for page in pages():
        for path in sorted(set(REPOSITORY_PATH.findall(page.read_text()))):
            checked += 1
            if not any(ROOT.glob(path.rstrip("/"))):
                failed.append(f"{page.relative_to(ROOT)}: {path}")
    assert checked > 20
    assert not failed, "\n".join(failed)


def test_the_front_pages_figures_are_committed_files_drawn_by_the_command_it_names():
    text = README.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert len(images) >= 2
    command = re.search(r"`(attnconv plot runs/quick --output (\S+) --dpi \d+)`", text)
    assert command, "the README names the command that draws its figures"
    for image in images:
        assert (ROOT / image).is_file() and (ROOT / image).parent == ROOT / command.group(2), image
        assert (ROOT / image).stat().st_size < 150_000, f"{image}: keep the front page's figures small (low dpi)"


def test_the_front_pages_gpu_table_is_the_results_files_of_the_commands_it_names():
    from keras_attnconv.bench import gpu_targets

    text = README.read_text()
    commands = re.findall(
        r"attnconv\s+bench\s+--suite\s+gpu((?:\s+--(?!output)\S+\s+\S+)*)\s+--output\s+"
        r"(training/results/\S+\.json)`",
        text,
    )
    assert len(commands) == 3, "the README names the commands that measured its GPU table, one per file"
    measured = {}
    for options, path in commands:
        results = json.loads((ROOT / path).read_text())
        # The same options as the run that wrote the file (which may have written it elsewhere on the lent machine).
        recorded = re.sub(r"\s+--output\s+\S+", "", results["command"]).split()
        assert recorded == ["attnconv", "bench", "--suite", "gpu", *options.split()], results["command"]
        for row in results["rows"]:
            if row["path"] == row["auto_path"]:
                key = row["model"], row["precision"]
                assert key not in measured, f"{key} is in two of the files: which one the table shows is unclear"
                measured[key] = row
    rows = table_rows(text, "| model | mixed_bfloat16: step ms, waited for |")
    assert rows
    for model, step_ms, images_per_second, target, peak_mib, float32_images, float16_images in rows:
        row = measured[model.strip("`"), "mixed_bfloat16"]
        assert step_ms == f"{row['step_ms']:.2f}", model
        assert images_per_second == f"{row['fit_images_per_second']:,.0f}", model
        assert target == f">= {gpu_targets.TARGETS['H100'][model.strip('`')][1]:,}", model  # the code's
        assert peak_mib == f"{row['peak_memory_mib']:,.0f}", model
        for precision, cell in (("float32", float32_images), ("mixed_float16", float16_images)):
            assert cell == f"{measured[model.strip('`'), precision]['fit_images_per_second']:,.0f}", (model, precision)


def test_the_cpu_table_is_the_results_file_of_the_command_it_names():
    header = "| model | precision | XLA step ms | graph step ms |"
    text = the_page_holding(header)
    commands = re.findall(r"`attnconv bench --output (training/results/\S+\.json)`", text[: text.index(header)])
    assert commands, "the page names the command that measured its CPU table, before it"
    results = json.loads((ROOT / commands[-1]).read_text())
    assert results["machine"]["cpu"]["bfloat16_units"] == "AMX"  # the CPU the README's paragraph names
    measured = {(row["model"], row["precision"], row["path"]): row for row in results["models"]}
    rows = table_rows(text, "| model | precision | XLA step ms | graph step ms |")
    assert len(rows) == 8
    for model, precision, xla_ms, graph_ms, auto_path, fraction in rows:
        xla, graph = (measured[(model.strip("`"), precision, path)] for path in ("xla", "graph"))
        auto = xla if xla["rule"] else graph
        assert (xla_ms, graph_ms) == (f"{xla['step_ms']:,.0f}", f"{graph['step_ms']:,.0f}"), model
        assert auto_path == auto["path"] and auto["fastest"], (model, precision)
        assert fraction == f"{100 * auto['fraction_of_matmul']:.0f}%", (model, precision)


#: The CPU kinds the README's CPU paragraph names, by `cpu_capabilities`' bfloat16 units.
CPU_KIND_NAMES = {"AMX": "Intel Xeon with AMX", "AVX-512 BF16": "AMD EPYC with AVX-512 BF16"}


def test_the_front_pages_cpu_paragraph_is_the_steps_files_it_names():
    from keras_attnconv.bench.step_targets import AVX512_BF16_SPEEDUP

    section = README.read_text().split("## On a CPU", 1)[1].split("\n## ", 1)[0]
    paragraph = " ".join(section.split())  # the sentences, whatever their line breaks
    # Each command, then what it measured: the text up to the next command.
    parts = re.split(r"`attnconv bench --suite steps --output (training/results/\S+\.json)`", paragraph)
    named = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert len(named) == len(CPU_KIND_NAMES), "the README names the command that measured each CPU kind's figures"
    for path, claims in named.items():
        results = json.loads((ROOT / path).read_text())
        assert f"on an {CPU_KIND_NAMES[results['machine']['cpu']['bfloat16_units']]}" in claims, path
        rows = results["models"]
        cases = {(row["model"], row["precision"]) for row in rows}
        assert f"took the faster path in all {len(cases)} cases" in claims, path
        assert all(row["rule"] == row["fastest"] for row in rows), path
        picked = {(row["precision"], row["path"]): row for row in rows if row["model"] == "quadratic" and row["rule"]}
        float32, bfloat16 = picked["float32", "graph"], picked["mixed_bfloat16", "graph"]
        speedup = float32["step_ms"] / bfloat16["step_ms"]
        assert f"mixed_bfloat16 trains `quadratic` {speedup:.2f}x as fast as float32" in claims, path
        units = results["machine"]["cpu"]["bfloat16_units"]
        if units == "AVX-512 BF16" and speedup < AVX512_BF16_SPEEDUP:  # its target missed: the README says why
            matmul = bfloat16["matmul_gflops"] / float32["matmul_gflops"]
            bound = f"target {AVX512_BF16_SPEEDUP:g}x, beyond its bfloat16 matmul's {matmul:.2f}x"
            assert bound in claims, path


def test_the_front_pages_clusters_sentence_is_the_clusters_file_it_names():
    section = README.read_text().split("## On a CPU", 1)[1].split("\n## ", 1)[0]
    paragraph = " ".join(section.split())
    command = re.search(
        r"`attnconv bench --suite clusters --precisions mixed_bfloat16 --output (\S+\.json)`", paragraph
    )
    assert command, "the README names the command that measured the clusters"
    results = json.loads((ROOT / command.group(1)).read_text())
    assert results["machine"]["cpu"]["bfloat16_units"] == "AMX"
    rows = {row["model"]: row for row in results["rows"] if row["precision"] == "mixed_bfloat16"}
    assert f"measured the `quadratic` step {rows['quadratic']['speedup']:.2f}x as fast with them" in paragraph
    # What train sets them for is what was faster with them, and what it leaves out was not.
    assert all((row["speedup"] > 1) == row["takes_them"] for row in rows.values())


def test_the_front_pages_table1_is_the_results_file_of_the_command_it_names():
    from keras_attnconv.training.table1 import TABLE1_HEADER, TABLE1_MODELS, table1_rows

    text = README.read_text()
    command = re.search(r"`(attnconv table1 .*?--output (training/results/table1-\S+\.json))`", text, flags=re.S)
    assert command, "the README names the command that made its Table 1"
    results = json.loads((ROOT / command.group(2)).read_text())
    # The last command that made it (wrapped as prose), which names the results file it updated or wrote.
    assert shlex.split(results["commands"][-1]) == shlex.split(" ".join(command.group(1).split()))
    assert results["data"]["name"] == "CIFAR-10 (JPEG copy)" and "CIFAR-10 (JPEG copy)" in text
    rows = table_rows(text, TABLE1_HEADER)
    assert [row[0] for row in rows] == [f"`{model}`" for model in TABLE1_MODELS]
    assert rows == table1_rows(results)
