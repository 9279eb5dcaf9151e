"""A worker on a second machine reaches the first machine's Temporal over TLS, set by the
standard TEMPORAL_TLS_* variables; none set, plain gRPC as on one machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from refloop.runtime.client import temporal_tls


def test_no_tls_variable_is_plain_grpc():
    assert temporal_tls({"TEMPORAL_ADDRESS": "temporal:7233"}) is False


def test_the_ca_client_certificate_and_server_name_come_from_the_variables(tmp_path: Path):
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    for name, path in files.items():
        path.write_text(f"-----{name}-----\n")
    tls = temporal_tls({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(files["ca"]),
                        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(files["cert"]),
                        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(files["key"]),
                        "TEMPORAL_TLS_SERVER_NAME": "temporal.example.com"})
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == b"-----ca-----\n" and tls.domain == "temporal.example.com"
    assert tls.client_cert == b"-----cert-----\n"
    assert tls.client_private_key == b"-----key-----\n"
    assert isinstance(temporal_tls({"TEMPORAL_TLS": "true"}), TLSConfig)  # system CAs


def test_a_missing_certificate_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(Exception, match="nowhere.pem"):
        temporal_tls({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tmp_path / "nowhere.pem")})
