"""Deterministic procedural driving scenes for the segdepth example model.

numpy only (no torch). ``make_sample(index, split)`` returns

* ``x``     float32 [5, 96, 160]: R, G, B in 0..1, radar range in metres
  (0 where there is no return), radar valid mask (0/1);
* ``seg``   int64   [96, 160]: 0 sky, 1 road/ground, 2 vehicle, 3 pedestrian/pole;
* ``depth`` float32 [96, 160]: metres along the optical axis, capped at 80
  (the sky is 80).

The scene is a pinhole camera over a flat ground plane: a horizon, a road with
perspective (lane markings, slight curvature) between grass or pavement
verges, and a few vehicles, pedestrians and poles standing on the ground at
random depths, painted far to near. Lighting (brightness, colour tint, sky
type), texture and sensor noise vary per scene. Radar returns are a few
hundred sparse pixels, mostly on objects, some on the road, with range noise,
a small misalignment and a few clutter outliers.

Determinism: each sample draws from its own ``numpy.random.Generator``
(PCG64) seeded by ``(crc32(split), index)``. Only ``random()`` and
``integers()`` are drawn (pure integer / bit arithmetic) and the pixels are
computed with + - * / floor and comparisons only (IEEE correctly rounded, no
libm transcendentals, no reductions), so the same call gives identical bytes
on every machine.
"""

from __future__ import annotations

import zlib

import numpy as np

H, W = 96, 160
NUM_CLASSES = 4
MAX_DEPTH = 80.0
CLASS_NAMES = ("sky", "ground", "vehicle", "pedestrian_pole")

SKY, GROUND, VEHICLE, PEDPOLE = 0, 1, 2, 3



def _rng(index: int, split: str) -> np.random.Generator:
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    code = zlib.crc32(split.encode("utf-8"))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([code, int(index)])))


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(rng.random())


def _block_noise(rng: np.random.Generator, h: int, w: int, cell: int) -> np.ndarray:
    """Smooth noise in [-1, 1]: a coarse uniform grid, bilinearly upsampled (+ and * only)."""
    gh, gw = h // cell + 2, w // cell + 2
    g = rng.random((gh, gw)) * 2.0 - 1.0
    fr = (np.arange(h, dtype=np.float64) + 0.5) / cell
    fc = (np.arange(w, dtype=np.float64) + 0.5) / cell
    r0, c0 = np.floor(fr).astype(np.int64), np.floor(fc).astype(np.int64)
    ar, ac = (fr - r0)[:, None], (fc - c0)[None, :]
    top = g[r0][:, c0] * (1.0 - ac) + g[r0][:, c0 + 1] * ac
    bot = g[r0 + 1][:, c0] * (1.0 - ac) + g[r0 + 1][:, c0 + 1] * ac
    return top * (1.0 - ar) + bot * ar


