"""TF Serving's ``models.config`` as a file: its text read and parsed as ``ModelServerConfig``, and written back.

The message is TF Serving's own (tensorflow-serving-api), so what the
package does not know (fields, policies, labels) goes through unchanged.
Text format has no place for comments in the message: those at the top of
the file (its header) are kept verbatim; any other is said, once, to go.
A ``models.config`` that is a symbolic link is written through it: the
file it points to is the one TF Serving reads.

Which entries of it the package may change, the export root decides
(`root.ExportRoot`).
"""

import itertools
import re
import warnings
from pathlib import Path

from keras_attnconv.utils.files import write_atomically

#: A quoted string of text format, whose '#' is no comment (``base_path: "/srv/#2"``).
_STRING = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'""")


def read(path, export_dir):
    """The file `path` as (its text, TF Serving's ``ModelServerConfig``): ("", an empty one) if there is none.

    A file that cannot be read, or is not TF Serving's, is a ValueError naming it.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    path, config = Path(path), model_server_config_pb2.ModelServerConfig()
    if not path.exists() and not path.is_symlink():
        return "", config
    try:
        text = path.read_text()
        text_format.Parse(text, config)
    except (OSError, text_format.ParseError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is not a TF Serving model config ({error}): fix or remove it. "
            f"Received: export_dir={str(export_dir)!r}"
        ) from None
    if config.WhichOneof("config") == "custom_model_config":
        raise ValueError(
            f"{path} holds a custom_model_config, to which models cannot be added: export to "
            f"another export_dir. Received: export_dir={str(export_dir)!r}"
        )
    return text, config


def header(text):
    """The comment lines (and blank lines among them) at the top of `text`: kept, verbatim, by every rewrite."""
    lines = itertools.takewhile(
        lambda line: not line.strip() or line.lstrip().startswith("#"), text.splitlines(keepends=True)
    )
    kept = "".join(lines)
    return kept if not kept or kept.endswith("\n") else kept + "\n"


def lost_comment_lines(text):
    """The numbers (from 1) of the lines after the header that hold a comment: a rewrite cannot keep them."""
    first = len(header(text).splitlines()) + 1
    return [
        number for number, line in enumerate(text.splitlines(), 1) if number >= first and "#" in _STRING.sub("", line)
    ]


def write(path, config, old_text):
    """Replaces the file `path` with `config`, atomically, keeping `old_text`'s header; returns `path`.

    A comment elsewhere in `old_text` is lost, which a warning naming the file
    says (once: the rewritten file has none left to lose). A symbolic link
    stays a link: the file it points to is replaced, beside itself.
    """
    from google.protobuf import text_format

    path = Path(path)
    lost = lost_comment_lines(old_text)
    if lost:
        more = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
        warnings.warn(
            f"{path}: its comment on line {lost[0]}{more} is not kept: TF Serving's text format has no "
            f"place for comments inside the config, and the package keeps only those at the top of the "
            f"file; move it there to keep it.",
            UserWarning,
            stacklevel=4,
        )
    text = header(old_text) + text_format.MessageToString(config)
    target = path.resolve() if path.is_symlink() else path
    write_atomically(target, lambda tmp: tmp.write_text(text))
    return path
