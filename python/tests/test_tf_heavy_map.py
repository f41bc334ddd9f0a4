"""A heavy `tf.data` map on a model that trains on the CPU (issue 51, item 11): the corpus
script python/corpus/tf_heavy_map_cpu.py (`image_dataset_from_directory`, then
`.map(augment, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)` with repeated blurs) runs under
`pipeprof run --once` with the blurs and with the map's function replaced by the identity
(`--augment none`), and what pipeprof says of each is checked against what the script measured
itself in the same run (its `counted:` line: steps, images, its steady images/s).

The blurs make the run CPU preprocessing: the map's threads take the cores the step trains on,
and the step waits for its batch inside it (TensorFlow's IteratorGetNext). Its figures agree
with each other and with the script: the rate pipeprof measured, the loader's supply and the
capacity model's rate all within ±25% (the model's own tolerance, `MODEL_OFF_SHARE`: past it the
report itself says the model is off) of the script's own rate, or above it for the supply (the
loader supplied every image trained). The identity map does not get the map's verdict. TensorFlow
runs from its own environment (PIPEPROF_TF_PYTHON); without it the test fails, never skips."""

import json
import re
import subprocess

import pytest
from conftest import HANG_S, REPO, corpus_env, pipeprof_bin
from test_keras_tf import tf_python

CORPUS = REPO / "python" / "corpus"
SCRIPT = CORPUS / "tf_heavy_map_cpu.py"
#: The capacity model's tolerance (core/src/diagnose/thresholds.rs, MODEL_OFF_SHARE).
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The runs' environment: the generated images in a folder of the test's, one OpenMP
    thread (two cores), the trace windows as a user gets them."""
    e = corpus_env(
        tmp_path_factory,
        tf_python(),
        "import _data; _data.image_folder()",
        dict(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2"),
        KERAS_BACKEND="tensorflow",
    )
    for k in [k for k in e if k.startswith("PIPEPROF_TF_")]:
        e.pop(k)
    return e


def profiled(augment, env, tmp_path):
    """The script under `pipeprof run --once`: its own counters, the summary, the report."""
    summary = tmp_path / f"{augment}.json"
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", summary, "--", tf_python(), SCRIPT, "--augment", augment]
    try:
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=3 * HANG_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"did not end: {cmd}\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    line = next((x for x in p.stdout.splitlines() if x.startswith("counted: ")), None)
    assert line, p.stdout
    counted = {k: float(v) for k, v in (kv.split("=") for kv in line.removeprefix("counted: ").split())}
    return counted, json.loads(summary.read_text()), p.stdout + p.stderr


def figure(pattern, text):
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in\n{text}"
    return float(m.group(1))


def near(got, truth, what):
    assert truth > 0 and abs(got - truth) <= TOLERANCE * truth, f"{what}: pipeprof {got:.1f}, the script's own {truth:.1f}"


def test_a_heavy_tf_data_map_on_the_cpu_is_cpu_preprocessing_with_figures_that_agree(env, tmp_path):
    heavy, s, out = profiled("heavy", env, tmp_path)
    plain, s_plain, out_plain = profiled("none", env, tmp_path)
    # The ground truth, the script's own clock: the map costs the run (on two cores the
    # identity map ran 1.3–3.3× as fast, measured on a shared machine: faster is all that
    # holds in every pair).
    assert plain["images_per_s"] > heavy["images_per_s"], (plain, heavy)
    for c, x in ((heavy, s), (plain, s_plain)):
        assert (x["steps"], x["images"]) == (c["train_steps"], c["train_images"]), (x["steps"], x["images"], c)

    v = s["verdict"]
    assert v["limiter"] == "Preprocess", v
    # Which limits, and why: the map's CPU, with the wait inside the step and its share of the
    # process's CPU against the step's.
    assert v["headline"].startswith("CPU preprocessing in tf.data's map"), v["headline"]
    ev = "\n".join(v["evidence"])
    assert "waited for its batch inside it (tf.data's IteratorGetNext)" in v["evidence"][0], ev
    share = figure(r"tf\.data's map and loading use [0-9.]+ ms of CPU per image, the step [0-9.]+ ms: (\d+)% of this process's CPU", ev)
    assert share >= 60, ev  # TF_MAP_CPU_SHARE
    # The numbers agree with the script's own rate and with each other.
    report = out[out.index("── pipeprof report") :]
    near(figure(r"trained \d+ steps, \d+ images in [0-9.]+ s: ([0-9.]+) images/s", report), heavy["images_per_s"], "the rate")
    near(figure(r"measured ([0-9.]+) images/s", ev), heavy["images_per_s"], "the rate the model is against")
    supply = figure(r"tf\.data's parallel calls \(\d+, one a core\) supply ≈([0-9.]+) images/s", ev)
    assert supply >= (1 - TOLERANCE) * heavy["images_per_s"], f"the loader supplies {supply}, the run trained {heavy['images_per_s']}"
    assert "capacity model puts today's rate" not in ev, ev

    # The identity map: loading alone beside the step is not the map's verdict (on a machine
    # busy with other programs its step may still wait for its decoded batches: that wait, not
    # the map's share of the CPU, is what it is then told).
    p = s_plain["verdict"]
    assert "tf.data's map" not in p["headline"], p
    plain_ev = "\n".join(p["evidence"])
    m = re.search(r"tf\.data's map and loading use .*?: (\d+)% of this process's CPU", plain_ev)
    assert m is None or float(m.group(1)) < 60, plain_ev
    near(figure(r"trained \d+ steps, \d+ images in [0-9.]+ s: ([0-9.]+) images/s", out_plain), plain["images_per_s"], "the rate (identity map)")
