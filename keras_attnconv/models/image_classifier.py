"""What every model family of the zoo shares: its config's preprocessing fields, the uint8 input, the head.

A family is a frozen config dataclass (a `ClassifierConfig`) and an
`ImageClassifier` subclass built from it, in keras-hub's ``Backbone`` pattern: a
functional `keras.Model` built in ``__init__`` from its constructor arguments,
which are the config's fields (plus ``dtype`` and ``name``) and which
``get_config()`` returns. So a ``.keras`` file reloads as the same class, with
the same configuration, preprocessing and class names.

The config validates the fields, once: ``config.build()`` hands the validated
config to the model (``config=``), which does not check it again.
"""

import dataclasses
import inspect
import numbers

import keras
import numpy as np

from keras_attnconv.layers import MirrorAverage, MirroredBatch, PixelNormalization
from keras_attnconv.layers.pixel_normalization import check_normalization
from keras_attnconv.models.cifar import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
from keras_attnconv.models.failed_calls import model_kept_on_error, note_values_to_detach
from keras_attnconv.models.image_input import check_images, checked_python_batches
from keras_attnconv.models.step_compilation import resolve_jit_compile_for
from keras_attnconv.models.training_state import build_training_state
from keras_attnconv.models.validation import dtype_policy
from keras_attnconv.utils.checks import check_bool, check_known_fields, check_positive_int, plain_numbers


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
    """The fields every model family has: what it classifies and how it reads an image.

    Attributes:
        num_classes: classes of the classifier (an integer >= 2).
        image_size: side of the square uint8 input image.
        class_names: None (CIFAR-10's names for 10 classes, else "0", "1", ...)
            or one distinct name per class.
        pixel_mean, pixel_std: per-channel statistics of the pixels scaled to
            [0, 1] that the model normalises its input with (CIFAR-10's training set).
        test_time_flips: at inference (``evaluate``, ``predict``, a call
            without ``training=True``, every export), the logits are the mean
            of the image's and its mirror image's (`MirroredBatch`,
            `MirrorAverage`), which doubles the cost of inference; training is
            unchanged, and so are the weights (``model.with_config(test_time_flips=True)``
            adds them to a trained model). The FLOP counts are of one pass.
    """

    num_classes: int = 10
    image_size: int = 32
    class_names: "tuple[str, ...] | None" = None
    pixel_mean: "tuple[float, float, float]" = CIFAR10_MEAN
    pixel_std: "tuple[float, float, float]" = CIFAR10_STD
    test_time_flips: bool = False

    def __post_init__(self):
        num_classes = self.num_classes
        if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an integer >= 2. Received: num_classes={num_classes!r}")
        check_positive_int("image_size", self.image_size)
        check_bool("test_time_flips", self.test_time_flips)
        plain_numbers(self)
        mean, std = check_normalization(self.pixel_mean, self.pixel_std, names=("pixel_mean", "pixel_std"))
        self._set("pixel_mean", mean)
        self._set("pixel_std", std)
        if self.class_names is not None:
            names = self.class_names
            names = names.tolist() if hasattr(names, "tolist") else names  # a NumPy array: its Python lists
            if (
                isinstance(names, str)
                or not isinstance(names, (list, tuple))
                or len(names) != num_classes
                or not all(isinstance(n, str) and n for n in names)
                or len(set(names)) != len(names)
            ):
                raise ValueError(
                    f"`class_names` must be None or {num_classes} distinct non-empty strings, one per "
                    f"class (a list or a 1-D array). Received: class_names={names!r}"
                )
            self._set("class_names", tuple(names))

    #: The `ImageClassifier` subclass that builds this config (set by it: `ImageClassifier.__init_subclass__`).
    model_class = None

    def build(self, name=None, dtype=None):
        """The family's model of this config (no second validation), every layer in the dtype policy `dtype`."""
        if self.model_class is None:
            raise TypeError(
                f"No ImageClassifier subclass builds {type(self).__name__}: a family's model class "
                f"declares it (config_class = {type(self).__name__})."
            )
        return self.model_class(config=self, name=name, dtype=dtype)

    def _set(self, field, value):
        object.__setattr__(self, field, value)  # normalising a field of the frozen dataclass in __post_init__

    @property
    def preprocessing(self):
        """What a client of this config's model (or of its exports) needs to know about its input and output."""
        size = self.image_size
        return {
            "input": {"name": "images", "dtype": "uint8", "shape": [None, size, size, 3]},
            "normalization": {"mean": list(self.pixel_mean), "std": list(self.pixel_std)},
            "class_names": list(self.resolved_class_names),
        }

    @property
    def resolved_class_names(self):
        """The class names: `class_names`, or the default for `num_classes`."""
        if self.class_names is not None:
            return self.class_names
        return CIFAR10_CLASSES if self.num_classes == 10 else tuple(str(i) for i in range(self.num_classes))

    @classmethod
    def from_fields(cls, fields, owner):
        """``cls(**fields)``, an unknown field being a ValueError naming it and the closest valid one."""
        check_known_fields(fields, [f.name for f in dataclasses.fields(cls)], owner)
        return cls(**fields)


