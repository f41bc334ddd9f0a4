"""pipeprof's input-bound share next to TensorFlow profiler's (xprof's input-pipeline analyser)
on the same steps: run a Keras-on-TensorFlow script under pipeprof with its trace windows kept,
then read those windows with TensorFlow's own analyser.

    PIPEPROF_TF_XSPACE_DIR=/tmp/xs pipeprof run --once --summary s.json -- python keras_image_dataset.py --data DIR
    python xprof_compare.py /tmp/xs s.json

Prints, per window, xprof's input % (time waiting for input over step time, its "HIGHLY"
≥ 20% / "MODERATELY" ≥ 5% input-bound rule) and the steps it found beside pipeprof's wait
share over the same window's steps, then pipeprof's wait share and verdict for the run. Needs the TensorFlow the script ran with (its profiler plugin).
"""

import glob
import json
import os
import struct
import sys

from pipeprof._tf import _fields


def xprof_input(path):
    """(input %, steps) from TensorFlow's input_pipeline_analyzer on one window's XSpace:
    InputPipelineAnalysisResult.input_percent (field 11, a double) and its step_details (4)."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data([path], "input_pipeline_analyzer", {})
    if not ok:
        raise RuntimeError(f"{path}: TensorFlow's input_pipeline_analyzer failed")
    percent, steps = None, 0
    for f, v in _fields(memoryview(data if isinstance(data, bytes) else data.encode())):
        if f == 11:
            percent = struct.unpack("<d", bytes(v))[0]
        elif f == 4:
            steps += 1
    return percent, steps


def rule(percent):
    if percent is None:
        return "no steps found"
    return "HIGHLY" if percent >= 20 else "MODERATELY" if percent >= 5 else "not"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: python xprof_compare.py XSPACE_DIR SUMMARY.json")
    xs_dir, summary = sys.argv[1], sys.argv[2]
    paths = sorted(glob.glob(os.path.join(xs_dir, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        sys.exit(f"{xs_dir}: no window (plugins/profile/*/*.xplane.pb): was PIPEPROF_TF_XSPACE_DIR set for the run?")
    weighted, total_steps = 0.0, 0
    for p in paths:
        percent, steps = xprof_input(p)
        own = os.path.join(os.path.dirname(p), "pipeprof.json")
        mine = ""
        if os.path.exists(own):
            with open(own) as f:
                w = json.load(f)
            mine = f"; pipeprof {100 * w['wait_ms'] / w['step_ms']:.1f}% over its {w['steps']} steps" if w["step_ms"] else ""
        print(f"window {os.path.basename(os.path.dirname(p))}: xprof input {percent if percent is None else round(percent, 1)}% over {steps} steps ({rule(percent)} input-bound){mine}")
        if percent is not None and steps:
            weighted += percent * steps
            total_steps += steps
    with open(summary) as f:
        s = json.load(f)
    share = 100 * s["split"]["wait_share"]
    verdict = (s.get("verdict") or {}).get("limiter", "?")
    if total_steps:
        mean = weighted / total_steps
        print(f"xprof, all windows   : input {mean:.1f}% ({rule(mean)} input-bound)")
    print(f"pipeprof run report  : waited {share:.1f}% of each step; verdict {verdict}")


if __name__ == "__main__":
    main()
