"""Gau-LRQ in a real Flower simulation (Alg. 1 mapped onto Flower rounds).

Each test runs ``flwr run`` (:func:`flower_dp.experiments.flower_run.run_app`: a SuperLink and a Ray head of its own on
127.0.0.1) of this module's :data:`server_app` (or :data:`mismatch_server_app`) and :data:`client_app`.  The
ClientApp is written as a Flower user would write it (softmax regression in numpy on a fixed synthetic task); only
the mod is added, reading the secret file named in the run config.  The ServerApps run in another process: they
build the strategies from a JSON file of keyword arguments and write what the assertions read back to files
(JSON, and ``.npz`` for arrays).
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from flower_dp.experiments.flower_run import run_app
from flower_dp.mechanisms.gau_lrq_codec import clip_update
from flower_dp.privacy.gau_lrq import client_level_epsilon
from flower_dp.strategies.gau_lrq import GauLRQ

N, B, FEAT, CLS, Q, LR, CLIP = 20, 5, 100, 10, 5, 0.5, 0.5
HERE = Path(__file__).resolve().parent


def _task(seed: int, n: int):
    """A fixed linearly separable 10-class task (teacher weights from seed 0)."""
    teacher = np.random.default_rng(0).normal(size=(FEAT, CLS))
    x = np.random.default_rng(seed).normal(size=(n, FEAT))
    return x, np.argmax(x @ teacher, axis=1)


def local_train(w: np.ndarray, b: np.ndarray, pid: int) -> tuple[np.ndarray, np.ndarray]:
    """Q full-batch gradient steps of softmax regression on partition ``pid`` (deterministic)."""
    x, y = _task(1000 + pid, 64)
    w, b = w.astype(np.float64), b.astype(np.float64)
    for _ in range(Q):
        logits = x @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        w, b = w - LR * x.T @ p / len(y), b - LR * p.mean(0)
    return w.astype(np.float32), b.astype(np.float32)


def accuracy(arrays: ArrayRecord) -> float:
    x, y = _task(7, 2000)
    return float(np.mean(np.argmax(x @ arrays["w"].numpy() + arrays["b"].numpy(), 1) == y))


def user_client_app() -> ClientApp:
    """An ordinary Flower ClientApp; the only Gau-LRQ line is the mod (each node reads its own key from the run
    config's ``lrq-key-dir``)."""
    app = ClientApp(mods=[make_gau_lrq_mod()])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        w, b = local_train(arrays["w"].numpy(), arrays["b"].numpy(), int(context.node_config["partition-id"]))
        content = RecordDict({"arrays": ArrayRecord({"w": Array(w), "b": Array(b)}),
                              "metrics": MetricRecord({"num-examples": 64})})
        return Message(content=content, reply_to=msg)

    return app


def _initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((FEAT, CLS), np.float32)), "b": Array(np.zeros(CLS, np.float32))})


#: the user's ClientApp of every simulation below
client_app = user_client_app()
#: runs ``GauLRQ(**kw)`` for each ``kw`` of the run config's ``spec-file``, one after another, and writes each one's
#: record to ``out-dir`` (:func:`_write_record`)
server_app = ServerApp()
#: ``GauLRQ(num_clients=5)`` on 4 SuperNodes; writes the error and how long ``start`` took to fail to ``out-dir``
mismatch_server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    spec = json.loads(Path(str(rc["spec-file"])).read_text())
    for i, kw in enumerate(spec["strategies"]):
        s = GauLRQ(**kw, key_dir=str(rc["lrq-key-dir"]))
        # a lost reply ends its round after 300 s (a round takes ~1 s) instead of Flower's default hour
        result = s.start(grid=grid, initial_arrays=_initial(), num_rounds=spec["num_rounds"], timeout=300,
                         evaluate_fn=lambda r, a: MetricRecord({"accuracy": accuracy(a)}))
        _write_record(Path(str(rc["out-dir"])) / str(i), s, result)


