"""Which path position-only attention takes on which device: the rule behind `attention_mode_for`.

Position-only heads (no term depends on the input) have probabilities that
are the same for every example. With a separable score they can be applied
as a row pass and a column pass (``"separable"``, ``T (H + W)`` multiply-adds
per channel and head) or as one dense ``(heads, T, T)`` contraction
(``"position"``, ``T^2``). Which is faster depends on the device, not on the
FLOP count alone:

- CPU: the separable passes wherever they do fewer FLOPs (``H + W < H W``).
- GPU/TPU: the dense contraction, one large matmul on the tensor cores, up to
  `ACCELERATOR_DENSE_MAX_TOKENS` tokens, where its ``(heads, T, T)``
  probabilities are still small (9 x 1024 x 1024 floats = 36 MiB); beyond it,
  the separable passes, whose FLOP savings (``T / (H + W)``) then win over
  their 2 x heads small matmuls.

Layers with a window (neighbourhood attention) choose between the tiled
windowed path (``tiles * Bq * Rk`` scores, `keras_attnconv.layers.neighbourhood`)
and global attention with the window as a mask (``T^2`` scores): see
`prefers_windowed`. `attention_mode` puts the rules together into the path a
`RelativeMultiHeadAttention` takes on a grid. `folds_content_position` says
where the content-position term of an encoding with per-axis tables is folded
into the query projection (accelerators), `folds_key_projection` where content
attention folds the key projection into the queries (accelerators), and
`paths_for` makes layers take another platform's paths (to compile ahead of
time for it).

The measurements behind each rule are in docs/performance.md ("Attention
paths on a CPU", "Local attention on a CPU", "The attention path per
device"); `attnconv bench` re-measures them on every run (the CPU suite's
layer tables; the GPU suite runs the quadratic model on both paths).
"""

import contextlib
import functools

import keras

# The largest grid (H*W tokens) for which accelerators take the dense position path.
ACCELERATOR_DENSE_MAX_TOKENS = 1024
PLATFORMS = ("cpu", "gpu", "tpu")


@functools.cache
def default_platform():
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: where the current Keras backend places computations by default."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() if jax.default_backend() in PLATFORMS else "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        for platform in ("tpu", "gpu"):
            if tf.config.list_logical_devices(platform.upper()):
                return platform
        return "cpu"
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def checked_platform(platform):
    """`platform`, or where None the one `paths_for` names, else this machine's; ValueError naming the argument
    for anything else."""
    platform = platform or (_PATHS_FOR[-1] if _PATHS_FOR else default_platform())
    if platform not in PLATFORMS:
        raise ValueError(f"`platform` must be one of {PLATFORMS}. Received: platform={platform!r}")
    return platform


_PATHS_FOR = []  # the platforms of the `paths_for` blocks entered, innermost last


@contextlib.contextmanager
def paths_for(platform):
    """Inside the block, layers take the paths the rules pick on `platform` instead of this machine's.

    For compiling ahead of time for another device: the plan suite (`attnconv bench --suite plan`)
    builds and traces a GPU's training step on a CPU. Layers built outside the block keep their path.
    """
    _PATHS_FOR.append(checked_platform(platform))
    try:
        yield
    finally:
        _PATHS_FOR.pop()


def prefers_separable(height, width, platform=None):
    """Whether separable row/column passes beat the dense position contraction on `platform` (default: this one)."""
    platform = checked_platform(platform)
    fewer_flops = height + width < height * width
    if platform == "cpu":
        return fewer_flops
    return fewer_flops and height * width > ACCELERATOR_DENSE_MAX_TOKENS


def folds_content_position(platform=None):
    """Whether the content-position term of an encoding with per-axis tables is folded into the query projection.

    Folded (`attention_paths.shift_score_kernel`), the tokens are projected onto every row and
    column shift's encoding and each pair reads its two shifts: fewer bytes moved (the tokens
    are read instead of the 9x wider queries, and nothing of the queries' size is re-laid out),
    about 4x the term's FLOPs. XLA's plan of `learned_content`'s step for an H200 (`attnconv
    bench --suite plan`) moves 11% fewer bytes folded: accelerators fold. On a CPU the step is
    bound by FLOPs, not bytes, and the term is computed from the queries per image row and column:
    folded, `learned_content_tiny`'s step took 6% longer with TensorFlow on a 2-core AMD EPYC, on
    XLA and in a graph (docs/performance.md, "A GPU's step compiled without the GPU").
    """
    return checked_platform(platform) != "cpu"


def folds_key_projection(key_dim, input_dim, platform=None):
    """Whether content attention folds its key projection into the queries (`key_folded_attention`).

    Folded, the keys are the tokens and every matmul of the scores, the softmax and the contexts
    runs in one (batch, query, head, key) layout: no key projection, and no re-layout of the
    queries, the keys or the probabilities, which the (batch, head, query, key) layout of the
    unfolded path needs at each matmul. It pays where ``key_dim >= input_dim`` (the folded queries
    are heads * input_dim wide, the queries and keys 2 * heads * key_dim): XLA's plan of
    `learned_content`'s step for an H200 (`attnconv bench --suite plan`) moves fewer bytes and does
    fewer FLOPs folded (docs/performance.md, "A GPU's step compiled without the GPU"), so
    accelerators fold. A CPU keeps the unfolded path, on which its path rule and measurements were
    made: folded, `learned_content_tiny`'s step with TensorFlow on a 2-core AMD EPYC with AVX2 took
    1-4% less, on XLA and in a graph, within that machine's noise, and was not measured on the
    other CPU kinds (same notes).
    """
    return checked_platform(platform) != "cpu" and key_dim >= input_dim


