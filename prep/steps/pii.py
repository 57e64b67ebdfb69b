"""The built-in PII map (`use = "pii"`): replaces e-mail addresses and IP addresses with placeholders.

Every document is kept; its new text is returned only when something was replaced (None
otherwise). E-mail addresses become `email_replacement` ("<EMAIL>"), IPv6 and then IPv4 addresses
`ip_replacement` ("<IP_ADDRESS>"); `replace_emails` and `replace_ips` switch each off, and
`public_ips_only` (false) leaves the addresses Python's `ipaddress` says are not global (private,
loopback, link-local, documentation ranges...), as datatrove's PIIFormatter does by default.

What is matched, and the patterns' limits:

- An e-mail address is a local part of 1 to 64 ASCII letters, digits and ". _ % + -" starting
  where such a run starts, "@", then dot-separated labels (ASCII letters, digits, inner hyphens,
  at most 63 each) ending in a top-level label of 2 to 63 letters that no letter, digit or hyphen
  follows. Not matched: the rarer characters RFC 5322 allows in a local part (!#$&'*/=?^`{|}~),
  quoted local parts, IP-literal domains ("user@[10.0.0.1]": its IP is replaced), internationalised
  addresses ("josé@exämple.com"), and an address directly followed by local-part characters
  and "@" (in "a@b.cd_e@f.gh" the address replaced is "b.cd_e@f.gh": replacing "a@b.cd" would
  leave "_e@f.gh" to be found by a second pass).
- An IPv4 address is four decimal numbers 0 to 255 without leading zeros, joined by dots, with
  no ASCII letter, digit, "_" or "." before it and no letter, digit, "_" or ".digit" after it. So
  "256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5" and "v1.2.3.4" are left alone; but a version
  number that is a valid address ("version 1.2.3.4") is replaced: no pattern can tell them apart.
  A port or prefix after it stays ("<IP_ADDRESS>:8080").
- An IPv6 address is a run of hex groups and colons (an IPv4 tail allowed) that
  `ipaddress.IPv6Address` accepts and that holds at least three groups, so "::1", "fe80::1" and
  C++ names such as "abc::def" are left alone; a time "12:30:45" or a MAC address is no IPv6
  address. An IPv4 tail of an address left alone is replaced as IPv4 ("::ffff:<IP_ADDRESS>");
  bracketed forms keep their brackets, zone ids ("%eth0") stay after the replacement.

The replacements must not be what they replace: `email_replacement` holds no "@" and starts and
ends with no character an address may start or end with, `ip_replacement` holds no IP address
and starts and ends with no letter, digit, "_", "." or ":", so replacing never makes a new address
of its neighbours; with that, replacing twice gives what replacing once gave. The search skips
ahead in C to what an address must hold (each "@", each pair of colons with at most four hex
digits between, each digit) and checks the rest there: the local part before an "@" is read
back at most 65 characters, an IPv6 candidate is tried at the 5 positions before its first colon,
and every repeat is bounded, so the work is linear in the text (about 90 MB/s per core on text
without addresses, 45 MB/s on text full of them, on a loaded 2-core machine).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import DocumentStep, Outcome, SettingError, StepDocument

LOCAL_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-"
"""What an e-mail address's local part is made of (and what an address may start or end with)."""
EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}"
    r"(?![A-Za-z0-9-])(?![A-Za-z0-9._%+-]*@)")
"""An e-mail address (the module docstring says what it misses); `_replace_emails` finds the
same ones from their "@"."""
AT_DOMAIN = re.compile(EMAIL.pattern[EMAIL.pattern.index("@"):])
"""An e-mail address from its "@" on: a literal first, so the search skips to each "@"."""
OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = re.compile(rf"(?<![A-Za-z0-9_.]){OCTET}(?:\.{OCTET}){{3}}(?![A-Za-z0-9_]|\.[0-9])")
"""An IPv4 address in dotted decimal, not part of a longer dotted run or word."""
DOTTED_FOUR = re.compile(r"[0-9](?<![A-Za-z0-9_.][0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?![A-Za-z0-9_]|\.[0-9])")
"""Four numbers of up to 3 digits joined by dots, bounded as IPV4 is: an IPv4 address when each
is an octet. A digit first, so the search skips to digits (the boundary is checked after it)."""
IPV6 = re.compile(r"(?<![0-9A-Za-z_:.])(?:[0-9A-Fa-f]{0,4}:){2,8}(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}|[0-9A-Fa-f]{1,4})?"
                  r"(?![0-9A-Za-z_:]|\.[0-9])")
