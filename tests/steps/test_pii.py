"""The PII map: e-mail, IPv4 and IPv6 addresses become placeholders and what only looks like one
stays; every document is kept, changed only when something was replaced; replacing again changes
nothing and leaves no address; the fast search finds what the plain patterns find."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.steps.pii import EMAIL, IPV4, IPV6, Pii, _is_ipv6
from prep.steps.protocol import SettingError, StepDocument
from tests.helpers import within
from tests.steps.stepsupport import build_with_step, config_error


def _outcome(text: str, **settings: Any) -> object:
    return Pii(**settings).apply(StepDocument("d", text))


@pytest.mark.parametrize(("text", "replaced"), [
    ("Write to john.doe@example.co.uk.", "Write to <EMAIL>."),
    ("a_b+tag%x-y@mail-server.example.org, then", "<EMAIL>, then"),
    ("<j@ex.io>", "<<EMAIL>>"),
    ("邮件：zhang@example.cn。", "邮件：<EMAIL>。"),
    ("🙂a@b.co🙂", "🙂<EMAIL>🙂"),
    ("a@b.cd_e@f.gh", "a@<EMAIL>"),  # "a@b.cd" followed by "_e@": the address is the second run
    ("server 10.0.0.1:8080 up", "server <IP_ADDRESS>:8080 up"),
    ("(255.255.255.255) and 0.0.0.0.", "(<IP_ADDRESS>) and <IP_ADDRESS>."),
    ("服务器10.0.0.1上", "服务器<IP_ADDRESS>上"),
    ("user@[192.168.1.20]", "user@[<IP_ADDRESS>]"),
    ("v6 2001:db8::1, and 2001:0db8:85a3:0000:0000:8a2e:0370:7334.", "v6 <IP_ADDRESS>, and <IP_ADDRESS>."),
    ("64:ff9b::1.2.3.4 and 1:2:3:4:5:6:7::", "<IP_ADDRESS> and <IP_ADDRESS>"),
    ("::ffff:192.0.2.1", "::ffff:<IP_ADDRESS>"),  # two groups: only the IPv4 tail
    ("[2001:db8::8a2e:370:7334]:443", "[<IP_ADDRESS>]:443"),
    ("x@y.zz\r10.1.1.1\r", "<EMAIL>\r<IP_ADDRESS>\r"),
])
def test_addresses_become_placeholders(text: str, replaced: str) -> None:
    assert _outcome(text) == replaced


@pytest.mark.parametrize("text", [
    "user@localhost", "a@b.c", "@handle", "josé@exämple.com", "x@-bad.com", "mail at example dot com",
    "256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "v1.2.3.4", "1.2.3.4a", "3.14159", "version 10.0.300.1",
    "::1", "fe80::1", "abc::def", "std::vector", "12:30:45", "00:1A:2B:3C:4D:5E", "a::b::c", "1:2:3:4:5:6:7:8:9",
    "", "   ", "\r", "nothing to see here",
])
def test_what_only_looks_like_an_address_stays_and_the_document_is_unchanged(text: str) -> None:
    assert _outcome(text) is None


def test_each_kind_can_be_switched_off_and_replaced_with_another_placeholder() -> None:
    text = "mail a@b.co from 8.8.8.8 or 10.0.0.1 or 2606:4700:4700::1111 or 2001:db8::1"
    assert _outcome(text, replace_emails=False) == ("mail a@b.co from <IP_ADDRESS> or <IP_ADDRESS> or <IP_ADDRESS> or "
                                                    "<IP_ADDRESS>")
    assert _outcome(text, replace_ips=False) == "mail <EMAIL> from 8.8.8.8 or 10.0.0.1 or 2606:4700:4700::1111 or 2001:db8::1"
    assert _outcome(text, replace_emails=False, replace_ips=False) is None
    assert _outcome(text, public_ips_only=True) == "mail <EMAIL> from <IP_ADDRESS> or 10.0.0.1 or <IP_ADDRESS> or 2001:db8::1"
    assert _outcome(text, email_replacement="[email]", ip_replacement="") == "mail [email] from  or  or  or "


def test_long_and_hostile_texts_are_linear() -> None:
    with within(30):
        assert _outcome("a" * 2_000_000 + "@" + "b" * 2_000_000) is None
        assert _outcome("a." * 1_000_000 + "@x") is None
        assert _outcome("1." * 1_000_000) is None
        assert _outcome(":" * 1_000_000 + "a:" * 500_000) is None
        assert _outcome("@a.bc " * 200_000) is None
        many = "x@y.zz 1.2.3.4 " * 100_000
        assert _outcome(many) == "<EMAIL> <IP_ADDRESS> " * 100_000


@pytest.mark.parametrize(("settings", "key"), [
    ({"email_replacement": "x@y"}, "email_replacement"),
    ({"email_replacement": "EMAIL"}, "email_replacement"),
    ({"email_replacement": "<email."}, "email_replacement"),
    ({"ip_replacement": "0.0.0.0"}, "ip_replacement"),
    ({"ip_replacement": "<2001:db8::1>"}, "ip_replacement"),
    ({"ip_replacement": "IP"}, "ip_replacement"),
    ({"ip_replacement": "[ip]:"}, "ip_replacement"),
])
def test_replacements_that_could_make_an_address_are_refused_naming_the_key(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(SettingError) as caught:
        Pii(**settings).check()
    assert caught.value.key == key and repr(settings[key]) in caught.value.message
    assert config_error({"use": "pii", **settings}).startswith(f"p.toml: steps[0].{key}: must hold no ")


def test_the_config_types_each_setting() -> None:
    assert config_error({"use": "pii", "replace_emails": "yes"}) == (
        "p.toml: steps[0].replace_emails: expected bool, got str 'yes'")
    assert config_error({"use": "pii", "ip_replacement": 7}) == "p.toml: steps[0].ip_replacement: expected str, got int 7"
    assert config_error({"use": "pii", "phone_replacement": "<PHONE>"}) == "p.toml: steps[0].phone_replacement: unknown key"
    Pii(email_replacement="", ip_replacement="").check()
    Pii(email_replacement="[email]", ip_replacement="<ip>").check()


def _plain(text: str, step: Pii) -> str:
    """What the plain patterns make of `text`: re.sub over the whole text, e-mail, IPv6, IPv4."""
    def keep(found: str, valid: bool) -> bool:
        return not valid or step.public_ips_only and not ipaddress.ip_address(found).is_global

    if step.replace_emails:
        text = EMAIL.sub(lambda found: step.email_replacement, text)
    if step.replace_ips:
        text = IPV6.sub(lambda m: m.group() if keep(m.group(), _is_ipv6(m.group())) else step.ip_replacement, text)
        text = IPV4.sub(lambda m: m.group() if keep(m.group(), True) else step.ip_replacement, text)
    return text


PIECES = st.sampled_from(["a", "b", "co", "x.y", "ab-c", "@", "@", ".", "-", "_", "+", "1", "10", "255", "256", "0", "01",
                          ":", "::", "f", "db8", " ", "\n", "\r", "é", "数", "🙂", "<", ">", "[", "]", "%", "1.2.3.4",
                          "a@b.co", "2001:db8::1"])
SETTINGS = st.fixed_dictionaries({"replace_emails": st.booleans(), "replace_ips": st.booleans(),
                                  "public_ips_only": st.booleans(),
                                  "email_replacement": st.sampled_from(["<EMAIL>", "", "[e]"]),
                                  "ip_replacement": st.sampled_from(["<IP_ADDRESS>", "", "[ip]"])})


@given(st.lists(PIECES, max_size=60).map("".join), SETTINGS)
def test_replacing_is_the_plain_patterns_idempotent_and_leaves_no_address(text: str, settings: dict[str, Any]) -> None:
    step = Pii(**settings)
    step.check()
    outcome = step.apply(StepDocument(None, text))
    result = text if outcome is None else outcome
    assert outcome is None or outcome != text
    assert result == _plain(text, step)
    assert step.apply(StepDocument(None, result)) is None
    if settings["replace_emails"]:
        assert EMAIL.search(result) is None
    if settings["replace_ips"] and not settings["public_ips_only"]:
        assert IPV4.search(result) is None and not any(map(_is_ipv6, IPV6.findall(result)))


def test_a_build_keeps_every_document_and_counts_the_changed_ones(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = {"mail": "Write to anna@example.org for the schedule.", "ip": "The server at 203.0.113.9 answered.",
             "plain": "Nothing private here.", "version": "Version 1.2.3 of the tool is out."}
    stats, written, config = build_with_step(tmp_path, tokenizer_path, texts, 'use = "pii"\nip_replacement = "[ip]"')
    assert written == {**texts, "mail": "Write to <EMAIL> for the schedule.", "ip": "The server at [ip] answered."}
    assert stats == {"use": "pii", "documents": 4, "text_bytes": sum(len(t.encode()) for t in texts.values()),
                     "kept": 4, "dropped": 0, "dropped_bytes": 0, "changed": 2, "reasons": {}}
    assert config == {"use": "pii", "replace_emails": True, "email_replacement": "<EMAIL>", "replace_ips": True,
                      "ip_replacement": "[ip]", "public_ips_only": False}
    assert re.fullmatch(r"[^@]*", "".join(written.values()))
