"""A user's Flower app (own model, own data loading) turned into a private push-sum run."""

__all__: list[str] = []