def make_sample(index: int, split: str = "cal", size: tuple[int, int] = (H, W)
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One scene at ``size`` = (rows, columns); 96x160 by default.

    Another size draws the same random numbers in the same order (only the per-pixel arrays
    are larger) and scales every pixel quantity by ``s = rows / 96``: focal length, principal
    point offset, horizon row, noise cells, radar misalignment; the number of radar returns
    scales with the pixel count. At 96x160 every factor is exactly 1, so the bytes are those
    of the original generator."""
    h, w = size
    s = h / H
    px_err = max(1, int(round(s)))
    rows = np.arange(h, dtype=np.float64)[:, None] + 0.5  # pixel centres
    cols = np.arange(w, dtype=np.float64)[None, :] + 0.5
    rng = _rng(index, split)

    # ---- camera ---------------------------------------------------------
    f = _u(rng, 100.0, 125.0) * s            # focal length, px
    cx = w / 2 + _u(rng, -6.0, 6.0) * s
    hz = _u(rng, 34.0, 48.0) * s             # horizon row (pitch)
    cam_h = _u(rng, 1.3, 1.8)                # camera height, m

    # ---- lighting -------------------------------------------------------
    bright = _u(rng, 0.55, 1.25)
    tint = np.array([_u(rng, 0.9, 1.1), _u(rng, 0.92, 1.08), _u(rng, 0.9, 1.1)])
    sky_kind = int(rng.integers(0, 3))       # 0 clear, 1 overcast, 2 dusk

    img = np.zeros((3, h, w), dtype=np.float64)
    seg = np.zeros((h, w), dtype=np.int64)
    depth = np.full((h, w), MAX_DEPTH, dtype=np.float64)

    # ---- sky --------------------------------------------------------------
    t = np.clip((hz - rows) / max(hz, 1.0), 0.0, 1.0) * np.ones((1, w))  # 0 at horizon, 1 at top
    if sky_kind == 0:
        top, bot = np.array([0.25, 0.45, 0.85]), np.array([0.70, 0.82, 0.95])
    elif sky_kind == 1:
        g = _u(rng, 0.55, 0.8)
        top, bot = np.array([g, g, g + 0.03]), np.array([g + 0.12, g + 0.12, g + 0.12])
    else:
        top, bot = np.array([0.30, 0.30, 0.55]), np.array([0.95, 0.60, 0.35])
    clouds = _block_noise(rng, h, w, int(round(16 * s)))
    for c in range(3):
        img[c] = bot[c] + (top[c] - bot[c]) * t + 0.06 * clouds

    # ---- ground plane -------------------------------------------------------
    below = rows > hz + 0.5
    dv = np.maximum(rows - hz, 1e-3)
    z_ground = f * cam_h / dv                             # [h, 1]
    z_ground_img = np.minimum(z_ground, MAX_DEPTH) * np.ones((1, w))
    x_ground = (cols - cx) * z_ground / f                # lateral metres, [h, w]

    road_w = _u(rng, 6.5, 12.0)
    road_off = _u(rng, -2.0, 2.0)
    curv = _u(rng, -0.004, 0.004)
    centre = road_off + curv * z_ground * z_ground        # road centre line per row
    dx = x_ground - centre
    on_road = np.abs(dx) < road_w / 2
    dash = np.floor(z_ground / 3.0) % 2 == 0
    lane = (np.abs(dx) < 0.09) & dash & on_road
    edge = (np.abs(np.abs(dx) - (road_w / 2 - 0.25)) < 0.08) & on_road

    verge_kind = int(rng.integers(0, 2))  # 0 grass, 1 pavement
    asphalt = _u(rng, 0.25, 0.42)
    tex_fine = rng.random((h, w)) * 2.0 - 1.0
    tex_coarse = _block_noise(rng, h, w, int(round(8 * s)))
    verge = np.array([0.30, 0.48, 0.20]) if verge_kind == 0 else np.array([0.58, 0.55, 0.50])
    for c in range(3):
        gcol = np.where(on_road, asphalt + 0.03 * tex_coarse + 0.04 * tex_fine,
                        verge[c] + 0.07 * tex_coarse + 0.05 * tex_fine)
        gcol = np.where(lane | edge, 0.85 + 0.05 * tex_fine, gcol)
        # distance haze: fade to the horizon sky colour
        haze = np.minimum(z_ground_img / MAX_DEPTH, 1.0) * 0.6
        gcol = gcol * (1.0 - haze) + bot[c] * haze
        img[c] = np.where(below, gcol, img[c])
    seg[below[:, 0], :] = GROUND
    depth = np.where(below, z_ground_img, depth)

    # ---- objects -----------------------------------------------------------
    objs = []  # (z, kind, lateral x, width, height, colour)
    for _ in range(int(rng.integers(1, 7))):  # vehicles, in lanes (a few parked on the verge)
        z = 4.0 + 52.0 * float(rng.random()) * float(rng.random())  # more near than far
        if rng.random() < 0.8:
            lat = _u(rng, -road_w / 2 + 1.0, road_w / 2 - 1.0)
        else:
            lat = (1.0 if rng.random() < 0.5 else -1.0) * (road_w / 2 + _u(rng, 1.0, 3.0))
        lat += road_off + curv * z * z
        col = np.array([_u(rng, 0.05, 0.95), _u(rng, 0.05, 0.95), _u(rng, 0.05, 0.95)])
        objs.append((z, VEHICLE, lat, _u(rng, 1.6, 2.1), _u(rng, 1.3, 2.6), col))
    for _ in range(int(rng.integers(0, 6))):  # pedestrians, mostly on the verges
        z = 3.0 + 32.0 * float(rng.random()) * float(rng.random())
        side = 1.0 if rng.random() < 0.5 else -1.0
        lat = road_off + curv * z * z + side * (road_w / 2 + _u(rng, -1.0, 3.0))
        col = np.array([_u(rng, 0.05, 0.9), _u(rng, 0.05, 0.9), _u(rng, 0.05, 0.9)])
        objs.append((z, 10 + PEDPOLE, lat, _u(rng, 0.45, 0.7), _u(rng, 1.5, 1.9), col))
    for _ in range(int(rng.integers(0, 4))):  # poles, on the verges
        z = _u(rng, 4.0, 60.0)
        side = 1.0 if rng.random() < 0.5 else -1.0
        lat = road_off + curv * z * z + side * (road_w / 2 + _u(rng, 0.5, 2.0))
        g = _u(rng, 0.35, 0.75)
        objs.append((z, PEDPOLE, lat, _u(rng, 0.15, 0.3), _u(rng, 4.0, 7.0), np.array([g, g, g])))
    objs.sort(key=lambda o: -o[0])  # painter's algorithm: far to near

    for z, kind, lat, ow, oh, col in objs:
        cls = kind % 10
        vb = hz + f * cam_h / z                      # bottom row (ground contact)
        vt = vb - f * oh / z
        ul = cx + f * (lat - ow / 2) / z
        ur = cx + f * (lat + ow / 2) / z
        r0, r1 = int(max(np.floor(vt), 0)), int(min(np.floor(vb), h))
        c0, c1 = int(max(np.floor(ul), 0)), int(min(np.floor(ur) + 1, w))
        if r1 <= r0 or c1 <= c0:
            continue
        hh = r1 - r0
        rel = (np.arange(r0, r1, dtype=np.float64)[:, None] + 0.5 - vt) / max(vb - vt, 1e-3)
        patch = np.empty((3, hh, c1 - c0))
        shade = 1.0 - 0.25 * rel                     # lit from above
        n = tex_fine[r0:r1, c0:c1]
        for c in range(3):
            patch[c] = col[c] * shade + 0.04 * n
        if cls == VEHICLE:
            win = (rel > 0.08) & (rel < 0.38)
            wheels = rel > 0.86
            lights = (rel > 0.55) & (rel < 0.68)
            cc = (np.arange(c0, c1, dtype=np.float64)[None, :] + 0.5 - ul) / max(ur - ul, 1e-3)
            lights = lights & ((cc < 0.16) | (cc > 0.84))
            for c in range(3):
                patch[c] = np.where(win, 0.12 + 0.15 * col[c] + 0.05 * n, patch[c])
                patch[c] = np.where(wheels, 0.06 + 0.03 * n, patch[c])
            patch[0] = np.where(lights, 0.9, patch[0])
            patch[1] = np.where(lights, 0.15 + 0.65 * (1 - sky_kind % 2), patch[1])
            patch[2] = np.where(lights, 0.1, patch[2])
            # shadow on the ground just below the car
            s0, s1 = r1, min(r1 + max(1, int(np.floor(f * 0.4 / z))), h)
            if s1 > s0:
                img[:, s0:s1, c0:c1] *= 0.55
        elif kind >= 10:  # pedestrian: head, torso (clothes), legs
            head = rel < 0.14
            legs = rel > 0.55
            for c in range(3):
                skin = (0.85, 0.65, 0.55)[c]
                patch[c] = np.where(head, skin * (0.6 + 0.4 * col[1]) + 0.03 * n, patch[c])
                patch[c] = np.where(legs, 0.5 * col[(c + 1) % 3] + 0.03 * n, patch[c])
        img[:, r0:r1, c0:c1] = patch
        seg[r0:r1, c0:c1] = cls
        depth[r0:r1, c0:c1] = z

    # ---- lighting and sensor noise --------------------------------------------
    for c in range(3):
        img[c] = img[c] * bright * tint[c]
    img = img + 0.02 * (rng.random((3, h, w)) * 2.0 - 1.0)
    img = np.clip(img, 0.0, 1.0)

    # ---- radar ------------------------------------------------------------
    rng_img = np.zeros((h, w), dtype=np.float64)
    valid = np.zeros((h, w), dtype=np.float64)
    flat_seg = seg.reshape(-1)
    flat_depth = depth.reshape(-1)
    obj_idx = np.flatnonzero(flat_seg >= VEHICLE)
    gnd_idx = np.flatnonzero((flat_seg == GROUND) & (flat_depth < 60.0))
    n_ret = int(rng.integers(200, 401)) * (h * w) // (H * W)
    n_obj = int(n_ret * 0.65) if obj_idx.size else 0
    n_gnd = n_ret - n_obj if gnd_idx.size else 0
    picks = np.concatenate([
        obj_idx[rng.integers(0, max(obj_idx.size, 1), n_obj)] if n_obj else np.zeros(0, np.int64),
        gnd_idx[rng.integers(0, max(gnd_idx.size, 1), n_gnd)] if n_gnd else np.zeros(0, np.int64),
    ])
    if picks.size:
        true_r = flat_depth[picks]
        e1 = rng.random(picks.size) + rng.random(picks.size) - 1.0   # triangular in [-1, 1]
        e2 = rng.random(picks.size) + rng.random(picks.size) - 1.0
        meas = true_r * (1.0 + 0.03 * e1) + 0.4 * e2
        outlier = rng.random(picks.size) < 0.03                      # clutter
        meas = np.where(outlier, 2.0 + 78.0 * rng.random(picks.size), meas)
        meas = np.clip(meas, 0.5, MAX_DEPTH)
        # small projection misalignment (+-1 px at 96 rows)
        rr = np.clip(picks // w + px_err * rng.integers(-1, 2, picks.size), 0, h - 1)
        cc = np.clip(picks % w + px_err * rng.integers(-1, 2, picks.size), 0, w - 1)
        rng_img[rr, cc] = meas     # last write wins, deterministic order
        valid[rr, cc] = 1.0

    x = np.concatenate([img, rng_img[None], valid[None]], axis=0).astype(np.float32)
    return x, seg, depth.astype(np.float32)


if __name__ == "__main__":  # quick self-check and timing
    import time

    t0 = time.perf_counter()
    for i in range(50):
        x, s, d = make_sample(i)
    dt = (time.perf_counter() - t0) / 50
    print(f"{dt * 1e3:.2f} ms/sample; x {x.shape} {x.dtype}, seg {s.shape} {s.dtype}, depth {d.shape} {d.dtype}")
    print("class fractions", np.bincount(s.ravel(), minlength=NUM_CLASSES) / s.size,
          "radar returns", int(x[4].sum()), "range max", float(x[3].max()))
