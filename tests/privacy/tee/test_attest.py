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


# -- the platform (simulated fuses) -----------------------------------------------------------


@pytest.fixture
def fresh_platforms(monkeypatch):
    """No platform cached in this process: what a new process would see."""
    import fedge.privacy.tee.attest as at

    monkeypatch.setattr(at, "_PLATFORMS", {})
    return at


def test_platform_file_is_private_and_gives_the_same_keys_to_a_later_process(
    tmp_path, monkeypatch, fresh_platforms
):
    at = fresh_platforms
    monkeypatch.setenv("FEDGE_TEE_PLATFORM", str(tmp_path / "fuses" / "platform"))
    key, pub, pid = at.hardware_key("server"), at.vendor_public_key(), at.platform_id()
    path = tmp_path / "fuses" / "platform"
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == at._SIZE
    assert at.hardware_key("client-1") != key and len(key) == 32
    monkeypatch.setattr(at, "_PLATFORMS", {})  # a new process: reads the file
    assert (at.hardware_key("server"), at.vendor_public_key(), at.platform_id()) == (key, pub, pid)
    report = sign_report(b"m" * 32, b"p" * 32, b"n" * 16)
    verify_report(report, expected=b"m" * 32, nonce=b"n" * 16)
    monkeypatch.setenv("FEDGE_TEE_PLATFORM", str(tmp_path / "another"))  # another machine
    assert at.hardware_key("server") != key and at.platform_id() != pid
    with pytest.raises(
        AttestationError, match="signature"
    ):  # its attestation key did not sign that report
        verify_report(report, expected=b"m" * 32, nonce=b"n" * 16)


def test_default_platform_path_follows_xdg_state_home(tmp_path, monkeypatch):
    from fedge.privacy.tee import platform_path

    monkeypatch.delenv("FEDGE_TEE_PLATFORM")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert platform_path() == tmp_path / "fedge" / "tee-platform"


def test_a_file_that_is_not_a_platform_is_a_clear_error(tmp_path, monkeypatch, fresh_platforms):
    bad = tmp_path / "platform"
    bad.write_bytes(b"hello")
    monkeypatch.setenv("FEDGE_TEE_PLATFORM", str(bad))
    with pytest.raises(
        AttestationError, match=r"not a fedge TEE platform file \(5 bytes.*FEDGE_TEE_PLATFORM"
    ):
        fresh_platforms.hardware_key("server")
    assert bad.read_bytes() == b"hello"  # left as it was


def test_unwritable_platform_warns_and_lives_in_the_process(tmp_path, monkeypatch, fresh_platforms):
    at = fresh_platforms
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(
        "FEDGE_TEE_PLATFORM", str(tmp_path / "a-file" / "platform")
    )  # cannot be created, even by root
    with pytest.warns(RuntimeWarning, match="cannot be resumed by another process"):
        key = at.hardware_key("server")
    assert at.hardware_key("server") == key and (tmp_path / "a-file").read_text() == ""