def _write_record(out: Path, s: GauLRQ, result) -> None:
    """What the tests read of a finished strategy: ``record.json`` (results, stop reason, repr, the server-side
    metrics per round) and ``arrays.npz`` (the final model, every round's theta_k and decoded updates)."""
    out.mkdir(parents=True)
    (out / "record.json").write_text(json.dumps({
        "results": s.results(), "stop_reason": s.stop_reason, "method": s.method, "repr": repr(s),
        "evaluate_metrics_serverapp": {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()},
        "final_names": list(result.arrays.keys())}, default=lambda a: a.tolist()))
    arrays = {f"final/{n}": a.numpy() for n, a in result.arrays.items()}
    for k, theta in s.thetas.items():
        arrays.update({f"theta/{k}/{i}": t for i, t in enumerate(theta)})
    for k, per_client in s.decoded.items():
        arrays.update({f"decoded/{k}/{pid}": hat for pid, hat in per_client.items()})
    np.savez(out / "arrays.npz", **arrays)


def _read_record(out: Path) -> SimpleNamespace:
    """:func:`_write_record`'s files as the attributes the tests read (``results`` is ``GauLRQ.results()``)."""
    rec = json.loads((out / "record.json").read_text())
    thetas, decoded, final = {}, {}, {}
    with np.load(out / "arrays.npz") as z:
        for key in z.files:
            kind, *rest = key.split("/")
            if kind == "final":
                final[rest[0]] = z[key]
            elif kind == "theta":
                thetas.setdefault(int(rest[0]), {})[int(rest[1])] = z[key]
            else:
                decoded.setdefault(int(rest[0]), {})[int(rest[1])] = z[key]
    return SimpleNamespace(
        results=rec["results"], rounds=rec["results"]["rounds"], stop_reason=rec["stop_reason"],
        method=rec["method"], repr=rec["repr"],
        evaluate_metrics_serverapp={int(r): m for r, m in rec["evaluate_metrics_serverapp"].items()},
        arrays={n: final[n] for n in rec["final_names"]}, decoded=decoded,
        thetas={k: [v[i] for i in sorted(v)] for k, v in thetas.items()})


def _run(strategies: list[dict], secret_file: str, num_rounds: int, tmp_path: Path) -> tuple[list, str]:
    """Run ``GauLRQ(**kw)`` for each ``kw`` of ``strategies`` under ``flwr run`` on N SuperNodes; return their records
    (:func:`_read_record`) and Flower's output (the ServerApp's log included)."""
    (tmp_path / "spec.json").write_text(json.dumps({"strategies": strategies, "num_rounds": num_rounds}))
    out = tmp_path / "records"
    run = run_app(f"{__name__}:server_app", f"{__name__}:client_app", num_supernodes=N, work_dir=tmp_path / "flwr",
                  pythonpath=[HERE], timeout_s=600,
                  run_config={"spec-file": str(tmp_path / "spec.json"), "out-dir": str(out),
                              "lrq-secret-file": secret_file, "lrq-key-dir": str(tmp_path / "keys")})
    done = [out / str(i) for i in range(len(strategies)) if (out / str(i) / "arrays.npz").is_file()]
    assert len(done) == len(strategies), f"the ServerApp did not finish:\n{run.tail()}"
    return [_read_record(d) for d in done], run.text


@pytest.fixture
def secret_file(tmp_path):
    secret = secrets.token_hex(32).encode()  # printable, so a text grep would find it
    path = tmp_path / "lrq.secret"
    path.write_bytes(secret)
    path.chmod(0o600)
    return str(path), secret


