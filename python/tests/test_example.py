"""python/examples/train_numpy.py under `pipeprof attach`, unchanged: worker processes'
loader stages, the training loop's stages, steps and a verdict."""

import sys

from PIL import Image

from conftest import REPO, count


def images(root):
    # 3 classes x 6 images, PNG and JPEG, 40x40.
    for c, color in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(6):
            img = Image.new("RGB", (40, 40), color)
            img.putpixel((i, i), (255, 255, 255))
            img.save(d / f"{i}.{'png' if i % 2 else 'jpg'}")


def test_example_trains_in_worker_processes_and_attach_gives_a_verdict(scenario, tmp_path):
    images(tmp_path / "imgs")
    example = REPO / "python" / "examples" / "train_numpy.py"
    code = f"""
        import runpy, sys
        sys.argv = ["train_numpy.py", "--data", {str(tmp_path / 'imgs')!r}, "--steps", "10", "--workers", "2",
                    "--batch-size", "4", "--size", "16", "--wait-for-clients", "1"]
        runpy.run_path({str(example)!r}, run_name="__main__")
    """
    run = scenario(code)
    s, out, err = run.attach()
    assert "run ended" in err, err
    assert "verdict:" in out, out
    assert s["steps"] == 10 and s["images"] == 40
    for st in ["read", "decode", "resize"]:
        assert count(s, st) == 40, (st, s["stages"])
    for st in ["wait", "transfer", "compute", "forward", "backward", "optimizer"]:
        assert count(s, st) == 10, (st, s["stages"])
    workers = sorted(w["name"] for w in s["loader_threads"])
    # One row per worker, named for the worker (its process id is the threads' business).
    assert workers == ["loader-0", "loader-1"] and all(w["starts"] == 1 for w in s["loader_threads"]), workers
    assert s["settings"]["workers"] == 2 and s["settings"]["model"] == "python/examples/train_numpy.py"
    code, _, err = run.wait()
    assert code == 0, err


def test_bench_reports_a_per_span_figure(tmp_path):
    import subprocess

    bench = REPO / "python" / "benches" / "span_cost.py"
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    tmp_path.chmod(0o700)
    p = subprocess.run([sys.executable, str(bench), "--spans", "2000", "--rounds", "1"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "span decode (cpu-timed)" in p.stdout and "ns over a plain with" in p.stdout, p.stdout
