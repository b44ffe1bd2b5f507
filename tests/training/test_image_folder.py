"""Specifications of image folders as datasets: layouts, labels, pixels, statistics, cache, skipped files, errors."""

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from PIL import Image
from support import snapshot

from keras_attnconv.training import data, image_folder

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache directory of the test's own (never ~/.cache), and no decoded folder kept from another test."""
    monkeypatch.setenv("KERAS_ATTNCONV_CACHE", str(tmp_path / "cache"))
    forget_in_process()
    yield tmp_path / "cache" / "image_folders"
    forget_in_process()


def forget_in_process():
    """What a new process would know of the folders: only the cache files."""
    image_folder._SCANS.clear()
    image_folder._decoded.cache_clear()


def write_image(path, pixels):
    """Writes `pixels` (uint8 HxWx3, or HxW for grey) as PNG or JPEG, as the suffix says."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else "PNG")
    return pixels


def make_folder(root, counts, splits=("train", "test"), size=8, suffix=".png"):
    """A folder of random PNG images: ``root/<split>/<class>/<i>.png`` ({class: count}), or ``root/<class>/...``
    without `splits`. Returns {relative path: pixels}."""
    written = {}
    for split in splits or [""]:
        for name, count in counts.items():
            for i in range(count):
                relative = os.path.join(split, name, f"{i:02d}{suffix}")
                written[relative] = write_image(root / relative, RNG.integers(0, 256, (size, size, 3), np.uint8))
    return written


def expected_split(written, split, class_names):
    """(images, labels) of `split` as the folder spells them: classes sorted, files sorted in each class."""
    paths = sorted(
        (p for p in written if p.split(os.sep)[0] == split), key=lambda p: (class_names.index(p.split(os.sep)[1]), p)
    )
    return np.stack([written[p] for p in paths]), np.array([class_names.index(p.split(os.sep)[1]) for p in paths])


def test_a_folder_of_train_and_test_folders_has_those_splits_and_evaluates_on_test(tmp_path):
    make_folder(tmp_path / "pets", {"cat": 3, "dog": 2}, splits=("train", "test", "validation"))
    info = data.dataset_info(str(tmp_path / "pets"))
    assert (info.num_classes, info.eval_split, info.image_size) == (2, "test", 8)
    for split, count in [("train", 5), ("test", 5), ("validation", 5)]:
        assert len(data.load_arrays(str(tmp_path / "pets"), split)[0]) == count
    with pytest.raises(ValueError, match=r"has no split 'extra'; it has \['test', 'train', 'validation'\]"):
        data.load_arrays(str(tmp_path / "pets"), "extra")


def test_a_folder_with_a_validation_split_and_no_test_split_evaluates_on_validation(tmp_path):
    make_folder(tmp_path / "f", {"a": 1, "b": 1}, splits=("train", "validation"))
    assert data.dataset_info(str(tmp_path / "f")).eval_split == "validation"


def test_load_dataset_gives_a_folder_as_a_tf_data_pipeline(tmp_path):
    make_folder(tmp_path / "f", {"a": 2, "b": 3})
    images, labels = next(iter(data.load_dataset(str(tmp_path / "f"), "test", batch_size=5)))
    expected_images, expected_labels = data.load_arrays(str(tmp_path / "f"), "test")
    np.testing.assert_array_equal(images.numpy(), expected_images)
    np.testing.assert_array_equal(labels.numpy(), expected_labels)


def test_class_names_are_the_sorted_folder_names_and_labels_their_index(tmp_path):
    written = make_folder(tmp_path / "zoo", {"zebra": 2, "ant": 3, "Moose": 1, "bee": 2})
    info = data.dataset_info(str(tmp_path / "zoo"))
    assert info.class_names == ("Moose", "ant", "bee", "zebra")
    for split in ("train", "test"):
        images, labels = data.load_arrays(str(tmp_path / "zoo"), split)
        expected_images, expected_labels = expected_split(written, split, info.class_names)
        assert labels.dtype == np.int64 and labels.tolist() == expected_labels.tolist()
        np.testing.assert_array_equal(images, expected_images)  # each image with its own label


def test_png_pixels_round_trip_exactly_and_grey_images_become_rgb(tmp_path):
    colour = write_image(tmp_path / "f" / "train" / "a" / "colour.png", RNG.integers(0, 256, (8, 8, 3), np.uint8))
    grey = write_image(tmp_path / "f" / "train" / "b" / "grey.PNG", RNG.integers(0, 256, (8, 8), np.uint8))
    make_folder(tmp_path / "f", {"a": 1, "b": 1}, splits=("test",))
    images, labels = data.load_arrays(str(tmp_path / "f"), "train")
    assert images.dtype == np.uint8 and labels.tolist() == [0, 1]
    np.testing.assert_array_equal(images[0], colour)
    np.testing.assert_array_equal(images[1], np.repeat(grey[..., None], 3, axis=-1))


def test_sixteen_bit_grey_pngs_are_scaled_to_eight_bits_not_clipped(tmp_path):
    # Pillow's convert("RGB") clips a 16-bit grey image at 255: most of such an image came out white.
    grey = RNG.integers(0, 256, (8, 8)).astype(np.uint16)
    deep = tmp_path / "f" / "train" / "a" / "deep.png"
    deep.parent.mkdir(parents=True)
    Image.fromarray(grey * 257 + RNG.integers(0, 129, (8, 8)).astype(np.uint16)).save(deep)  # within half a step
    assert Image.open(deep).mode.startswith("I")
    make_folder(tmp_path / "f", {"b": 1}, splits=("train",))
    make_folder(tmp_path / "f", {"a": 1, "b": 1}, splits=("test",))
    images, _ = data.load_arrays(str(tmp_path / "f"), "train")
    np.testing.assert_array_equal(images[0], np.repeat(grey.astype(np.uint8)[..., None], 3, axis=-1))


def test_a_palette_png_with_transparency_is_its_colours_without_a_warning(tmp_path):
    rgb = RNG.integers(0, 256, (8, 8, 3), np.uint8)
    palette = Image.fromarray(rgb).convert("P")
    path = tmp_path / "f" / "train" / "a" / "palette.png"
    path.parent.mkdir(parents=True)
    palette.save(path, transparency=bytes([0] * 8 + [255] * 248))  # the first 8 colours transparent
    make_folder(tmp_path / "f", {"b": 1}, splits=("train",))
    make_folder(tmp_path / "f", {"a": 1, "b": 1}, splits=("test",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's "should be converted to RGBA images" fails the test
        images, _ = data.load_arrays(str(tmp_path / "f"), "train")
    np.testing.assert_array_equal(images[0], np.asarray(palette.convert("RGB")))  # its colours, the alpha dropped


def test_jpeg_images_of_any_extension_case_are_decoded(tmp_path):
    smooth = np.broadcast_to(np.linspace(0, 255, 16, dtype=np.uint8)[:, None, None], (16, 16, 3)).copy()
    for name in ("a/one.jpg", "a/two.JPEG", "b/three.Jpg", "b/four.jpeg"):
        write_image(tmp_path / "f" / "train" / name, smooth)
        write_image(tmp_path / "f" / "test" / name, smooth)
    images, labels = data.load_arrays(str(tmp_path / "f"), "train")
    assert images.shape == (4, 16, 16, 3) and labels.tolist() == [0, 0, 1, 1]
    assert np.abs(images.astype(int) - smooth).max() <= 8  # JPEG's loss, not another image


def test_a_folder_without_splits_is_split_by_a_fixed_rule_disjoint_and_complete(tmp_path, monkeypatch):
    written = make_folder(tmp_path / "f", {"a": 20, "b": 9, "c": 2}, splits=None)
    name = str(tmp_path / "f")
    info = data.dataset_info(name)
    (x_train, y_train), (x_test, y_test) = (data.load_arrays(name, split) for split in ("train", "test"))
    assert info.eval_split == "test" and info.class_names == ("a", "b", "c")
    assert np.bincount(y_test).tolist() == [2, 1, 1]  # 10% of each class, at least one
    train, test = (
        {(int(label), image.tobytes()) for image, label in zip(x, y)} for x, y in ((x_train, y_train), (x_test, y_test))
    )
    assert not train & test and len(train) + len(test) == len(written)
    assert train | test == {("abc".index(p.split(os.sep)[0]), pixels.tobytes()) for p, pixels in written.items()}
    # The same split from scratch (no cache, another process), not one drawn at random.
    monkeypatch.setenv("KERAS_ATTNCONV_CACHE", str(tmp_path / "other_cache"))
    forget_in_process()
    np.testing.assert_array_equal(data.load_arrays(name, "test")[0], x_test)


def test_statistics_are_those_of_the_training_images(tmp_path):
    make_folder(tmp_path / "f", {"a": 4, "b": 3}, splits=("train",))
    for i, name in enumerate(["a", "b"]):  # test images unlike the training ones: they must not count
        write_image(tmp_path / "f" / "test" / name / "bright.png", np.full((8, 8, 3), 250 - i, np.uint8))
    info = data.dataset_info(str(tmp_path / "f"))
    images, _ = data.load_arrays(str(tmp_path / "f"), "train")
    assert (info.mean, info.std) == data._channel_statistics(images)
    assert data.pixel_statistics(info, "dataset") == (info.mean, info.std)


def test_the_cache_is_used_by_a_later_process(tmp_path, cache, monkeypatch):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    first = data.load_arrays(str(tmp_path / "f"), "train")
    assert len(list(cache.glob("*.npz"))) == 1
    forget_in_process()

    def fail(*args):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(image_folder, "_decode_chunk", fail)
    again = data.load_arrays(str(tmp_path / "f"), "train")
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(again[1], first[1])


def test_one_process_decodes_a_folder_once_for_its_info_and_splits(tmp_path, monkeypatch):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    calls = []
    decode = image_folder._decode_chunk
    monkeypatch.setattr(image_folder, "_decode_chunk", lambda *args: calls.append(1) or decode(*args))
    scan = image_folder._scan
    monkeypatch.setattr(image_folder, "_scan", lambda *args: calls.append(0) or scan(*args))
    data.dataset_info(str(tmp_path / "f"))
    data.load_arrays(str(tmp_path / "f"), "train")
    data.load_arrays(str(tmp_path / "f"), "test")
    assert calls == [0, 1]  # one scan, one decoding


def test_a_changed_image_is_decoded_again(tmp_path):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    before, _ = data.load_arrays(str(tmp_path / "f"), "train")
    forget_in_process()  # a later process: only the cache file knows the folder
    path = tmp_path / "f" / "train" / "a" / "00.png"
    new = write_image(path, np.full((8, 8, 3), 7, np.uint8))
    os.utime(path, ns=(1, 1))  # whatever the clock's resolution, its mtime changed
    after, _ = data.load_arrays(str(tmp_path / "f"), "train")
    np.testing.assert_array_equal(after[0], new)
    np.testing.assert_array_equal(after[1:], before[1:])


def test_an_image_added_is_seen_by_the_same_process(tmp_path):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    assert len(data.load_arrays(str(tmp_path / "f"), "train")[0]) == 4
    write_image(tmp_path / "f" / "train" / "b" / "new.png", np.zeros((8, 8, 3), np.uint8))
    images, labels = data.load_arrays(str(tmp_path / "f"), "train")
    assert len(images) == 5 and labels.tolist() == [0, 0, 1, 1, 1]


DAMAGES = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:200]),
    "another content's": lambda path: np.savez(
        path, **{**np.load(path), "key": np.array("other"), "x_train": np.zeros((4, 8, 8, 3), np.uint8)}
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cache_file_is_ignored_and_rewritten(tmp_path, cache, damage):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    expected, _ = data.load_arrays(str(tmp_path / "f"), "train")
    [cached] = cache.glob("*.npz")
    DAMAGES[damage](cached)
    forget_in_process()
    np.testing.assert_array_equal(data.load_arrays(str(tmp_path / "f"), "train")[0], expected)
    with np.load(cached) as rewritten:
        np.testing.assert_array_equal(rewritten["x_train"], expected)


def test_nothing_is_written_inside_the_users_folder(tmp_path, cache):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    before = snapshot(tmp_path / "f")
    data.dataset_info(str(tmp_path / "f"))
    data.load_arrays(str(tmp_path / "f"), "test")
    assert snapshot(tmp_path / "f") == before
    assert list(cache.glob("*.npz"))  # the cache is where it belongs


def test_a_cache_directory_inside_the_folder_is_not_written(tmp_path, monkeypatch, capsys):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    monkeypatch.setenv("KERAS_ATTNCONV_CACHE", str(tmp_path / "f" / ".cache"))
    before = snapshot(tmp_path / "f")
    assert len(data.load_arrays(str(tmp_path / "f"), "train")[0]) == 4
    assert snapshot(tmp_path / "f") == before
    assert "not caching" in capsys.readouterr().err


def test_what_is_not_an_image_is_skipped_and_counted_once(tmp_path, capsys):
    make_folder(tmp_path / "f", {"a": 2, "b": 2})
    for junk in (
        ".DS_Store",
        "README.md",
        "train/a/notes.txt",
        "train/a/.hidden.png",
        "test/b/image.gif",
        "train/.git/config",
        "train/b/labels.csv",
    ):
        (tmp_path / "f" / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "f" / junk).write_text("not an image")
    data.dataset_info(str(tmp_path / "f"))
    images, _ = data.load_arrays(str(tmp_path / "f"), "train")
    data.load_arrays(str(tmp_path / "f"), "test")
    assert len(images) == 4
    err = capsys.readouterr().err
    assert err.count("skipped") == 1, err
    assert f"skipped 7 files or folders under {str(tmp_path / 'f')!r} that are not JPEG/PNG images" in err


def test_images_in_folders_below_a_class_folder_belong_to_that_class(tmp_path):
    make_folder(tmp_path / "f", {"a": 1, "b": 1})
    write_image(tmp_path / "f" / "train" / "b" / "more" / "deep.png", np.zeros((8, 8, 3), np.uint8))
    assert data.load_arrays(str(tmp_path / "f"), "train")[1].tolist() == [0, 1, 1]


def quoted(path):
    """The pattern of `path` as a message quotes it."""
    return re.escape(repr(str(path)))


def _empty_class(root):
    make_folder(root, {"a": 2, "b": 2})
    (root / "test" / "c").mkdir()
    (root / "train" / "c").mkdir()
    return ValueError, f"The class folder {quoted(root / 'test' / 'c')} holds no JPEG or PNG images"


def _class_in_one_split(root):
    make_folder(root, {"a": 2, "b": 2})
    write_image(root / "train" / "c" / "x.png", np.zeros((8, 8, 3), np.uint8))
    return ValueError, f"The class 'c' of {quoted(root)} is in its split 'train' but not in 'test'"


def _corrupt_image(root):
    make_folder(root, {"a": 2, "b": 2})
    (root / "test" / "b" / "01.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return ValueError, f"{quoted(root / 'test' / 'b' / '01.png')} cannot be read as a JPEG or PNG image"


def _truncated_jpeg(root):
    make_folder(root, {"a": 2, "b": 2}, suffix=".jpg")
    path = root / "train" / "a" / "00.jpg"
    path.write_bytes(path.read_bytes()[:120])
    return ValueError, f"{quoted(path)} cannot be read as a JPEG or PNG image"


def _no_class_folders(root):
    write_image(root / "loose.png", np.zeros((8, 8, 3), np.uint8))
    return ValueError, f"{quoted(root)} holds no class folders"


def _missing(root):
    return FileNotFoundError, f"No image folder \\(or .npz file\\) at {quoted(root)}. Received: dataset={quoted(root)}"


def _other_size(root):
    make_folder(root, {"a": 2, "b": 2})
    write_image(root / "test" / "a" / "big.png", np.zeros((16, 16, 3), np.uint8))
    return ValueError, (
        f"{quoted(root / 'test' / 'a' / 'big.png')} is 16x16 .* training images are 8x8 .*resize them beforehand"
    )


def _not_square(root):
    for name in ("a", "b"):
        write_image(root / name / "wide.png", np.zeros((8, 12, 3), np.uint8))
    return ValueError, "must be square .* is 8x12"


def _one_class(root):
    make_folder(root, {"a": 2})
    return ValueError, "needs at least 2 class folders"


ERRORS = {
    "an empty class folder": _empty_class,
    "a class in one split only": _class_in_one_split,
    "a corrupt image": _corrupt_image,
    "a truncated JPEG": _truncated_jpeg,
    "no class folders": _no_class_folders,
    "a folder that does not exist": _missing,
    "an image of another size": _other_size,
    "images that are not square": _not_square,
    "a single class": _one_class,
}


@pytest.mark.parametrize("error", ERRORS)
def test_a_bad_folder_is_one_error_naming_the_path(tmp_path, error):
    kind, message = ERRORS[error](tmp_path / "f")
    with pytest.raises(kind, match=message) as raised:
        data.dataset_info(str(tmp_path / "f"))
    assert "\n" not in str(raised.value) and "Received: " in str(raised.value)


def test_parallel_decoding_gives_the_images_in_order_and_names_a_bad_one(tmp_path, monkeypatch):
    written = make_folder(tmp_path / "f", {"a": 5, "b": 4})
    monkeypatch.setattr(image_folder, "PARALLEL_FROM", 1)
    monkeypatch.setattr(image_folder, "CHUNK", 2)
    images, _ = data.load_arrays(str(tmp_path / "f"), "test")
    np.testing.assert_array_equal(images, expected_split(written, "test", ("a", "b"))[0])
    forget_in_process()
    (tmp_path / "f" / "train" / "b" / "02.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=f"{quoted(tmp_path / 'f' / 'train' / 'b' / '02.png')} cannot be read"):
        data.load_arrays(str(tmp_path / "f"), "test")


def test_a_run_on_a_folder_is_planned_with_its_classes_and_statistics(tmp_path):
    from keras_attnconv.training.plan import check_run
    from keras_attnconv.training.recipe import TrainConfig

    make_folder(tmp_path / "f", {"cat": 12, "dog": 12}, splits=None)
    config = TrainConfig(
        name="folder",
        model="quadratic_tiny",
        dataset=str(tmp_path / "f"),
        epochs=1,
        batch_size=8,
        model_overrides={"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 16},
        run_dir=str(tmp_path / "run"),
        export_dir=None,
        verbose=0,
        jit_compile=False,
    )
    plan = check_run(config)
    info = data.dataset_info(str(tmp_path / "f"))
    assert plan.eval_split == "test" and plan.steps_per_epoch == 22 // 8
    assert plan.model_config.class_names == ("cat", "dog") and plan.model_config.image_size == 8
    assert plan.model_config.pixel_mean == tuple(info.mean)
    assert not (tmp_path / "run").exists()


def test_a_folder_loads_on_jax_without_tensorflow(tmp_path, jax_without_tensorflow):
    make_folder(tmp_path / "f", {"a": 3, "b": 3})
    script = f"""
        import json, sys
        from keras_attnconv.training import data, image_folder
        image_folder.PARALLEL_FROM = 1  # the decoding pool too
        info = data.dataset_info({str(tmp_path / "f")!r})
        images, labels = data.load_arrays({str(tmp_path / "f")!r}, "train")
        print(json.dumps({{"classes": info.class_names, "shape": images.shape, "labels": labels.tolist(),
                          "tensorflow": "tensorflow" in sys.modules}}))
    """
    env = {**jax_without_tensorflow, "KERAS_ATTNCONV_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "classes": ["a", "b"],
        "shape": [6, 8, 8, 3],
        "labels": [0, 0, 0, 1, 1, 1],
        "tensorflow": False,
    }