@pytest.mark.flower
def test_lrq_end_to_end_exact_gaussian_hand_model_budget_stop_no_secret(tmp_path, secret_file):
    """Drop-in ClientApp + mod + GauLRQ: decoded - clipped ~ N(0, sigma^2); model = hand aggregate; clean budget stop."""
    path, secret = secret_file
    z = 1.5
    e4, e5 = (client_level_epsilon(np.full(r, z), 1e-5, B=B, N=N) for r in (4, 5))
    eps_budget = (e4 + e5) / 2  # 4 rounds fit, the 5th does not
    kw = dict(num_clients=N, clients_per_round=B, clip=CLIP, num_rounds=6, epsilon=eps_budget, delta=1e-5,
              noise_multiplier=z, secret_file=path, keep_decoded=True, out_dir=str(tmp_path / "out"),
              stream_nonce="e2e")
    (strat,), log_text = _run([kw], path, num_rounds=6, tmp_path=tmp_path)

    # clean stop before round 5, results saved
    assert strat.stop_reason.startswith("budget"), strat.stop_reason
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["rounds_completed"] == 4 and saved["stop_reason"].startswith("budget")
    assert saved["eps_rigorous"] <= eps_budget and abs(saved["eps_rigorous"] - e4) < 1e-9
    # every round: exactly B sampled, all replied, bits reported; the integer payloads are < 1/4 of float32,
    # and the bytes Flower carried (whole serialized replies) are the payload plus a small constant overhead
    d = FEAT * CLS + CLS
    for r in saved["rounds"]:
        assert r["sampled"] == B and r["received"] == B and r["dropped"] == 0
        assert r["bytes_payload"] < B * 4 * d / 4
        assert r["bytes_payload"] < r["bytes_carried"] < r["bytes_payload"] + B * 2000
        assert r["bytes_downlink"] > B * 4 * d  # float32 model to each sampled client
        assert 0 < r["bits_per_coord"] <= 8  # bits per coordinate in [0, 8]
        assert r["bits_algorithmic"] <= 8 * r["bytes_payload"] + 32 * B

    # decoded minus the clients' own clipped updates (recomputed here from theta_k): exactly N(0, sigma^2)
    sigma = z * CLIP / np.sqrt(B)
    errs, theta = [], [a.numpy() for a in _initial().values()]
    for k in range(4):
        assert len(strat.decoded[k]) == B and set(strat.decoded[k]) <= set(range(N))
        assert all(np.array_equal(t, s) for t, s in zip(strat.thetas[k], theta))  # theta_k is the hand model
        for pid, hat in strat.decoded[k].items():
            w, b = local_train(strat.thetas[k][0], strat.thetas[k][1], pid)
            delta = np.concatenate([(w.astype(np.float64) - strat.thetas[k][0]).ravel(),
                                    (b.astype(np.float64) - strat.thetas[k][1]).ravel()])
            errs.append(hat - clip_update(delta, CLIP)[0])
        mean = sum(strat.decoded[k].values()) / B  # weight 1/B (Alg. 1 line 15), server lr 1
        theta = [(t.astype(np.float64) + mean[o:o + t.size].reshape(t.shape)).astype(np.float32)
                 for t, o in zip(theta, (0, FEAT * CLS))]
    e = np.concatenate(errs) / sigma
    assert stats.kstest(e, "norm").pvalue > 1e-3
    assert abs(e.std() - 1) < 0.02 and abs(e.mean()) < 5 / np.sqrt(e.size)
    for got, want in zip(strat.arrays.values(), theta):
        np.testing.assert_array_equal(got, want)

    # the secret never appears in the results or the logs (Flower's output: the ServerApp's and SuperLink's logs)
    text = (tmp_path / "out" / "results.json").read_text() + log_text + strat.repr + str(strat.results)
    assert "configure_train" in log_text or "GauLRQ" in log_text  # the server log was captured
    assert secret.decode() not in text and secret.hex() not in text


