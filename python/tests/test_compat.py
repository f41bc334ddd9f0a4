"""pipeprof run never changes what a PyTorch program does: each pattern of compat_patterns.py
(lazy modules moved to a device, a __torch_function__ subclass, dict and namedtuple batches,
non_blocking / channels_last / dtype-only .to, an IterableDataset with workers, a batch_sampler
with a custom collate_fn, a DataLoader subclass, autocast with inference_mode validation, break
and re-iterate, two loaders zipped, torch.compile) gives the same seeded losses, bit for bit,
with and without it, and is counted as the loop it is."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import count
from test_frameworks import env_for, run

PATTERNS = Path(__file__).with_name("compat_patterns.py")


def results(stdout):
    line = next(x for x in stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


def test_every_pattern_gives_the_same_losses_with_and_without_pipeprof(tmp_path):
    plain = subprocess.run(
        [sys.executable, str(PATTERNS)], capture_output=True, text=True, env=env_for(tmp_path), timeout=300, check=True
    )
    want = results(plain.stdout)
    broken = {k: v for k, v in want.items() if isinstance(v, str)}
    assert not broken, f"patterns that fail without pipeprof: {broken}"
    _, s, out, err = run(tmp_path, sys.executable, PATTERNS)
    got = results(out)
    assert got.keys() == want.keys()
    differ = {k: (want[k], got[k]) for k in want if got[k] != want[k]}
    assert not differ, f"patterns changed by pipeprof run: {differ}\n{err}"
    # One step per batch the loop takes (the zipped loaders' 4 iterations count 4, not 8; a
    # batch taken and left by `break` counts: 4 + 3 + 2 in break_and_reiterate), and
    # validation batches under inference_mode are not training steps.
    assert s["steps"] == 63, s["steps"]


def test_zipped_loaders_count_one_step_per_iteration_and_one_epoch(tmp_path):
    _, s, out, _ = run(tmp_path, sys.executable, PATTERNS, "zipped_loaders")
    assert len(results(out)["zipped_loaders"]) == 4
    assert s["steps"] == 4 and s["images"] == 64, (s["steps"], s["images"])
    assert len(s["epochs"]) == 1, s["epochs"]
    # The losses read (the epoch's first step, every LOSS_EVERY-th after it, and its last),
    # each the one its step ended with, as the script printed it.
    from pipeprof._torch_loop import LOSS_EVERY

    losses = [float.fromhex(x) for x in results(out)["zipped_loaders"]]
    read = [x for i, x in enumerate(losses) if i % LOSS_EVERY == 0 or i == len(losses) - 1]
    assert abs(s["epochs"][0]["loss"] - sum(read) / len(read)) < 1e-6, (s["epochs"][0], read)


NEXT_ITER = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.rand(64, 4), torch.rand(64)), batch_size=8)
    for _ in range(20):
        x, y = next(iter(loader))   # a fresh iterator every step: still one pass, one epoch
        (x.sum() * y.sum()).backward() if x.requires_grad else None
"""


def test_a_fresh_iterator_every_step_is_not_an_epoch_per_step(tmp_path):
    import textwrap

    script = tmp_path / "next_iter.py"
    script.write_text(textwrap.dedent(NEXT_ITER))
    _, s, _, _ = run(tmp_path, sys.executable, script)
    assert s["steps"] == 20 and len(s["epochs"]) == 1, (s["steps"], s["epochs"])


LOSS_AT_END = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.rand(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
    for epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
    print("last", loss.item())
"""


def test_losses_come_from_backward_not_from_item_and_unmeasured_ones_are_not_zero(tmp_path):
    import textwrap

    script = tmp_path / "loss_at_end.py"
    script.write_text(textwrap.dedent(LOSS_AT_END))
    _, s, out, _ = run(tmp_path, sys.executable, script)
    assert [e["steps"] for e in s["epochs"]] == [4, 4, 4]
    # Every epoch has its loss (a CPU loss is read at the step's end), none is 0.
    assert all(e["loss"] > 0 and not e.get("no_loss") for e in s["epochs"]), s["epochs"]
    last = float(out.split("last ")[1].split()[0])
    assert abs(s["last_loss"] - last) < 1e-6, (s["last_loss"], last)
    assert s["settings"]["params"] == 10, s["settings"]


SAMPLED = """
    import torch, torch.optim.optimizer as O
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    COMPILE = {compile}
    if COMPILE:
        step_fn = torch.compile(lambda x: net(x), backend="eager")
    loader = DataLoader(TensorDataset(torch.rand(80, 4), torch.randint(0, 2, (80,))), batch_size=4)
    hooked = []
    for i, (x, y) in enumerate(loader):
        # In the loop body, as the program sees them: torch's own functions, or the hooks.
        hooked.append([hasattr(torch.autograd.backward, "__wrapped__"), len(O._global_optimizer_pre_hooks)])
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    print("HOOKED", [i for i, (b, o) in enumerate(hooked) if b and o])
    print("PARTIAL", [i for i, (b, o) in enumerate(hooked) if b != bool(o)])
"""


def test_the_loss_and_optimizer_hooks_are_in_place_only_on_sampled_steps(tmp_path):
    import textwrap

    from pipeprof._torch_loop import LOSS_EVERY

    script = tmp_path / "sampled.py"
    script.write_text(textwrap.dedent(SAMPLED.format(compile=False)))
    _, s, out, _ = run(tmp_path, sys.executable, script)
    hooked = json.loads(out.split("HOOKED ")[1].splitlines()[0])
    # 20 steps, one pass: its first, every LOSS_EVERY-th after it, and its last (the
    # iterator's length says which); on the others the program calls torch's own functions.
    want = sorted({i for i in range(20) if i % LOSS_EVERY == 0} | {19})
    assert hooked == want, (hooked, want)
    assert json.loads(out.split("PARTIAL ")[1].splitlines()[0]) == []
    assert count(s, "optimizer") == len(want), s["stages"]
    # The epoch's loss is the mean of the sampled steps', the last one the pass's last.
    assert s["epochs"][0]["loss"] > 0 and s["last_loss"] > 0


def test_after_torch_compile_the_hooks_stay_in_place(tmp_path):
    # What torch.compile traces is guarded on the optimizer's hook dicts and on the function
    # backward() calls: hooks that came and went would compile the program's step again.
    import textwrap

    script = tmp_path / "sampled.py"
    script.write_text(textwrap.dedent(SAMPLED.format(compile=True)))
    _, s, out, _ = run(tmp_path, sys.executable, script)
    assert json.loads(out.split("HOOKED ")[1].splitlines()[0]) == list(range(20)), out
    assert count(s, "optimizer") == 20, s["stages"]


AUX_AFTER_BACKWARD = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    train = DataLoader(TensorDataset(torch.rand(32, 4), torch.randint(0, 2, (32,))), batch_size=4)
    aux = iter(DataLoader(TensorDataset(torch.rand(64, 4)), batch_size=4))
    for x, y in train:
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        (noise,) = next(aux)   # another loader drawn after backward, once an iteration
"""


def test_another_loader_drawn_after_backward_is_part_of_the_same_step(tmp_path):
    import textwrap

    script = tmp_path / "aux.py"
    script.write_text(textwrap.dedent(AUX_AFTER_BACKWARD))
    _, s, _, _ = run(tmp_path, sys.executable, script)
    # 8 iterations, 8 steps (not 16), one epoch; each step's two `next()` are its waits.
    assert s["steps"] == 8 and len(s["epochs"]) == 1, (s["steps"], s["epochs"])
    assert count(s, "wait") == 16, s["stages"]
