"""Which webhook destinations are allowed, decided on addresses from a stub resolver: no
test here looks anything up in DNS or connects anywhere (the guard would raise)."""

import ipaddress

import pytest

from gpuq.batches.destinations import DestinationPolicy, RefusedDestination, internal_kind, redact_url
from tests.network_guard import PUBLIC_ADDRESS, StubResolver, guarded_network


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    with guarded_network(monkeypatch) as network:
        yield network
    assert network.connections == [] and network.lookups == []


RESOLVER = StubResolver(
    {
        "hooks.example": [PUBLIC_ADDRESS],
        "localhost": ["127.0.0.1", "::1"],
        "db.internal": ["10.1.2.3"],
        "split.example": [PUBLIC_ADDRESS, "192.168.1.10"],  # one bad address is enough to refuse
        "metadata.example": ["169.254.169.254"],
        "v6.internal": ["fd12:3456::1"],
    }
)
DEFAULT = DestinationPolicy.from_setting("", resolve=RESOLVER)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8000/v1/keys", "loopback"),
        ("http://127.1/", "loopback"),
        ("http://0x7f000001/", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://0177.0.0.1/", "loopback"),
        ("http://localhost:6379/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://10.0.0.5/", "private"),
        ("http://db.internal:5432/", "private"),
        ("http://172.16.0.1/", "private"),
        ("https://192.168.0.1/", "private"),
        ("http://split.example/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://metadata.example/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fd00::1]/", "unique-local"),
        ("http://v6.internal/", "unique-local"),
        ("http://0.0.0.0:8000/", "unspecified"),
        ("http://100.64.0.1/", "non-public"),  # shared address space (carrier NAT)
        ("http://[64:ff9b::a00:1]/", "private"),  # 10.0.0.1 through NAT64
        ("http://224.0.0.1/", "multicast"),
    ],
)
def test_internal_destinations_are_refused_by_default(url, kind):
    with pytest.raises(RefusedDestination) as refused:
        DEFAULT.check(url)
    assert f"a {kind} address" in str(refused.value) and "GPUQ_WEBHOOK_ALLOWED_HOSTS" in str(refused.value)
    assert "10.1.2.3" not in str(refused.value)  # what internal names resolve to is not told to submitters


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://hooks.example/", "http:// or https://"),
        ("http:///path", "http:// or https://"),
        ("http://unknown.example/", "does not resolve"),
        ("http://hooks.example:99999/", "not a valid URL"),
    ],
)
def test_urls_that_cannot_be_sent_to_say_why(url, why):
    with pytest.raises(RefusedDestination, match=why):
        DEFAULT.check(url)


def test_a_public_destination_is_connected_to_at_the_address_checked():
    destination = DEFAULT.check("https://Hooks.Example./hook")
    assert (destination.host, destination.address) == ("hooks.example", PUBLIC_ADDRESS)


def test_an_admin_may_allow_named_hosts_patterns_and_ranges():
    setting = " db.internal, *.corp.example, 127.0.0.0/8, fd12:3456::/32 "
    policy = DestinationPolicy.from_setting(setting, resolve=RESOLVER)
    assert policy.check("http://db.internal/").address == "10.1.2.3"
    assert policy.check("http://127.0.0.1:9/").address == "127.0.0.1"
    with pytest.raises(RefusedDestination, match="loopback"):
        policy.check("http://localhost/")  # it also resolves to ::1, which was not allowed: every address counts
    assert DestinationPolicy.from_setting("127.0.0.1,::1", resolve=RESOLVER).check("http://localhost/").address
    assert policy.check("http://v6.internal/").address == "fd12:3456::1"
    RESOLVER.answers["ci.corp.example"] = ["10.9.9.9"]
    assert policy.check("http://ci.corp.example/").address == "10.9.9.9"
    with pytest.raises(RefusedDestination):
        policy.check("http://10.0.0.5/")  # not in what was allowed
    with pytest.raises(RefusedDestination):
        policy.check("http://corp.example.evil/")


def test_public_addresses_are_not_called_internal():
    for address in (PUBLIC_ADDRESS, "8.8.8.8", "2606:4700:4700::1111"):
        assert internal_kind(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:s3cret@hooks.example/h?x=1", "https://***@hooks.example/h?x=1"),
        ("https://tok3n@hooks.example:8443/h", "https://***@hooks.example:8443/h"),
        ("https://hooks.example/h", "https://hooks.example/h"),
    ],
)
def test_credentials_in_urls_are_redacted(url, shown):
    assert redact_url(url) == shown
