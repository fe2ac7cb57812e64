import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.core.errors import DivergenceError, MessageError, NonFiniteError
from fedge.core.messages import Message


def test_round_trip_all_dtypes():
    arrays = {
        "f4": torch.randn(3, 4),
        "f8": torch.randn(2, dtype=torch.float64),
        "f2": torch.randn(5).half(),
        "bf": torch.randn(5).bfloat16(),
        "i8": torch.arange(7),
        "u1": torch.arange(6, dtype=torch.uint8).reshape(2, 3),
        "b1": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5),
    }
    msg = Message(
        arrays,
        {"seed": 2**62, "lr": 0.1, "tag": "x", "raw": b"\x00\x01", "ok": True, "none": None},
        {"loss": 1.5},
    )
    back = Message.from_bytes(msg.to_bytes())
    assert back.config == msg.config and back.metrics == msg.metrics
    for k, v in arrays.items():
        assert back.arrays[k].dtype == v.dtype and back.arrays[k].shape == v.shape
        assert torch.equal(back.arrays[k], v)


def test_decoded_arrays_do_not_alias_sender():
    t = torch.zeros(4)
    back = Message.from_bytes(Message({"w": t}).to_bytes())
    back.arrays["w"] += 1
    assert t.sum() == 0


def test_k_scalars_cost_4k_plus_small_framing():
    # BAFFLE batch-level uplink: K float32 loss differences, framing <= 64 bytes
    for k in (1, 100, 500):
        n = Message({"dL": torch.zeros(k)}).nbytes
        assert 4 * k <= n <= 4 * k + 64


def test_nbytes_is_serialized_length_of_a_model():
    w = torch.randn(1000)
    assert Message({"w": w}).nbytes == len(Message({"w": w}).to_bytes())
    assert 4000 <= Message({"w": w}).nbytes <= 4000 + 32


@pytest.mark.parametrize("bad", [b"", b"\x00garbage", b"\x94\x02\x90\x80\x80"])
def test_malformed_bytes_raise_message_error(bad):
    with pytest.raises(MessageError):
        Message.from_bytes(bad)


def test_truncated_array_payload_is_detected():
    data = bytearray(Message({"w": torch.zeros(10)}).to_bytes())
    # shrink the declared bin length is hard; instead corrupt by cutting the payload
    with pytest.raises(MessageError):
        Message.from_bytes(bytes(data[:-8]))


def test_bad_config_value_is_rejected_with_its_name():
    with pytest.raises(MessageError, match="'w'"):
        Message(config={"w": torch.zeros(2)}).to_bytes()


def test_check_finite_names_the_array():
    Message({"a": torch.ones(2)}).check_finite()
    with pytest.raises(MessageError, match="'b'"):
        Message({"a": torch.ones(2), "b": torch.tensor([1.0, math.nan])}).check_finite(
            who="client 3"
        )
    with pytest.raises(MessageError, match="loss"):
        Message(metrics={"loss": math.inf}).check_finite()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_message_is_a_divergence_with_its_round_and_cause(bad):
    import pickle

    with pytest.raises(NonFiniteError) as info:
        Message({"w": torch.tensor([bad])}).check_finite(who="client 3", round=7)
    e = info.value
    assert isinstance(e, DivergenceError) and isinstance(e, MessageError)
    assert (e.round, e.cause) == (7, "array 'w' holds non-finite values (NaN or Inf) (client 3)")
    # a forked worker's client hands it back pickled: the round and cause survive
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.round, back.cause) == (type(e), str(e), 7, e.cause)
    with pytest.raises(NonFiniteError) as info:
        Message(metrics={"loss": bad}).check_finite(who="client 3")
    assert info.value.round is None and info.value.cause == f"metric 'loss' is {bad} (client 3)"


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, width=32), max_size=50), st.integers(-(2**63), 2**63 - 1)
)
def test_round_trip_property(values, seed):
    msg = Message({"v": torch.tensor(values, dtype=torch.float32)}, {"seed": seed})
    back = Message.from_bytes(msg.to_bytes())
    assert torch.equal(back.arrays["v"], msg.arrays["v"]) and back.config["seed"] == seed


def test_config_int_and_float_read_numbers_and_name_bad_values():
    msg = Message.from_bytes(
        Message(config={"round": 7, "seed": 2**62, "lr": 0.25, "tag": "x", "none": None}).to_bytes()
    )
    assert msg.config_int("round") == 7 and msg.config_int("seed") == 2**62
    assert msg.config_int("missing", 3) == 3 and msg.config_int("round", 3) == 7
    assert msg.config_float("lr") == 0.25 and msg.config_float("round") == 7.0
    for key in ("tag", "none", "missing"):
        with pytest.raises(MessageError, match=f"'{key}' is .*expected a number"):
            msg.config_int(key)
        with pytest.raises(MessageError, match=f"'{key}' is .*expected a number"):
            msg.config_float(key)
