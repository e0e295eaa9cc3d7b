"""LeNet on (Fashion-)MNIST for the Gau-LRQ example: data, local training, evaluation (plain PyTorch).

Nothing here knows about privacy: this is the code a Flower user already has.  It lives in
:mod:`flower_dp.experiments.gau_lrq` so that this app, ``run_table.py`` and
``flower-dp reproduce gau-lrq`` run the very same code.  Data follow the paper's Sec. VII: client p gets
``per_class`` samples of every class, drawn independently of other clients (overlap allowed), a
deterministic function of (seed, p).
"""

from flower_dp.experiments.gau_lrq import (arrays_to_model, client_data, ensure_secret_file, evaluate,  # noqa: F401
                                           local_train, model_to_arrays, new_model, seed_for, train)