# The windowed path is taken when it scores at most this fraction of the T^2 pairs of global attention.
WINDOWED_MAX_PAIR_FRACTION = 0.5


def prefers_windowed(neighbourhood, platform=None):
    """Whether the tiled windowed path beats global attention with a window mask on `platform`.

    The tiles score ``neighbourhood.tile_pairs`` (query, key) pairs, global attention ``T^2``,
    but the tiles pay for gathering their key regions and for smaller matmuls: they run where
    they score at most `WINDOWED_MAX_PAIR_FRACTION` of the pairs (measured faster there on a CPU,
    docs/performance.md, "Local attention on a CPU"). Where one tile would cover the map (a
    fraction of 1, e.g. a 7x7 window on 8x8 tokens), the global path with a mask runs.
    Accelerators use the same rule, unmeasured there (`platform` is only checked).
    """
    checked_platform(platform)
    tokens = neighbourhood.height * neighbourhood.width
    return neighbourhood.tile_pairs <= WINDOWED_MAX_PAIR_FRACTION * tokens * tokens


def attention_mode(
    height,
    width,
    uses_content,
    separable="auto",
    windowed="auto",
    position_score=None,
    attention_span=None,
    neighbourhood=None,
    platform=None,
    fast_paths=True,
):
    """The path an attention with these arguments takes on a ``height x width`` grid (`attention_mode_for`).

    Args:
        height, width: the grid.
        uses_content: whether a score term depends on the input.
        separable, windowed: the attention's arguments (``"auto"``, True or False).
        position_score: its `PositionScore` (read for position-only heads: whether it is separable).
        attention_span: its `AttentionSpan`, or None.
        neighbourhood: the `Neighbourhood` of its window on the grid, or None (global attention).
        platform: ``"cpu"``, ``"gpu"``, ``"tpu"`` or None (this machine's).
        fast_paths: False keeps to the global paths (``"content"``, ``"position"``).

    Returns:
        ``"content"`` (probabilities per example), ``"position"`` (one (heads, T, T)
        probability tensor per call, shared by the batch), ``"separable"`` (a row pass and a
        column pass per head; with a window, each axis masked outside its window), or, with a
        window, ``"windowed_content"`` / ``"windowed_position"`` (the tiled neighbourhood path,
        per example / shared by the batch). With a window, "content" and "position" are global
        attention with the window as a mask. ValueError where ``separable=True`` cannot be
        honoured.
    """
    if not fast_paths:
        checked_platform(platform)
        return "content" if uses_content else "position"
    if neighbourhood is not None and windowed is not False:
        tiled = windowed is True or prefers_windowed(neighbourhood, platform)
    else:
        tiled = False
    if uses_content:
        return "windowed_content" if tiled else "content"
    if separable is False:
        return "windowed_position" if tiled else "position"
    span_separable = attention_span is None or attention_span.separable
    window_separable = neighbourhood is None or not neighbourhood.flat
    if not (position_score.separable and span_separable and window_separable):
        if separable is True:
            reason = (
                f"{type(position_score).__name__} scores are"
                if not position_score.separable
                else "A 1-D window is"
                if not window_separable
                else "An attention span with a threshold, a max_window (or 1-D) is"
            )
            raise ValueError(f"{reason} not separable by axis. Received: separable=True")
        return "windowed_position" if tiled else "position"
    if separable is True or (windowed is not True and prefers_separable(height, width, platform)):
        return "separable"
    return "windowed_position" if tiled else "position"


def check_path_arguments(separable, windowed, uses_content, score, window, span, overriding_class=None):
    """ValueError naming `separable` or `windowed` where an attention cannot take the path they ask for.

    ``score``: the attention's position score, or the class of a named one; ``window``: its
    (checked) window pair or None; ``span``: its `AttentionSpan` or None; ``overriding_class``: the
    name of a `RelativeMultiHeadAttention` subclass that overrides `_compute_attention`, else None.
    """
    if windowed not in ("auto", True, False):
        raise ValueError(f"`windowed` must be 'auto', True or False. Received: windowed={windowed!r}")
    if separable is True and not uses_content and not score.separable:
        raise ValueError(
            f"{getattr(score, '__name__', type(score).__name__)} scores are not separable by axis. "
            "Received: separable=True"
        )
    span_window = span.window if span is not None else None
    if span_window is not None and window is not None and span_window != (window, (1, 1), False):
        raise ValueError(
            f"The attention span's max_window={span.max_window} (span_dims={span.span_dims}) differs "
            f"from the layer's window. Received: window={window}"
        )
    if windowed is True and window is None and span_window is None:
        raise ValueError(
            "`windowed=True` needs a `window` (or an attention span with `max_window`). "
            "Received: windowed=True, window=None"
        )
    if windowed is True and separable is True:
        raise ValueError(
            "`windowed=True` and `separable=True` force two different paths. Received: windowed=True, separable=True"
        )
    if overriding_class is not None and (separable is True or windowed is True):
        raise ValueError(
            f"{overriding_class} overrides `_compute_attention`, which the separable and windowed "
            f"paths do not call. Received: separable={separable!r}, windowed={windowed!r}"
        )