"""A candidate IPv6 address: hex groups and colons, an IPv4 tail allowed; `ipaddress` decides."""
TWO_COLONS = re.compile(r":[0-9A-Fa-f]{0,4}:")
"""A candidate's first two colons: a candidate starts at most 4 characters before them."""
IP_EDGE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:")
"""What `ip_replacement` may not start or end with (it could join a neighbour into an address)."""


@register
@dataclass(frozen=True)
class Pii(DocumentStep):
    """Replaces e-mail and IP addresses with placeholders; keeps every document."""

    use: ClassVar[str] = "pii"
    replace_emails: bool = True
    email_replacement: str = "<EMAIL>"
    replace_ips: bool = True
    ip_replacement: str = "<IP_ADDRESS>"
    public_ips_only: bool = False

    def check(self) -> None:
        """A replacement is no address and cannot join its neighbours into one."""
        email = self.email_replacement
        if "@" in email or email and (email[0] in LOCAL_CHARACTERS or email[-1] in LOCAL_CHARACTERS):
            raise SettingError("email_replacement", f"must hold no '@' and neither start nor end with a letter, digit "
                                                    f"or one of . _ % + - (such as '<EMAIL>'), got {email!r}")
        ip = self.ip_replacement
        if IPV4.search(ip) or any(map(_is_ipv6, IPV6.findall(ip))) or ip and (ip[0] in IP_EDGE or ip[-1] in IP_EDGE):
            raise SettingError("ip_replacement", f"must hold no IP address and neither start nor end with a letter, "
                                                 f"digit or one of _ . : (such as '<IP_ADDRESS>'), got {ip!r}")

    def apply(self, document: StepDocument) -> Outcome:
        """The text with its addresses replaced; None when it has none."""
        text = document.text
        if self.replace_emails and "@" in text:
            text = _replace_emails(text, self.email_replacement)
        if self.replace_ips:
            text = self._replace_ipv4(self._replace_ipv6(text))
        return None if text == document.text else text

    def _replace_ipv6(self, text: str) -> str:
        """`text` with its IPv6 addresses replaced (IPV6.sub's matches, found from their first colons)."""
        pieces: list[str] = []
        done = 0  # text[:done] is in pieces
        for colons in TWO_COLONS.finditer(text):
            if colons.start() < done:
                continue
            found = next(filter(None, (IPV6.match(text, start) for start in range(max(done, colons.start() - 4),
                                                                                        colons.start() + 1))), None)
            if found is not None and self._replaced(found.group(), ipv6=True):
                pieces += [text[done:found.start()], self.ip_replacement]
                done = found.end()
        return "".join([*pieces, text[done:]]) if pieces else text

    def _replace_ipv4(self, text: str) -> str:
        """`text` with its IPv4 addresses replaced."""
        return DOTTED_FOUR.sub(lambda found: self.ip_replacement if self._replaced(found.group(), ipv6=False)
                               else found.group(), text) if "." in text else text

    def _replaced(self, candidate: str, ipv6: bool) -> bool:
        """Whether a candidate is an address to replace: a valid one (public, with `public_ips_only`)."""
        if ipv6 and not _is_ipv6(candidate) or not ipv6 and not all(map(_is_octet, candidate.split("."))):
            return False
        return not self.public_ips_only or ipaddress.ip_address(candidate).is_global


def _replace_emails(text: str, replacement: str) -> str:
    """`text` with its e-mail addresses (EMAIL.sub's matches) replaced: each "@" a domain follows,
    with the whole run of local-part characters before it, when that is 1 to 64 long."""
    pieces: list[str] = []
    done = 0  # text[:done] is in pieces
    for domain in AT_DOMAIN.finditer(text):
        at = domain.start()
        before = text[max(0, at - 65):at]
        start = at - (len(before) - len(before.rstrip(LOCAL_CHARACTERS)))
        if done <= start < at and at - start <= 64 and (start == 0 or text[start - 1] not in LOCAL_CHARACTERS):
            pieces += [text[done:start], replacement]
            done = domain.end()
    return "".join([*pieces, text[done:]]) if pieces else text


def _is_octet(number: str) -> bool:
    """A decimal 0 to 255 without leading zeros."""
    return int(number) <= 255 and (number == "0" or not number.startswith("0"))


def _is_ipv6(candidate: str) -> bool:
    """Whether `ipaddress` reads `candidate` as an IPv6 address of at least three groups."""
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return sum(1 for group in candidate.split(":") if group) >= 3  # a dotted IPv4 tail counts as one
