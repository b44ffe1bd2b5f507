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
