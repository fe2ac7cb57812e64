import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import fedge.privacy.tee.memory as memmod
from fedge.privacy.tee import AttestationError, Report, measure, sign_report, verify_report


def test_measurement_depends_on_code_and_config():
    a = measure([memmod], {"budget": 16})
    assert a == measure([memmod], {"budget": 16})
    assert a != measure([memmod], {"budget": 17})
    import fedge.privacy.tee.channel as ch
    assert a != measure([memmod, ch], {"budget": 16})


def test_good_report_accepted_wrong_measurement_refused():
    m, pk, nonce = measure([memmod], {"b": 1}), b"p" * 32, b"n" * 16
    r = sign_report(m, pk, nonce)
    verify_report(r, expected=m, nonce=nonce)
    with pytest.raises(AttestationError, match="measurement"):
        verify_report(r, expected=measure([memmod], {"b": 2}), nonce=nonce)
    with pytest.raises(AttestationError, match="challenge"):
        verify_report(r, expected=m, nonce=b"o" * 16)


def test_forged_signature_refused():
    m, pk, nonce = b"m" * 32, b"p" * 32, b"n" * 16
    forger = Ed25519PrivateKey.generate()
    body = Report(m, pk, nonce, b"").body()
    with pytest.raises(AttestationError, match="signature"):
        verify_report(Report(m, pk, nonce, forger.sign(body)), expected=m, nonce=nonce)
    good = sign_report(m, pk, nonce)
    with pytest.raises(AttestationError, match="signature"):  # key swapped after signing
        verify_report(Report(m, b"q" * 32, nonce, good.signature), expected=m, nonce=nonce)
