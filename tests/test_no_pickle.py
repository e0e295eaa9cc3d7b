"""Nothing executable on the wire or in checkpoints (issue 14): no pickle on any flower-dp message path.

The first test reads every module of the package (``flower_dp/``, ``clients/``, ``strategies/``) as code (Python's
``ast``, so docstrings and comments that *mention* pickles do not count) and fails on: importing ``pickle``,
``cloudpickle``, ``dill``, ``marshal``, ``shelve`` or ``joblib``; calling ``torch.save`` (its files are pickles);
calling ``torch.load`` without ``weights_only=True``; ``np.load(..., allow_pickle=True)``; any ``.loads`` of a
pickle module.  Relay messages, node specs, node states in ``context.state`` and checkpoints all go through
:mod:`flower_dp.gossip.wire` (a JSON tree + raw numeric arrays).

Out of scope: Ray's own actor transport (``transport="ray"`` hands node factories and shares to Ray, which
serialises them with cloudpickle inside its cluster).  One module of flower-dp loads a pickle itself:
:mod:`flower_dp.experiments.handoff`, which hands a caller's own model factory, data or ClientApp to the Flower simulation that
caller starts (``flwr run`` runs the apps in other processes), through a 0600 file in a 0700 folder, read only after
checking both belong to this user alone; a test below checks those refusals.
The other tests check the behaviour: a pickle put where a relay payload, a node spec or a checkpoint
belongs is refused without being run.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("flower_dp", "clients", "strategies")
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}


def _package_files() -> list[Path]:
    files = [p for d in PACKAGE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 30, f"expected the whole package, found only {len(files)} modules under {PACKAGE_DIRS}"
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _kw_is(call: ast.Call, name: str, value: object) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords)


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel, out = (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES:
            out.append(f"{rel}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.endswith("torch.save"):
                out.append(f"{rel}:{node.lineno}: {name}(...) writes a pickle")
            if name.endswith("torch.load") and not _kw_is(node, "weights_only", True):
                out.append(f"{rel}:{node.lineno}: {name}(...) without weights_only=True")
            if name.split(".")[-1] == "load" and name.split(".")[0] in ("np", "numpy") and _kw_is(node, "allow_pickle", True):
                out.append(f"{rel}:{node.lineno}: {name}(..., allow_pickle=True)")
            if name.split(".")[0] in BANNED_MODULES:
                out.append(f"{rel}:{node.lineno}: {name}(...)")
        elif isinstance(node, ast.keyword) and node.arg == "weights_only" and isinstance(node.value, ast.Constant) \
                and node.value.value is False:
            out.append(f"{rel}:{getattr(node.value, 'lineno', '?')}: weights_only=False")
    return out


#: the one module allowed to (de)serialise with cloudpickle: the caller's own objects to its own simulation
HANDOFF = ROOT / "flower_dp" / "experiments" / "handoff.py"


def test_package_has_no_pickle_loader():
    assert HANDOFF.is_file() and _violations(HANDOFF), "the hand-off module is the scanner's one exception"
    bad = [v for p in _package_files() if p != HANDOFF for v in _violations(p)]
    assert not bad, "pickles on a flower-dp path (use flower_dp.gossip.wire):\n" + "\n".join(bad)


def test_scanner_catches_what_it_bans(tmp_path):
    """The scanner is not vacuous: each banned form in a scratch module is reported."""
    src = ("import pickle\nimport cloudpickle as cp\nimport torch\nimport numpy as np\n"
           "torch.load(f, weights_only=False)\ntorch.load(f)\ntorch.save(x, f)\nnp.load(f, allow_pickle=True)\n"
           "cp.loads(b)\n")
    p = tmp_path / "scratch.py"
    p.write_text(src)
    found = "\n".join(_violations(p))
    for needle in ("import pickle", "import cloudpickle", "weights_only=False", "without weights_only=True",
                   "writes a pickle", "allow_pickle=True"):
        assert needle in found, f"{needle!r} not reported in:\n{found}"


class _Boom:
    """Unpickling this calls ``_mark`` (harmless, but observable: the code a pickle would run)."""

    ran = False

    def __reduce__(self):
        return (_mark, ())


def _mark():
    _Boom.ran = True
    return "ran"


def test_relay_and_checkpoint_refuse_pickles(tmp_path):
    """A pickle where a relay payload, a spec or a checkpoint belongs is refused, never executed."""
    import io

    from flower_dp.errors import CheckpointError
    from flower_dp.gossip import wire
    from flower_dp.gossip.relay import decode
    from flower_dp.results import CHECKPOINT_NAME, load_checkpoint

    buf = io.BytesIO()
    torch.save({"x": _Boom()}, buf)
    for payload in (pickle.dumps({"x": _Boom()}), buf.getvalue()):
        with pytest.raises(wire.WireError, match="refused"):
            decode(payload)
    with pytest.raises(wire.WireError):
        wire.unpack('{"$": "dc", "type": "os:system", "f": {}}', [])  # a type outside the allow-list
    with pytest.raises(wire.WireError, match="dtype"):
        wire.unpack('{"$": "nd", "i": 0}', [np.array([object()], dtype=object)])
    # an old-format checkpoint (torch.save pickle behind the old header) is refused with the fix named
    import hashlib

    payload = buf.getvalue()
    (tmp_path / CHECKPOINT_NAME).write_bytes(
        b"FLOWERDP-CKPT1\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    with pytest.raises(CheckpointError, match="older version.*delete it"):
        load_checkpoint(tmp_path)
    assert not _Boom.ran


def test_wire_round_trips_states_bit_for_bit(tmp_path):
    """Checkpoint values come back with the same types and bits: tensors (bf16 too), arrays, numpy scalars, big ints
    (numpy bit_generator states), torch generator states, nan/inf/-0.0, tuples, int-keyed dicts, bytes."""
    from flower_dp.gossip import Contribution, Share
    from flower_dp.results import load_checkpoint, save_checkpoint

    rng = np.random.default_rng(7)
    rng.random(3)
    tgen = torch.Generator().manual_seed(11)
    torch.randn(2, generator=tgen)
    state = {"x": torch.randn(3, 4), "half": torch.randn(5).to(torch.bfloat16), "idx": torch.arange(4),
             "np": np.linspace(0, 1, 7, dtype=np.float32), "scalar": np.float64(2.5), "big": 2**127 + 3,
             "floats": [float("nan"), float("inf"), -0.0, 1e-310], "tuple": (1, "a", None), "by_node": {0: 1.5, 3: 2},
             "bytes": b"\x00\x01", "rng": rng.bit_generator.state, "tgen": tgen.get_state(), "empty": np.zeros((0, 2)),
             "share": Share(1, 2, 3, {"x": torch.ones(2)}, 0.25, 66), "contrib": Contribution(np.ones(2), "sum")}
    save_checkpoint(tmp_path, state)
    back = load_checkpoint(tmp_path)
    assert set(back) == set(state)
    for key in ("x", "half", "idx", "tgen"):
        assert back[key].dtype == state[key].dtype and torch.equal(back[key].view(torch.uint8) if key == "half"
                                                                   else back[key], state[key].view(torch.uint8)
                                                                   if key == "half" else state[key])
    assert back["np"].dtype == np.float32 and np.array_equal(back["np"], state["np"])
    assert type(back["scalar"]) is np.float64 and back["scalar"] == 2.5 and back["big"] == 2**127 + 3
    assert np.isnan(back["floats"][0]) and back["floats"][1:3] == [float("inf"), 0.0]
    assert str(back["floats"][2]) == "-0.0" and back["floats"][3] == 1e-310
    assert back["tuple"] == (1, "a", None) and back["by_node"] == {0: 1.5, 3: 2} and back["bytes"] == b"\x00\x01"
    assert back["empty"].shape == (0, 2) and back["share"].wire_bits == 66 and back["contrib"].op == "sum"
    r2 = np.random.default_rng()
    r2.bit_generator.state = back["rng"]
    assert np.array_equal(r2.random(5), rng.random(5))
    g2 = torch.Generator()
    g2.set_state(back["tgen"])
    assert torch.equal(torch.randn(4, generator=g2), torch.randn(4, generator=tgen))


def test_handoff_reads_only_a_file_of_this_user_alone(tmp_path):
    """A hand-off file round-trips a function and tensors; a file or folder others may read or change, or a link,
    is refused before anything is loaded."""
    import os

    from flower_dp.experiments import handoff

    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    obj = {"fn": _model_factory, "x": torch.arange(6.0)}
    path = handoff.write(obj, folder / "own.pkl")
    assert os.stat(path).st_mode & 0o777 == 0o600
    back = handoff.read(path)
    assert back["fn"] is _model_factory and torch.equal(back["x"], obj["x"])
    with pytest.raises(FileExistsError):  # never over an existing file
        handoff.write(obj, path)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match=r"mode 644.*must be 0600"):
        handoff.read(path)
    os.chmod(path, 0o600)
    os.chmod(folder, 0o755)
    with pytest.raises(PermissionError, match=r"mode 755.*must be 0700"):
        handoff.read(path)
    with pytest.raises(PermissionError, match=r"mode 755.*must be 0700"):
        handoff.write(obj, folder / "other.pkl")
    os.chmod(folder, 0o700)
    os.symlink(path, folder / "link.pkl")
    with pytest.raises(OSError):
        handoff.read(folder / "link.pkl")


def _model_factory():
    return torch.nn.Linear(2, 2)
