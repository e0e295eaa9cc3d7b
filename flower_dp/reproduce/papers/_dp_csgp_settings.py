"""DP-CSGP's Figs. 1-2 settings per scale and its compressors, shared by the figure tables (:mod:`.dp_csgp`) and the
diagnostic table (:mod:`.dp_csgp_diag`)."""

from __future__ import annotations

from typing import Any

#: label -> (compressor, gamma_c); gamma_c < 1 and gsgd_8 bucketing are our stability choices (not in the paper)
COMPRESSORS: dict[str, tuple[str, float]] = {
    "DP2-SGD (exact)": ("identity", 1.0),
    "rand75": ("rand_0.75", 1.0),
    "rand50": ("rand_0.5", 0.5),
    "gsgd16": ("gsgd_16", 1.0),
    "gsgd8": ("gsgd_8_bucket512", 1.0),
}
SETTINGS: dict[str, dict[str, Any]] = {
    "smoke": dict(n=4, T=8, eval_every=4, B=16, lr=0.1, samples_per_node=256, test_samples=300,
                  eps=[0.5], tradeoff_eps=[0.2], tradeoff=["DP2-SGD (exact)"], compressors=["DP2-SGD (exact)", "rand50"]),
    "ci": dict(n=10, T=500, eval_every=50, B=64, lr=0.1, samples_per_node=None, test_samples=2000,
               eps=[0.5], tradeoff_eps=[0.2], tradeoff=["DP2-SGD (exact)", "rand75"], compressors=list(COMPRESSORS)),
    "full": dict(n=10, T=4687, eval_every=250, B=64, lr=0.01, samples_per_node=None, test_samples=None,
                 eps=[0.5, 0.3, 0.2], tradeoff_eps=[], tradeoff=[], compressors=list(COMPRESSORS) + ["rand10"]),
}
COMPRESSORS["rand10"] = ("rand_0.1", 0.1)
DELTA = 1e-4
for _s in SETTINGS.values():
    _s.update(model="mlp_2layer", dataset="fashion_mnist", G=0.5, figs="Figs. 1-2", model_name="2-layer net")
