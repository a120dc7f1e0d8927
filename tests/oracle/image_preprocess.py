"""The oracle for tests/image_preprocess.rs: Hugging Face's Gemma 3 image processor on real files.

Writes images of odd sizes, modes and formats (PNG, JPEG, WebP, GIF) with PIL into OUT_DIR, opens
each with PIL as a user of transformers would (`Image.open`), runs transformers' Gemma3 image
processor (the PIL/NumPy backend: no torch) with the gemma-3 checkpoints' preprocessor settings,
and writes its `pixel_values` as raw little-endian float32 next to the image, plus manifest.json
listing each case. The Rust test decodes the same bytes with mlex and compares.

    python tests/oracle/image_preprocess.py OUT_DIR
"""

import json
import os
import sys

import numpy as np
from PIL import Image

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402

# google/gemma-3-*-it preprocessor_config.json (the keys that matter; its null do_convert_rgb and
# do_pan_and_scan are left out: passed as None they would turn RGB conversion off here).
CONFIG = {
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_min_ratio_to_activate": 1.2,
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}


def pattern(w, h, channels, seed):
    """Smooth gradients, sharp edges and noise, so resampling errors show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for c in range(channels):
        f = 0.5 + 0.5 * np.sin(x / max(w, 1) * (3 + c) * np.pi + y / max(h, 1) * (2 + 2 * c) * np.pi)
        f = f * 200 + ((x // 7 + y // 5) % 2) * 40
        f = f + rng.normal(0, 12, size=(h, w))
        planes.append(np.clip(f, 0, 255).astype(np.uint8))
    return np.stack(planes, axis=-1) if channels > 1 else planes[0]


def rgb(w, h, seed):
    return Image.fromarray(pattern(w, h, 3, seed), "RGB")


def rgba(w, h, seed):
    a = pattern(w, h, 4, seed)
    a[..., 3] = np.linspace(0, 255, w, dtype=np.float64)[None, :].astype(np.uint8)  # every alpha level
    a[: h // 4, :, 3] = 0
    return Image.fromarray(a, "RGBA")


def cases():
    """(name, PIL image, format, save kwargs, pan_and_scan)."""
    la = Image.fromarray(pattern(513, 257, 2, 8), "LA")
    pal = rgb(400, 300, 9).quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    gif = rgb(250, 190, 10).quantize(colors=32, method=Image.Quantize.MEDIANCUT)
    return [
        ("rgb_1x1", rgb(1, 1, 1), "PNG", {}, False),
        ("rgb_3x500", rgb(3, 500, 2), "PNG", {}, False),
        ("rgb_897x895_q90", rgb(897, 895, 3), "JPEG", {"quality": 90}, False),
        ("rgb_1280x720_q75", rgb(1280, 720, 4), "JPEG", {"quality": 75}, False),
        ("rgb_17x4000_lossless", rgb(17, 4000, 5), "WEBP", {"lossless": True}, False),
        ("rgb_2000x2000", rgb(2000, 2000, 6), "PNG", {}, False),
        ("gray_640x480", Image.fromarray(pattern(640, 480, 1, 7), "L"), "PNG", {}, False),
        ("gray_896x896_q85", Image.fromarray(pattern(896, 896, 1, 11), "L"), "JPEG", {"quality": 85}, False),
        ("la_513x257", la, "PNG", {}, False),
        ("rgba_333x777", rgba(333, 777, 12), "PNG", {}, False),
        ("rgba_301x203_lossless", rgba(301, 203, 13), "WEBP", {"lossless": True}, False),
        ("palette_400x300", pal, "PNG", {}, False),
        ("palette_transparent_250x190", gif, "GIF", {"transparency": 0}, False),
        ("rgb_1001x37_lossy", rgb(1001, 37, 14), "WEBP", {"quality": 80}, False),
        ("rgb_1500x500_pan_and_scan", rgb(1500, 500, 15), "PNG", {}, True),
        # Pan and scan: tall (3 crops down it, the last clipped), capped at 4, under the ratio
        # threshold (none), crops under the 256 minimum (none), a lossy JPEG cropped in 2.
        ("rgb_300x1000_pan_and_scan", rgb(300, 1000, 18), "PNG", {}, True),
        ("rgb_2500x300_pan_and_scan", rgb(2500, 300, 19), "PNG", {}, True),
        ("rgb_1190x1000_pan_and_scan", rgb(1190, 1000, 20), "PNG", {}, True),
        ("rgb_500x255_pan_and_scan", rgb(500, 255, 21), "PNG", {}, True),
        ("rgb_613x1301_pan_and_scan_q90", rgb(613, 1301, 22), "JPEG", {"quality": 90}, True),
        # Either side of where Pillow runs the vertical resize pass first (height > 100 x width).
        ("rgb_17x1700", rgb(17, 1700, 16), "PNG", {}, False),
        ("rgb_17x1701", rgb(17, 1701, 17), "PNG", {}, False),
    ]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    proc = Gemma3ImageProcessorPil(**CONFIG)
    manifest = []
    for name, img, fmt, kw, pas in cases():
        ext = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif"}[fmt]
        path = os.path.join(out, f"{name}.{ext}")
        img.save(path, fmt, **kw)
        with Image.open(path) as opened:
            mode = opened.mode
            res = proc(images=opened, return_tensors="np", **({"do_pan_and_scan": True} if pas else {}))
        px = np.ascontiguousarray(res["pixel_values"], dtype="<f4")
        px.tofile(os.path.join(out, f"{name}.f32"))
        manifest.append({
            "name": name,
            "image": f"{name}.{ext}",
            "pil_mode": mode,
            "size": list(img.size),
            "pan_and_scan": pas,
            "pixel_values": f"{name}.f32",
            "shape": list(px.shape),
            "num_crops": int(np.asarray(res["num_crops"]).reshape(-1)[0]),
        })
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
