"""One module per paper; each defines ``PAPER`` (a :class:`flower_dp.reproduce.core.Paper`)."""
