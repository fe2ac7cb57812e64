"""PrivacyConfig: defaults, range checks and the refusals, each message naming the fix."""

import math
import warnings

import pytest

from fedge.core.errors import ConfigError, PrivacyWarning
from fedge.core.validation import validate_section
from fedge.privacy.dp.config import PrivacyConfig


def test_defaults_are_off_and_valid():
    cfg = PrivacyConfig()
    assert cfg.mechanism == "none" and not cfg.enabled
    assert cfg.delta == 1e-6 and cfg.sampling == "fixed" and cfg.accountant == "rdp"


@pytest.mark.parametrize(
    "data,needles",
    [
        ({"noise_multiplier": -1.0}, ["privacy.noise_multiplier", "-1", ">= 0"]),
        ({"noise_multiplier": math.inf}, ["noise_multiplier", "finite"]),
        ({"noise_multiplier": math.nan}, ["noise_multiplier", "finite"]),
        ({"clip": 0.0}, ["privacy.clip", "> 0"]),
        ({"clip": -2.0}, ["privacy.clip", "-2"]),
        ({"clip": math.nan}, ["privacy.clip"]),
        ({"delta": 1.0}, ["privacy.delta", "(0, 1)", "1e-6"]),
        ({"delta": 0.0}, ["privacy.delta"]),
        ({"target_epsilon": 0.0}, ["target_epsilon", "> 0"]),
        ({"target_epsilon": math.inf}, ["target_epsilon", "finite"]),
        ({"mechanism": "laplace"}, ["mechanism", "gaussian", "tree"]),
        ({"mechanism": "tree", "sampling": "fixed"}, ["sampling=shuffle", "at most once per tree"]),
        ({"mechanism": "tree", "sampling": "poisson"}, ["sampling=shuffle", "mechanism=gaussian"]),
        ({"mechanism": "gaussian", "accountant": "pld"}, ["accountant=rdp", "sampling=poisson"]),
        ({"mechanism": "gaussian", "momentum": 0.9}, ["mechanism=tree"]),
        ({"mechanism": "tree", "sampling": "shuffle", "momentum": 1.0}, ["momentum", "[0, 1)"]),
        (
            {"mechanism": "tree", "sampling": "shuffle", "tree_restart_rounds": 0},
            ["tree_restart_rounds", ">= 1"],
        ),
        (
            {"mechanism": "gaussian", "clip": math.inf, "noise_multiplier": 1.0},
            ["infinite", "finite clip"],
        ),
        (
            {
                "noise_multiplier": 1.0,
                "sampling": "poisson",
            },  # DP keys without a mechanism: no DP, so an error
            [
                "privacy.noise_multiplier=1.0, privacy.sampling='poisson' set, but privacy.mechanism=none",
                "mechanism=gaussian",
            ],
        ),
        ({"noise": 1.0}, ["unknown config key 'privacy.noise'", "noise_multiplier"]),
    ],
)
def test_bad_input_names_the_key_and_the_fix(data, needles):
    with pytest.raises(ConfigError) as exc:
        validate_section(PrivacyConfig, data, prefix="privacy.")
    for needle in needles:
        assert needle in str(exc.value), str(exc.value)


def test_infinite_clip_without_noise_is_allowed():
    cfg = PrivacyConfig(mechanism="gaussian", clip=math.inf, noise_multiplier=0.0)
    assert math.isinf(cfg.clip)


def test_zero_noise_warns_that_the_run_has_no_privacy():
    with pytest.warns(PrivacyWarning, match=r"noise_multiplier=0 adds no noise.*no differential"):
        PrivacyConfig(mechanism="gaussian", clip=1.0, noise_multiplier=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrivacyConfig(mechanism="gaussian", clip=1.0, noise_multiplier=0.5)
        PrivacyConfig()  # mechanism none: no privacy asked for, nothing to warn about
