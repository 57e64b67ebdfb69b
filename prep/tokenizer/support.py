"""What gigatoken can reproduce of a tokenizer definition: the definition it loads, the added-token
options it lacks, and the probes of the load check (prep.tokenizer.backends runs them)."""

from __future__ import annotations

import hashlib
import json

from tokenizers import AddedToken, Tokenizer

from prep.machinecache import derived_bytes

MAX_PROBED_ADDED_TOKENS = 64


def gigatoken_definition(tokenizer_json: str, encode_special_tokens: bool) -> str:
    """The tokenizer definition gigatoken loads: without special tokens when they stay plain text.

    gigatoken always matches added tokens as single ids; dropping the special ones reproduces
    the reference's `encode_special_tokens = True`, which skips exactly those matches."""
    if not encode_special_tokens:
        return tokenizer_json
    definition = json.loads(tokenizer_json)
    added = definition.get("added_tokens") or []
    definition["added_tokens"] = [token for token in added if not token.get("special")]
    return json.dumps(definition)


def cached_definition(tokenizer_json: str, encode_special_tokens: bool) -> str:
    """`gigatoken_definition`, cached under the SHA-256 of the tokenizer's JSON (rewriting a
    large vocabulary's JSON costs every worker tenths of a second)."""
    if not encode_special_tokens:
        return tokenizer_json
    sha256 = hashlib.sha256(tokenizer_json.encode("utf-8", "surrogatepass")).hexdigest()
    name = f"gigatoken-definitions/{sha256}-no-specials.json"
    return derived_bytes(name, lambda: gigatoken_definition(tokenizer_json, True).encode()).decode()


def added_tokens(tokenizer: Tokenizer) -> list[AddedToken]:
    """Every added token, in id order."""
    decoder = tokenizer.get_added_tokens_decoder()
    return [decoder[i] for i in sorted(decoder)]


def unsupported_added_tokens(added: list[AddedToken], encode_special_tokens: bool) -> str | None:
    """Why gigatoken would match these added tokens differently from the reference, or None.

    Found by comparing both on random mixes of added tokens: gigatoken ignores `single_word`, and
    a token stripping whitespace next to one that begins or ends with whitespace takes the
    whitespace the reference leaves to the other."""
    matched = [token for token in added if not (encode_special_tokens and token.special)]
    single = next((token for token in matched if token.single_word), None)
    if single is not None:
        return f"added token {single.content!r} is single_word, which gigatoken ignores"
    stripping = next((token for token in matched if token.lstrip or token.rstrip), None)
    spaced = next((token for token in matched if token.content[:1].isspace() or token.content[-1:].isspace()), None)
    if stripping is not None and spaced is not None:
        return (f"added token {stripping.content!r} strips whitespace and added token {spaced.content!r} "
                f"begins or ends with whitespace")
    return None


_PROBES = (
    "", " ", "\n", "hello world", "Hello, World! It's 2024: we'll see 12345678901234567890.",
    "a  b   c    d\n\n\n\t\t  e   ", "   leading and trailing   ", "line\r\nline\rline\n\r\n",
    "x" * 300, "don't I'LL you'VE we'd they're 's 't", "naïve café Ångström e\u0301 n\u0303",
    "Москва 北京市 東京 서울 القاهرة ירושלים Αθήνα हिन्दी ไทย", "👨\u200d👩\u200d👧 🏳\ufe0f\u200d🌈 👍🏽 😀😀",
    "\u00a0\u2009\u3000\u2028\u2029\u0085\u000b\u000c\u180e\u200b\ufeff", "\x00\x01\x1b[0m\x7f",
    "𝟙𝟚 ½ Ⅻ ٣٤ 𝔘𝔫𝔦 \U0001d400", "\ue000\U000f0000\U0010fffd", "ǅ İ ß ﬁ Σς",
    "def f(x):\n    return x ** 2  # comment\n", "1,234.56 3.14159 1e-10 0x1F 007",
)


def probe_texts(added: list[AddedToken]) -> list[str]:
    """Fixed adversarial probes, the first added tokens in the contexts their options change, and
    every other added token alone (its id: the reference may number it unlike the file)."""
    texts = list(_PROBES)
    for token in added[:MAX_PROBED_ADDED_TOKENS]:
        content = token.content
        texts.append(f"{content}x{content} a {content} b\n{content}\n  {content}  .{content}.")
    texts.extend(token.content for token in added[MAX_PROBED_ADDED_TOKENS:])
    return texts
