"""The ClientApp: ordinary Flower + PyTorch training; Gau-LRQ is one mod (drop-in)."""

from __future__ import annotations

from flwr.clientapp import ClientApp

from flower_dp import gau_lrq_mod  # reads this client's own key: run config "lrq-key-dir"

from .task import train  # train(msg, context): Q local SGD steps, replies with the new weights (no privacy code)

app = ClientApp(mods=[gau_lrq_mod])
app.train()(train)

