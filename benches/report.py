#!/usr/bin/env python3
"""Prints the criterion results of the last `cargo bench` run as the Markdown
table of BENCHMARKS.md: each measurement beside its baseline from the same
run, the ratio, the target and whether it was met.

    python3 benches/report.py [target/criterion]

Reads `<dir>/<group>/<function>/<parameter>/new/{estimates,sample}.json`.
Median: criterion's median of the per-iteration time. Spread: the median
absolute deviation as a percentage of the median, and the fastest and slowest
sample (per-iteration time). Ratio: baseline time / measured time, that is
the measured throughput relative to the baseline's (> 1: faster), except
where a row says otherwise.
"""

import json
import os
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "target", "criterion")


def load(path):
    d = os.path.join(ROOT, *path.split("/"), "new")
    try:
        with open(os.path.join(d, "estimates.json")) as f:
            est = json.load(f)
        with open(os.path.join(d, "sample.json")) as f:
            sample = json.load(f)
    except FileNotFoundError:
        return None
    per_iter = [t / n for t, n in zip(sample["times"], sample["iters"])]
    med = est["median"]["point_estimate"]
    return {
        "median": med,
        "mad_pct": 100.0 * est["median_abs_dev"]["point_estimate"] / med,
        "min": min(per_iter),
        "max": max(per_iter),
    }


def fmt_ns(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def cell(r):
    if r is None:
        return "—", "—"
    return fmt_ns(r["median"]), f"±{r['mad_pct']:.1f}% ({fmt_ns(r['min'])}–{fmt_ns(r['max'])})"


# (what, measured, baseline, target check on the ratio, target text)
# ratio = baseline median / measured median unless `inverse` (then measured / baseline).
ROWS = []
for size in ("1KiB", "64KiB", "1MiB"):
    ROWS.append((f"chunk decode {size}", f"chunk_decode/decode_binary/{size}",
                 f"chunk_decode/baseline_bytes_slice/{size}", None, "info (zero-copy: see next row)", False))
ROWS.append(("chunk decode 1 MiB vs 1 KiB (time ratio)", "chunk_decode/decode_binary/1MiB",
             "chunk_decode/decode_binary/1KiB", lambda r: r <= 1.2, "≤ 1.2×", True))
for size in ("64KiB", "1MiB", "16MiB", "64MiB"):
    ROWS.append((f"chunk split + encode {size}", f"chunk_encode/split_encode/{size}",
                 f"chunk_encode/baseline_memcpy/{size}", lambda r: r >= 0.8, "≥ 0.8× memcpy", False))
    ROWS.append((f"body split only {size}", f"chunk_encode/split_only/{size}",
                 f"chunk_encode/baseline_memcpy/{size}", None, "info (zero-copy slices)", False))
ROWS.append(("chunk encode 64 KiB, 64 source placements", "chunk_encode_placements/encode_chunk/64x64KiB",
             "chunk_encode_placements/baseline_memcpy/64x64KiB", lambda r: r >= 0.8, "≥ 0.8× memcpy", False))
for frame in ("request_10_headers", "end", "abort"):
    ROWS.append((f"control decode `{frame}`", f"control/decode_text/{frame}",
                 f"control/baseline_value_parse/{frame}", lambda r: r > 1.0, "> 1× (faster than untyped parse)", False))
    ROWS.append((f"control encode `{frame}`", f"control/encode/{frame}",
                 f"control/baseline_value_parse/{frame}", lambda r: r > 1.0, "> 1× (faster than untyped parse)", False))
    ROWS.append((f"(ref) untyped serialize `{frame}`", f"control/ref_value_to_string/{frame}",
                 f"control/baseline_value_parse/{frame}", None, "info", False))
ROWS.append(("state machines: 1 GiB request body", "proto_bulk/request_body/1GiB",
             "proto_bulk/baseline_memcpy/1GiB", lambda r: r >= 0.5, "≥ 0.5× memcpy", False))
ROWS.append(("state machines: 1 GiB response body", "proto_bulk/response_body/1GiB",
             "proto_bulk/baseline_memcpy/1GiB", lambda r: r >= 0.5, "≥ 0.5× memcpy", False))
ROWS.append(("state machines: 10,000 small requests", "proto_small/requests/10000",
             "proto_small/baseline_memcpy_wire_bytes/10000", None, "info (no target)", False))
ROWS.append(("loopback: 1 GiB upload via relay", "e2e/upload/relay", "e2e/upload/direct",
             lambda r: r >= 0.5, "≥ 0.5× direct", False))
ROWS.append(("loopback: 1 GiB download via relay", "e2e/download/relay", "e2e/download/direct",
             lambda r: r >= 0.5, "≥ 0.5× direct", False))


def main():
    print("| measurement | median | spread: MAD (min–max) | baseline | baseline median "
          "| baseline spread | ratio | target | met? |")
    print("|---|---|---|---|---|---|---|---|---|")
    for what, m, b, check, target, inverse in ROWS:
        rm, rb = load(m), load(b)
        if rm is None and rb is None:
            continue
        ratio = None
        if rm and rb:
            ratio = rm["median"] / rb["median"] if inverse else rb["median"] / rm["median"]
        met = "—" if check is None or ratio is None else ("met" if check(ratio) else "**missed**")
        mm, ms = cell(rm)
        bm, bs = cell(rb)
        base_name = "/".join(b.split("/")[1:])
        print(f"| {what} | {mm} | {ms} | `{base_name}` | {bm} | {bs} | "
              f"{'—' if ratio is None else f'{ratio:.3g}×'} | {target} | {met} |")


if __name__ == "__main__":
    main()