def _reads_probabilities(loss):
    """Whether `loss` (a Keras loss, its name or its function) reads predictions as probabilities."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:  # an unknown name: Keras' compile names it
            return False
    if isinstance(loss, keras.losses.Loss):
        return loss.get_config().get("from_logits") is False
    if callable(loss):
        try:
            parameter = inspect.signature(loss).parameters.get("from_logits")
        except (TypeError, ValueError):  # a callable without a signature
            return False
        return parameter is not None and parameter.default is False
    return False


def _loss_name(loss):
    if isinstance(loss, keras.losses.Loss):
        return f"{type(loss).__name__}(name={loss.name!r}, from_logits=False)"
    return repr(loss) if isinstance(loss, str) else getattr(loss, "__name__", repr(loss))


#: The classification head: the one layer whose weights depend on the number of classes (`with_config`).
HEAD_LAYER = "logits"


def copy_weights(source, target, *, new_head=False):
    """Sets every weight of the model `target` to `source`'s, but its head's (`HEAD_LAYER`) where `new_head`.

    Layer by layer, by name: test-time flips add or remove layers, which have
    no weights. Raises ValueError where the two models' layers with weights
    differ, in name or in their weights' shapes.
    """
    weighted = [layer for layer in target.layers if layer.weights]
    if [layer.name for layer in weighted] != [layer.name for layer in source.layers if layer.weights]:
        raise ValueError("the layers with weights are not this model's")
    for layer in weighted:
        if not (new_head and layer.name == HEAD_LAYER):
            layer.set_weights(source.get_layer(layer.name).get_weights())


class ImageClassifier(keras.Model):
    """Base class of the zoo's models: uint8 images -> `PixelNormalization` -> features -> pool -> float32 logits.

    A subclass sets `config_class` and `default_name` and implements the
    static method ``features(x, config, dtype)``, the family's layers between
    the normalised image and the pooled features.

    Args:
        dtype: the dtype policy of every layer (a name or a
            `keras.DTypePolicy`; None: Keras' global policy, which is never
            changed). The normalisation and the logits are float32 under any
            policy; the model's own ``dtype_policy`` is set too, so that
            ``compile`` scales the loss for ``"mixed_float16"``.
        name: the model's name, its identity when saved and exported
            (`build_model` gives the registered name).
        config: instead of the fields, a `config_class` instance, which
            validated them when it was made (``config.build()`` passes it).
        **fields: the fields of `config_class`.

    Call arguments:
        inputs: uint8 images (batch, image_size, image_size, 3), the raw
            pixels; anything else is a ValueError (a float image would be
            cast to uint8 and give silently wrong outputs).
    """

    config_class = None
    default_name = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__ and cls.config_class is not None:
            cls.config_class.model_class = cls  # the family's config builds this class (`ClassifierConfig.build`)

    def __init__(self, *args, config=None, dtype=None, name=None, trainable=True, **fields):
        if args:  # a functional model's (inputs, outputs): `keras.models.clone_model` (see `_run_through_graph`)
            self._init_clone(*args, name=name)
            return
        if config is None:
            config = self.config_class.from_fields(fields, type(self).__name__)
        elif not isinstance(config, self.config_class) or fields:
            raise ValueError(
                f"{type(self).__name__} takes its config's fields, or `config`, a {self.config_class.__name__} "
                f"(already validated), alone. Received: config of class {type(config).__name__}"
                + (f" and the fields {', '.join(fields)}" if fields else "")
            )
        policy = dtype_policy(dtype)
        images = keras.Input((config.image_size, config.image_size, 3), dtype="uint8", name="images")
        x = MirroredBatch(name="mirrored_batch")(images) if config.test_time_flips else images
        x = PixelNormalization(config.pixel_mean, config.pixel_std, name="pixel_normalization")(x)
        x = self.features(x, config, policy)
        x = keras.layers.GlobalAveragePooling2D(dtype=policy, name="pool")(x)
        # The logits stay float32 under any policy, so the softmax and the loss are computed in float32.
        logits = keras.layers.Dense(
            config.num_classes, dtype="float32", name=HEAD_LAYER, **self.head_initializers(config)
        )(x)
        if config.test_time_flips:
            logits = MirrorAverage(name="mirror_average")(logits)
        super().__init__(images, logits, name=name or self.default_name, trainable=trainable)
        self.config = config
        self.dtype_policy = policy  # as keras-hub's Backbone: `compile` reads it (loss scaling for mixed_float16)

    def _run_through_graph(self, inputs, operation_fn=lambda op: op, call_fn=None):
        # `keras.models.clone_model` runs the graph on new inputs with cloned layers, then calls this
        # class with the result as a functional model's (inputs, outputs), which say nothing of the
        # config: symbolic outputs carry it, so that the clone is of this class with this config.
        outputs = super()._run_through_graph(inputs, operation_fn=operation_fn, call_fn=call_fn)
        if isinstance(outputs, keras.KerasTensor):
            outputs._classifier_config = self.get_config()
        return outputs

    def _init_clone(self, inputs, outputs, name=None):
        config = getattr(outputs, "_classifier_config", None)
        if config is None:
            raise ValueError(
                f"{type(self).__name__} is built from its config fields, not from a graph's inputs and "
                f"outputs (only keras.models.clone_model passes those). Received: outputs={outputs!r}"
            )
        fields = {k: v for k, v in config.items() if k not in ("name", "trainable", "dtype")}
        super().__init__(inputs, outputs, name=name or config["name"], trainable=config["trainable"])
        self.config = self.config_class.from_fields(fields, type(self).__name__)
        self.dtype_policy = dtype_policy(config["dtype"])

    @staticmethod
    def features(x, config, dtype):
        raise NotImplementedError

    @classmethod
    def head_initializers(cls, config):
        """Keyword arguments of the classifier head's initializers (none: Keras' defaults)."""
        return {}

    def _check_images(self, inputs):
        check_images(self._in_words, self.config.image_size, inputs)

    def _checked_batches(self, data):
        return checked_python_batches(data, self._in_words, self.config.image_size)

    @property
    def _in_words(self):
        return f"{type(self).__name__} {self.name!r}"

    def __call__(self, inputs, *args, **kwargs):
        self._check_images(inputs)  # here too, before Keras adds the whole input tensor to the message
        shape = getattr(keras.tree.flatten(inputs)[0], "shape", ())
        if len(shape) and shape[0] == 0:  # as `predict`: a ResNet's layers fail on it with a misleading message
            raise ValueError(f"{self._in_words} got no images to classify. Received: images of shape {tuple(shape)}")
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, training=None, mask=None, **kwargs):
        self._check_images(inputs)  # `fit` on JAX calls `call` directly (stateless_call)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """`keras.Model.compile` with defaults for a classifier of logits, as keras-hub's tasks have.

        Args:
            optimizer: ``"auto"`` is ``keras.optimizers.Adam()`` (learning rate 1e-3).
            loss: ``"auto"`` is ``SparseCategoricalCrossentropy(from_logits=True)``. The model outputs
                logits: a loss that would read them as probabilities (``from_logits=False``: the names
                ``"sparse_categorical_crossentropy"``, ``"categorical_crossentropy"``, their functions,
                or those losses made without ``from_logits=True``) is a ValueError naming it: it would
                train silently with another loss.
            metrics: ``"auto"`` is ``["accuracy"]`` (of integer or one-hot labels).
            **kwargs: the other arguments of `keras.Model.compile`.
        """
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam()
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if metrics == "auto":
            metrics = ["accuracy"]  # Keras picks sparse or one-hot accuracy from the labels
        for item in keras.tree.flatten(loss):
            if _reads_probabilities(item):
                raise ValueError(
                    f"{self._in_words} outputs logits, and this loss would read "
                    "them as probabilities. Pass a loss with from_logits=True, e.g. keras.losses."
                    "SparseCategoricalCrossentropy(from_logits=True), or compile() without a loss for "
                    f"that one. Received: loss={_loss_name(item)}"
                )
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def _resolve_auto_jit_compile(self):
        # Keras' `jit_compile="auto"` leaves XLA off on every CPU; this package's rule (`step_compilation`)
        # decides by what was measured on the device and precision, for the model's size.
        # As Keras, no XLA under tf.distribute.
        if getattr(self, "_distribute_strategy", None) is not None:
            return False
        return resolve_jit_compile_for(self)

    def compile_from_config(self, config):
        # As Keras' own, which skips a custom `compile`: the config holds the arguments this one resolved.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)  # so that saved optimizer variables load

    def fit(self, x=None, y=None, *args, **kwargs):
        # A label out of range trains on garbage (JAX) or fails deep in the backend (TensorFlow). Checked
        # here on NumPy labels only, once per fit: a dataset's labels would cost a pass over the data.
        self._check_labels(y, "y")
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and len(validation) >= 2:
            self._check_labels(validation[1], "validation_data")
        build_training_state(self, x, y)
        if "validation_data" in kwargs:
            kwargs["validation_data"] = self._checked_batches(kwargs["validation_data"])
        with model_kept_on_error(self):
            return super().fit(self._checked_batches(x), y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        with model_kept_on_error(self):
            return super().evaluate(self._checked_batches(x), y, *args, **kwargs)

    def _purge_model_variables(self, *args, **kwargs):
        # Keras' JAX trainer detaches the variables' values for the length of a call: noted first (failed_calls).
        note_values_to_detach(self)
        return super()._purge_model_variables(*args, **kwargs)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        build_training_state(self, x, y)
        return super().train_on_batch(x, y, *args, **kwargs)

    def _check_labels(self, labels, argument):
        labels = np.asarray(labels) if isinstance(labels, (np.ndarray, list)) else None
        sparse = (
            labels is not None
            and labels.size
            and labels.dtype.kind in "iuf"
            and (labels.ndim <= 1 or labels.shape[-1] == 1)
        )  # one-hot labels have one column per class
        if sparse and not (labels.min() >= 0 and labels.max() < self.config.num_classes):
            bad = labels.min() if labels.min() < 0 else labels.max()
            raise ValueError(
                f"{self._in_words} has {self.config.num_classes} classes: labels "
                f"must lie in [0, {self.config.num_classes}). Received: {argument} with the label {bad}"
            )

    def predict(self, x, *args, **kwargs):
        if hasattr(x, "shape") and len(x.shape) and x.shape[0] == 0:  # Keras fails on it with an UnboundLocalError
            raise ValueError(f"{self._in_words} got no images to predict. Received: x of shape {tuple(x.shape)}")
        with model_kept_on_error(self):
            return super().predict(self._checked_batches(x), *args, **kwargs)

    @property
    def class_names(self):
        """The name of each class, in the order of the logits."""
        return self.config.resolved_class_names

    @property
    def preprocessing(self):
        """What a client of the model (or of any of its exports) needs to know about its input and output."""
        return self.config.preprocessing

    @classmethod
    def from_preset(cls, preset, *, dtype=None, load_weights=True, **head):
        """keras-hub's spelling of `keras_attnconv.from_preset`: ``AttentionClassifier.from_preset(path)``.

        The same arguments and the same model, which must be of this class (or a subclass of it): a preset or
        registered name of another family is a ValueError naming both classes, as keras-hub refuses a preset
        of another task. ``ImageClassifier.from_preset`` loads any model of the package.
        """
        from keras_attnconv.models.registry import preset_model  # the registry stands on this module

        return preset_model(preset, dtype, load_weights, head, model_class=cls)

    def save_to_preset(self, preset_dir, *, metadata=None, overwrite=False):
        """keras-hub's spelling of `keras_attnconv.save_to_preset` (``model.save_to_preset(path)``): the same
        arguments, files and result."""
        from keras_attnconv.models.presets import save_to_preset

        return save_to_preset(self, preset_dir, metadata=metadata, overwrite=overwrite)

    def with_config(self, **changes):
        """A new model of this class whose config has `changes`, holding this model's weights.

        E.g. ``model.with_config(dtype="float32")`` is the float32 copy of a
        model trained in mixed precision; `changes` must keep every weight's
        shape, but for a new number of classes: ``model.with_config(num_classes=5,
        class_names=[...])`` has a new classification head (the ``logits`` layer,
        initialised as a new model's) on this model's features, every other
        weight kept, to fine-tune on other classes (timm's and keras-hub's
        ``num_classes`` of a pretrained model). Its class names are then
        `class_names` where given, else the default for the new number.
        """
        config = {**self.get_config(), **changes}
        new_head = config["num_classes"] != self.config.num_classes
        if new_head and "class_names" not in changes:
            config["class_names"] = None  # the old names are of the old classes
        copy = type(self).from_config(config)
        try:
            copy_weights(self, copy, new_head=new_head)
        except ValueError as error:
            raise ValueError(
                f"`with_config` changes must keep every weight's shape, but for a new `num_classes` ({error}). "
                f"Received: {', '.join(f'{k}={v!r}' for k, v in changes.items())}"
            ) from None
        return copy

    def get_config(self):
        # Not chained to super(): a functional model's config is its layer graph, which __init__ builds.
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": self.dtype_policy.name,
            **dataclasses.asdict(self.config),
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
