"""Privacy: GDP, rigorous accountants (PLD/RDP via dp-accounting), calibration, budgets, paper formulas.

Every run reports the rigorous eps of the noise actually added next to the eps the
paper's formula claims (docs/privacy.md).
"""

from . import paper, rdp_fast
from .accountant import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    ADJACENCIES,
    SAMPLINGS,
    GaussianStep,
    LaplaceStep,
    NodeAccountant,
    bucket_steps,
    rigorous_delta,
    epsilon_and_bound,
    rigorous_epsilon,
)
from .budget import UNITS, PrivacyBudget, charge_replay, max_steps
from .calibration import (
    CALIBRATIONS,
    DynD2PSchedule,
    calibrate,
    calibrate_noise_multiplier,
    calibrate_schedule,
    dyn_d2p_schedule,
)
from .calibration_algos import (
    DPPSAccounting,
    GaussianCalibration,
    dp_csgp_calibration,
    dpps_accounting,
    privsgp_vr_calibration,
)
from . import gau_lrq
from .gau_lrq import client_level_epsilon, gau_lrq_schedule
from .gdp import (
    GDPResult,
    clt_composed_mu,
    compose_mu,
    delta_from_mu_eps,
    dyn_d2p_mu0,
    dyn_d2p_mu_bar,
    eps_from_mu_delta,
    mu_from_eps_delta,
)

__all__ = [
    "paper",
    "rdp_fast",
    "ACCOUNTANTS",
    "SAMPLINGS",
    "UNITS",
    "rigorous_delta",
    "calibrate_schedule",
    "ADJACENCIES",
    "CALIBRATIONS",
    "GaussianStep",
    "LaplaceStep",
    "NodeAccountant",
    "bucket_steps",
    "epsilon_and_bound",
    "rigorous_epsilon",
    "PrivacyBudget",
    "charge_replay",
    "max_steps",
    "calibrate",
    "calibrate_noise_multiplier",
    "DynD2PSchedule",
    "dyn_d2p_schedule",
    "GaussianCalibration",
    "privsgp_vr_calibration",
    "dp_csgp_calibration",
    "client_level_epsilon",
    "gau_lrq_schedule",
    "gau_lrq",
    "DPPSAccounting",
    "dpps_accounting",
    "GDPResult",
    "delta_from_mu_eps",
    "mu_from_eps_delta",
    "eps_from_mu_delta",
    "compose_mu",
    "clt_composed_mu",
    "dyn_d2p_mu_bar",
    "dyn_d2p_mu0",
]