@pytest.mark.flower
@pytest.mark.slow
def test_lrq_matches_gau_sgd_accuracy_at_a_quarter_of_the_bits(tmp_path, secret_file):
    """Same sigma, same sampled clients: Gau-LRQ and Gau-SGD reach the same accuracy; LRQ sends <= 1/4 of the bits."""
    path, _ = secret_file
    # N = 20 clients cannot buy a useful client-level eps; fix sigma (z = 0.1) to compare the mechanisms
    kw = dict(num_clients=N, clients_per_round=B, clip=CLIP, num_rounds=8, noise_multiplier=0.1, epsilon=1e9,
              secret_file=path)
    strats, _ = _run([dict(method=m, stream_nonce=f"seed{s}", **kw) for s in range(3) for m in ("lrq", "gaussian")],
                     path, num_rounds=8, tmp_path=tmp_path)
    acc = {m: [] for m in ("lrq", "gaussian")}
    for s in strats:
        acc[s.method].append(s.evaluate_metrics_serverapp[8]["accuracy"])
        assert s.stop_reason == "completed"
    lrq, gau = np.array(acc["lrq"]), np.array(acc["gaussian"])
    # same error law N(0, sigma^2) on the decoded update -> same accuracy up to seed noise
    assert stats.ttest_ind(lrq, gau).pvalue > 0.01 and abs(lrq.mean() - gau.mean()) < 0.05, (lrq, gau)
    assert lrq.mean() > 0.5  # it learns (chance = 0.1)
    bits = {s.method: s.results["total_bits_algorithmic"] for s in strats[:2]}
    payload = {s.method: sum(r["bytes_payload"] for r in s.rounds) for s in strats[:2]}
    carried = {s.method: s.results["total_bytes_carried"] for s in strats[:2]}
    assert bits["lrq"] <= bits["gaussian"] / 4 and payload["lrq"] <= payload["gaussian"] / 4, (bits, payload)
    # whole messages: metadata and metric records add ~1.5 kB per reply, a lot next to this 1,010-parameter model
    assert carried["lrq"] < carried["gaussian"] / 2, carried


@pytest.mark.flower
def test_run_gau_lrq_in_a_flower_simulation_and_in_process_agree_on_the_mechanism(tmp_path):
    """flower_dp.experiments.gau_lrq.run_gau_lrq(backend="simulation"): same strategy and mod under Ray.

    The two backends sample other clients (Flower draws random node ids) but run the same mechanism:
    the same per-round eps, sigma, sample size and payload size per client.
    """
    from flower_dp.experiments.gau_lrq import run_gau_lrq

    small = dict(num_clients=6, clients_per_round=2, num_rounds=2, local_steps=2, dataset="synthetic_fashion_mnist",
                 model="logreg", per_class=5, test_samples=300, lr=0.1, noise_multiplier=0.5)
    sim = run_gau_lrq("gau-lrq", backend="simulation", out_dir=tmp_path / "sim", **small)
    inp = run_gau_lrq("gau-lrq", backend="inprocess", out_dir=tmp_path / "inp", **small)
    assert sim["stop_reason"] == inp["stop_reason"] == "completed" and sim["run"]["backend"] == "simulation"
    for a, b in zip(sim["rounds"], inp["rounds"]):
        assert a["received"] == b["received"] == 2 and a["sigma"] == b["sigma"] and a["eps_rigorous"] == b["eps_rigorous"]
    assert len(sim["accuracy_per_round"]) == 3 and json.loads((tmp_path / "sim" / "results.json").read_text())


def _crashing_train(msg: Message, context: Context) -> Message:
    raise RuntimeError("this client crashes on purpose")


