"""The README's figures are what the commands it names print."""

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_the_model_zoo_table_is_what_attnconv_list_prints():
    from keras_attnconv.models.summary import markdown_table, model_rows

    text = README.read_text()
    start = text.index("Made by `attnconv list`")
    table = re.search(r"\n(\| model \| paper row .*?)\n\n", text[start:], re.S).group(1)
    assert table == markdown_table(model_rows())


def test_every_layer_in_the_readmes_table_is_importable_from_the_package_root():
    import keras_attnconv

    text = README.read_text()
    table = text[text.index("| layer | what it is |"):text.index("```python")]
    names = re.findall(r"`([A-Z]\w+)`", "".join(line.split("|")[1] for line in table.splitlines()[2:] if "|" in line))
    assert "AttentionSpan" in names and "PixelNormalization" in names
    for name in names:
        assert getattr(keras_attnconv, name).__name__ == name


# One spelling per concept in names and docs: the public names say `center` and `neighbourhood`
# (`plot_attention_centers`, `Neighbourhood`), so the prose does too. A cited title keeps its own.
OTHER_SPELLINGS = re.compile(r"centre|centred|centring|neighborhood(?! Attention Transformer)", re.IGNORECASE)


def test_the_package_and_readme_spell_each_concept_one_way():
    root = README.parent
    files = [README, *sorted((root / "keras_attnconv").rglob("*.py")), *sorted((root / "tests").rglob("*.py"))]
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}" for path in files
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if OTHER_SPELLINGS.search(line) and path != Path(__file__)]
    assert not found, "\n".join(found)


def test_every_function_the_readme_names_is_reachable_after_importing_the_package():
    # `name(` for a function of the package, `keras_attnconv.module.name` for one in a module.
    import keras_attnconv

    text = README.read_text()
    for name in ("prune_degenerate_heads", "with_attention_options", "count_flops", "compile_for_fine_tuning",
                 "build_model", "from_preset", "save_to_preset"):
        assert f"`{name}(" in text or f"`{name}`" in text, name  # the README still names it
        assert callable(getattr(keras_attnconv, name)), name
    # (Not a file name such as `.keras_attnconv.json`, nor a module run with `python -m`.)
    for path in sorted(set(re.findall(r"(?<![.\w])(?<!-m )keras_attnconv\.((?:[a-z_]+\.)*[A-Za-z_]\w*)", text))):
        value = keras_attnconv
        for part in path.split("."):
            value = getattr(value, part)  # an AttributeError names what the README promises and lacks
    from keras_attnconv.models import with_attention_options  # noqa: F401 (the issue's failing import)
