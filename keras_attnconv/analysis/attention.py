"""What a trained attention model has learned, as NumPy arrays: head centers, their history, probabilities.

The figures (`keras_attnconv.analysis.viz`) draw these; training records the center
history with `AttentionCentersHistory`. Nothing here draws or needs matplotlib.
"""

from pathlib import Path

import keras
import numpy as np
from keras import ops

from keras_attnconv.layers import DiagonalGaussianScore, GaussianScore, QuadraticScore
from keras_attnconv.layers.encoder import encoder_blocks
from keras_attnconv.utils.files import write_atomically


def _centered_blocks(model):
    """The encoder blocks of `model`, which must all have heads with a center (quadratic or Gaussian)."""
    blocks = encoder_blocks(model)
    for block in blocks:
        score = block.attention.position_score
        if not isinstance(score, (QuadraticScore, GaussianScore, DiagonalGaussianScore)):
            what = "no relative position" if score is None else type(score).__name__
            raise ValueError(
                f"`model` must have attention heads with a center (the quadratic and Gaussian encodings): its "
                f"block {block.name!r} has {what} scores. Received: model={model.name!r}"
            )
    return blocks


def layer_centers(model):
    """``{block name: (centers (heads, 2), covariances (heads, 2, 2))}`` as NumPy arrays."""
    return {
        block.name: (
            ops.convert_to_numpy(block.attention.position_score.centers),
            block.attention.position_score.covariances,
        )
        for block in _centered_blocks(model)
    }


def _on_the_grid(scores):
    """One example's (heads, T, T) probabilities from a layer's scores; a window's keys placed at their positions.

    A windowed layer returns ``(probabilities (batch, heads, T, K), key_indices (T, K))``: every key outside a
    query's window has weight 0.
    """
    if not isinstance(scores, (tuple, list)):
        return ops.convert_to_numpy(scores)[0]
    probabilities, key_indices = ops.convert_to_numpy(scores[0])[0], ops.convert_to_numpy(scores[1])
    heads, tokens, _ = probabilities.shape
    dense = np.zeros((heads, tokens, tokens), probabilities.dtype)
    queries = np.broadcast_to(np.arange(tokens)[:, None], key_indices.shape)
    np.add.at(dense, (slice(None), queries, key_indices), probabilities)  # adds: a clipped window may repeat a key
    return dense


def attention_probabilities(model, image):
    """Attention probabilities of every block for one uint8 image (H, W, 3): a list of (heads, T, T) arrays.

    Windowed blocks give theirs on the whole grid too (0 outside each query's window).
    """
    blocks = encoder_blocks(model)
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.shape != tuple(model.input_shape[1:]):
        raise ValueError(
            f"`image` must be one uint8 image of shape {tuple(model.input_shape[1:])}, the raw pixels. "
            f"Received: image {image.dtype} {image.shape}"
        )
    inputs_model = keras.Model(model.inputs, [block.input for block in blocks])
    block_inputs = inputs_model([image[None]])
    block_inputs = block_inputs if isinstance(block_inputs, (list, tuple)) else [block_inputs]
    return [_on_the_grid(block.attention(x, return_attention_scores=True)[1]) for block, x in zip(blocks, block_inputs)]


class AttentionCentersHistory(keras.callbacks.Callback):
    """Records every head's center at the end of each epoch (the paper's Figure 3).

    ``history[block_name]`` is a list with one (heads, 2) array per epoch;
    the first entry is the initial state, recorded when training begins.

    Args:
        path: optional ``.npz`` file rewritten (atomically) after every epoch
            and read back when a resumed run starts; see `load_centers_history`.
        initial_epoch: the epoch a resumed run starts from: the entries of
            later epochs found in `path` (written before a kill, their epoch
            not backed up) are dropped, since the run redoes those epochs.
    """

    def __init__(self, path=None, initial_epoch=0):
        super().__init__()
        self.path = path
        saved = load_centers_history(path) if path is not None else {}
        self.history = {name: epochs[: initial_epoch + 1] for name, epochs in saved.items()}

    def _record(self):
        for name, (centers, _) in layer_centers(self.model).items():
            self.history.setdefault(name, []).append(centers.copy())
        if self.path is not None:
            arrays = {name: np.stack(epochs) for name, epochs in self.history.items()}
            write_atomically(self.path, lambda tmp: np.savez(tmp, **arrays))

    def on_train_begin(self, logs=None):
        if not self.history:
            self._record()

    def on_epoch_end(self, epoch, logs=None):
        self._record()


def load_centers_history(path):
    """The history saved by `AttentionCentersHistory(path)`, or {} if there is none yet."""
    if not Path(path).exists():
        return {}
    with np.load(path) as saved:
        return {name: list(saved[name]) for name in saved.files}
