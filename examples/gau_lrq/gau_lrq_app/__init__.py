"""Gau-LRQ example Flower app (flower-dp)."""

try:
    import flower_dp  # noqa: F401
except ImportError as exc:  # the app declares no dependency Flower could install (see pyproject.toml)
    raise ImportError(
        "the gau_lrq example needs flower-dp in the environment that runs flwr / flower-superlink / "
        "flower-supernode, got no module 'flower_dp'; flower-dp is not on a package registry, so Flower's "
        "runtime dependency installation cannot fetch it: run `pip install -e <your flower-dp clone>` in that "
        "environment, then `flwr run examples/gau_lrq`") from exc
