"""The metrics server listens on loopback unless told otherwise (issue 12.13)."""

from __future__ import annotations

import socket

import pytest

from slurm_aigc.telemetry.metrics import MetricsError, NullMetrics, PrometheusMetrics, open_metrics


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def other_address() -> str | None:
    """An IPv4 address of this host that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def test_metrics_listen_on_loopback_only_by_default() -> None:
    port = free_port()
    assert isinstance(open_metrics("agent", port), PrometheusMetrics)
    assert reachable("127.0.0.1", port)
    address = other_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to check against")
    assert not reachable(address, port)


def test_metrics_address_is_configurable_and_checked() -> None:
    address = other_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    port = free_port()
    open_metrics("agent", port, address)
    assert reachable(address, port)
    with pytest.raises(MetricsError, match="must be an IP address.*'localhost; rm'"):
        PrometheusMetrics("agent").serve(free_port(), "localhost; rm")


def test_no_port_no_server() -> None:
    assert isinstance(open_metrics("agent", None, "::1"), NullMetrics)