@pytest.mark.flower
def test_run_gau_lrq_simulation_of_a_failing_client_app_raises_with_the_stop_reason(tmp_path):
    """run_gau_lrq(backend="simulation", client_app=...): the caller's ClientApp reaches the SuperNodes (as a
    cloudpickle file); every client fails, the ServerApp stops after max_failed_rounds and the caller gets a
    RuntimeError with the stop reason; results.json says failed; no copy of the secret, no work folder is left behind."""
    from flower_dp.experiments.gau_lrq import run_gau_lrq

    app = ClientApp(mods=[make_gau_lrq_mod()])  # its own key from the key folder named in the run config
    app.train()(_crashing_train)
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("flower-dp-lrq-*"))
    with pytest.raises(RuntimeError, match=r"without finishing the ServerApp \(stop reason 'failed: RuntimeError"):
        run_gau_lrq("gau-lrq", backend="simulation", client_app=app, out_dir=tmp_path / "sim", num_clients=4,
                    clients_per_round=2, num_rounds=4, local_steps=1, dataset="synthetic_fashion_mnist",
                    model="logreg", per_class=5, test_samples=100, noise_multiplier=0.5)
    doc = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert doc["stop_reason"].startswith("failed") and doc["rounds_completed"] == 2, doc["stop_reason"]
    assert "this client crashes on purpose" in doc["stop_reason"]
    # the run's private folder (the secret, the pickled ClientApp, Flower's home) is gone; the error carries the output
    assert set(tmp.glob("flower-dp-lrq-*")) <= before


@pytest.mark.slow
def test_flwr_run_gau_lrq_example_app(tmp_path):
    """`flwr run examples/gau_lrq` (SuperLink and Ray on 127.0.0.1): the app trains, decodes and writes its results."""
    from pathlib import Path

    from flwr_run_helper import flwr_run

    app = Path(__file__).resolve().parents[1] / "examples" / "gau_lrq"
    out = tmp_path / "out"
    text = flwr_run(app, tmp_path, federation_config="num-supernodes=6",
                    run_config=(f"num-clients=6 clients-per-round=3 num-rounds=2 local-steps=2 test-samples=200 "
                                f"out-dir='{out}' lrq-secret-file='{tmp_path / 'lrq.secret'}' "
                                f"lrq-key-dir='{tmp_path / 'keys'}'"))
    res = out / "lrq" / "results.json"
    assert res.is_file(), text[-4000:]
    doc = json.loads(res.read_text())
    assert doc["rounds_completed"] == 2 and doc["stop_reason"] == "completed", doc["stop_reason"]
    assert doc["final_accuracy"] is not None and doc["run"]["dataset"] == "fashion_mnist"
    secret = (tmp_path / "lrq.secret").read_bytes()
    assert secret.hex() not in res.read_text() and secret.hex() not in text   # the secret never leaks


@mismatch_server_app.main()
def _mismatch_main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    s = GauLRQ(num_clients=5, clients_per_round=2, clip=CLIP, epsilon=8.0, num_rounds=2,
               secret_file=str(rc["lrq-secret-file"]), key_dir=str(rc["lrq-key-dir"]), fraction_evaluate=0.0)
    t0 = time.monotonic()
    try:
        s.start(grid=grid, initial_arrays=_initial(), timeout=300)
    except ValueError as exc:
        seen = {"error": str(exc), "s": time.monotonic() - t0}
        Path(str(rc["out-file"])).write_text(json.dumps(seen))


@pytest.mark.flower
def test_size_mismatch_fails_fast_in_a_flower_simulation(secret_file, tmp_path):
    """GauLRQ(num_clients=5) on 4 simulated SuperNodes: a ValueError naming both counts, well under 30 s."""
    path, _ = secret_file
    out = tmp_path / "seen.json"
    run = run_app(f"{__name__}:mismatch_server_app", f"{__name__}:client_app", num_supernodes=4,
                  work_dir=tmp_path / "flwr", pythonpath=[HERE], timeout_s=600,
                  run_config={"out-file": str(out), "lrq-secret-file": path, "lrq-key-dir": str(tmp_path / "keys")})
    assert out.is_file(), f"the ServerApp did not fail with a ValueError:\n{run.tail()}"
    seen = json.loads(out.read_text())
    print(f"size mismatch in simulation: failed {seen['s']:.1f} s after start(), flwr run took {run.wall_s:.1f} s")
    assert "num_clients N = 5" in seen["error"] and "got 4 connected SuperNodes" in seen["error"], seen
    assert seen["s"] < 30
