"""Redaction (core/redact.py): passwords in URLs, secrets the config holds, log records."""

from __future__ import annotations

import base64
import logging
import re
import string
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from core.api.listen import _cannot
from core.config.model import WeirConfig
from core.logs import RedactingFormatter
from core.masks import masks_in, shown, unmasked
from core.redact import (
    SECRET_MASK,
    Secrets,
    first_line,
    forms_of,
    masked,
    raw_secrets,
    redact,
    redact_traceback,
    redact_urls,
    remember,
    remember_config,
    said,
    secrets_of,
)
from core.spellings import MAX_CUTS


def test_url_passwords_are_masked_also_in_malformed_urls() -> None:
    cases = {
        "nats://u:s3cret@host:4222": "nats://u:***@host:4222",
        "nats:/u:s3cret@host:4222": "nats:/u:***@host:4222",
        "nast://u:s3cret@host:4222": "nast://u:***@host:4222",
        "postgresql://weir:pa%ss@127.0.0.1:5432/app": "postgresql://weir:***@127.0.0.1:5432/app",
        "postgresql://weir:p@ss@h/db": "postgresql://weir:***@h/db",
        "redis://:tok3n@h": "redis://:***@h",
        "url 'https://a:b1@x/y' and 'nats://c:d2@z'": "url 'https://a:***@x/y' and 'nats://c:***@z'",
        "host=h password=s3cret user=u": "host=h password=*** user=u",
        "sasl.password='two words' x": "sasl.password=*** x",
    }
    none = Secrets()  # none remembered: the URL rules alone
    for text, want in cases.items():
        assert none.redact(text) == want, text
    for text in ("http://127.0.0.1:8080/x", 'connection to server at "h", port 5 failed'):
        assert none.redact(text) == text


def test_remembered_secrets_are_masked_in_every_spelling() -> None:
    secret = 'Zq-canary-%-"x'
    secrets = Secrets()
    secrets.remember([secret, "postgresql://weir:Zq-pw-%25-y@db/app", "abc"])
    for form in (secret, "Zq-canary-%25-%22x", 'Zq-canary-%-\\"x', "Zq-pw-%25-y", "Zq-pw-%-y"):
        assert secrets.redact(f"error: {form}!") == "error: ***!", form
    assert secrets.redact("abc weir abcd") == "*** weir abcd"  # short ones too, as a whole


def test_secrets_of_a_config_and_of_a_file_with_mistakes() -> None:
    cfg = WeirConfig.model_validate({
        "api": {"tokens": ["tok-0123456789abcdef"]},
        "sources": [{"name": "a", "kind": "postgres", "url": "postgresql://u:pw1x@h/d",
                     "tables": ["public.t"]}],
        "connectors": [{"name": "n", "type": "nats", "stream": "events",
                        "nats": {"url": "nats://u:pw2x@h:4222"}},
                       {"name": "w", "type": "webhook", "stream": "events",
                        "webhook": {"url": "https://h/x", "headers": {"X-Key": "pw3x"}}}],
    })  # fmt: skip
    assert set(secrets_of(cfg)) == {
        "tok-0123456789abcdef", "postgresql://u:pw1x@h/d", "nats://u:pw2x@h:4222", "pw3x"
    }  # fmt: skip
    assert secrets_of(SecretStr("s")) == ["s"]
    raw = {"store": {"url": "postgresql://u:pw4x@h/d"}, "api": {"tokens": ["tok5x", 3]},
           "connectors": [{"nats": {"url": "nats://h:1", "password": "pw6x"}}]}  # fmt: skip
    assert set(raw_secrets(raw, WeirConfig)) == {"postgresql://u:pw4x@h/d", "tok5x", "pw6x"}


def test_log_records_are_redacted_and_tracebacks_only_when_asked() -> None:
    try:
        raise ValueError("cannot connect to nats://u:s3cret@h:1")
    except ValueError as e:
        record = logging.LogRecord("weir", logging.ERROR, __file__, 1, "failed: %s", (e,),
                                   exc_info=(type(e), e, e.__traceback__))  # fmt: skip
    fmt = "%(levelname)s %(message)s"
    short = RedactingFormatter(fmt, tracebacks=False).format(record)
    assert short == (
        "ERROR failed: cannot connect to nats://u:***@h:1\n"
        "ValueError: cannot connect to nats://u:***@h:1"
    )
    record.exc_text = None  # formatted anew
    full = RedactingFormatter(fmt, tracebacks=True).format(record)
    assert "Traceback (most recent call last)" in full and "s3cret" not in full


def test_pieces_of_a_password_split_at_its_at_and_colon_are_hidden() -> None:
    """A URL parser reads an unencoded '@' or ':' in a password as the end of the user info
    or a port, and its errors then name pieces of the password as a host."""
    s = Secrets()
    s.remember(["postgresql://weir:Zq9@SECRETpw:Hunter2@127.0.0.1:5432/app"])
    said = "cannot reach SECRETpw:Hunter2@127.0.0.1: failed to resolve host 'SECRETpw'"
    assert "SECRET" not in s.redact(said) and "Hunter2" not in s.redact(said)


def test_pieces_of_a_password_split_at_a_slash_or_question_mark_are_hidden() -> None:
    s = Secrets()
    s.remember(["postgresql://weir:Abcd/Efgh?Ijkl@127.0.0.1:5432/app"])
    said = 'invalid integer value "Abcd" for connection option "port"; path Efgh?Ijkl@127'
    assert not {"Abcd", "Efgh", "Ijkl"} & set(re.findall(r"\w+", s.redact(said)))


def test_pieces_of_a_password_given_alone_are_hidden() -> None:
    """secrets_of gives a URL's password alone: its pieces are hidden as well."""
    s = Secrets()
    s.remember(secrets_of("nats://bob:S3cr3t/pa?ss#w0rd@127.0.0.1:4222"))
    assert s.redact("Port could not be cast to integer value as 'S3cr3t'").endswith("'***'")
    s.remember(["postgresql://weir@127.0.0.1/app"])  # no password: its parts are no secret
    assert s.redact("user weir on app") == "user weir on app"


def test_key_and_signature_query_parameters_are_hidden() -> None:
    """A webhook URL may carry its credential as a query parameter of any of these names."""
    got = redact_urls("POST http://h:1/hook?api_key=K1secret&X-Amz-Signature=S1g&token=T0k 302")
    assert got == "POST http://h:1/hook?api_key=***&X-Amz-Signature=***&token=*** 302"


def test_userinfo_without_a_scheme_or_with_a_broken_one_is_masked() -> None:
    """``nats//user:pass@host`` (a colon left out) and Kafka's ``user:pass@host:port``."""
    for text, want in {
        "'nats//natsuser:pw9@127.0.0.1:4222': expected nats://host:port":
            "'nats//natsuser:***@127.0.0.1:4222': expected nats://host:port",
        "kuser:pw9@127.0.0.1:9092/bootstrap: failed": "kuser:***@127.0.0.1:9092/bootstrap: failed",
        "postgresql://weir@127.0.0.1/app": "postgresql://weir@127.0.0.1/app",  # no password
    }.items():  # fmt: skip
        assert redact_urls(text) == want


_WORD = st.text(string.ascii_letters + string.digits, min_size=1, max_size=8)
_SHORT_OR_LETTERS = _WORD.filter(lambda w: len(w) < 8 or w.isalpha())


@given(secret=_SHORT_OR_LETTERS, before=_WORD, after=_WORD)
def test_a_secret_is_masked_whole_never_inside_a_word(secret: str, before: str, after: str) -> None:
    """The password ``secret`` leaves ``secretnats`` and ``mysecret`` alone, and masks itself
    wherever it stands alone, however short."""
    s = Secrets()
    s.remember([secret])
    assert s.redact(f"{before}{secret}{after} {secret}_x") == f"{before}{secret}{after} {secret}_x"
    assert s.redact(f"({secret}) '{secret}'.") == "(***) '***'."


@given(
    secret=st.text(string.ascii_uppercase + string.digits, min_size=8, max_size=12).filter(
        lambda w: not w.isalpha()
    ),
    before=st.text(string.ascii_lowercase, min_size=1, max_size=8),
)
def test_a_secret_no_word_could_be_is_masked_also_inside_one(secret: str, before: str) -> None:
    """A receiver that echoes a token glued to its own text (``xxx…Zq8-Hidden-Token``, cut at
    200 characters) showed it, or a piece of it: one of 8 characters or more that is more than
    letters is masked wherever it stands."""
    s = Secrets()
    s.remember([secret])
    assert s.redact(f"{before}{secret}x {secret}") == f"{before}***x ***"
    assert masked(f"x{secret}", forms_of([secret])) == "x***"


def test_a_secret_split_by_lines_trimmed_or_sent_as_basic_auth_is_masked() -> None:
    s = Secrets()
    s.remember(["Bearer tok-canary9\n", "line-one9\nline-two9", "http://hu:pw%40x9@h/y"])
    said = "Illegal header value: Bearer tok-canary9 | line-two9 | line-one9"
    assert s.redact(said) == "Illegal header value: *** | *** | ***"
    basic = base64.b64encode(b"hu:pw@x9").decode()
    assert s.redact(f'{{"authorization": "Basic {basic}"}}') == '{"authorization": "Basic ***"}'
    assert s.redact("POST http://h/y failed") == "POST http://h/y failed"  # the host is none


def test_a_line_of_a_secret_that_is_a_word_leaves_that_word_in_others_text() -> None:
    """A secret's lines are masked alone when they could only be its own: long, or more than a
    word. The header value ``line\n…`` masked 'line' in Weir's own 422 (found by an outside
    tryout)."""
    forms = forms_of(["line\nBearer tok-9x", "token\nsecretive-words"])
    said = "headers.Authorization: a line break no header can carry; token: secretive-words"
    assert (
        masked(said, forms) == "headers.Authorization: a line break no header can carry; token: ***"
    )
    assert "tok-9x" not in masked("Bearer tok-9x", forms)


def test_a_body_with_many_delimiters_is_masked_by_its_runs_alone() -> None:
    """Beyond MAX_CUTS delimiters a 'password' is a body's text: its runs are masked each alone,
    not every pair of them (thousands of pairs stalled the API's loop for minutes); a URL
    password with fewer keeps its pairs, which a parser may print joined."""
    runs = [f"run{i:04d}x" for i in range(2000)]
    started = time.perf_counter()
    forms = forms_of([f"http://u:{'/'.join(runs)}@h"])
    assert time.perf_counter() - started < 2
    assert set(runs) <= set(forms) and "run0001x/run0002x" not in forms
    few = forms_of([f"http://u:{'/'.join(runs[: MAX_CUTS + 1])}@h"])
    assert "run0001x/run0002x" in few
    assert masked("host run0007x not found", forms) == "host *** not found"


@pytest.fixture
def own_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this test remembers stays in it (the process's secrets mask every test's output)."""
    monkeypatch.setattr("core.redact._SECRETS", Secrets())


@pytest.mark.usefixtures("own_secrets")
def test_log_lines_keep_weirs_own_words() -> None:
    """With the compose file's password ``weir``, the logger's name, the message's own words and
    the config's names it carries (the store's schema ``weir``) stay; what else it carries (an
    error) has the password masked as a whole."""
    cfg = WeirConfig.model_validate({"store": {"url": "postgresql://weir:weir@db/app"}})
    remember_config(cfg)
    assert cfg.store is not None
    args = (cfg.store.schema_, "weirdo", ValueError("weir refused"))
    record = logging.LogRecord("weir", logging.INFO, __file__, 1, "weir: schema %s, %s: %s",
                               args, None)  # fmt: skip
    got = RedactingFormatter("%(name)s: %(message)s", tracebacks=False).format(record)
    assert got == "weir: weir: schema weir, weirdo: *** refused"


@pytest.mark.usefixtures("own_secrets")
def test_a_works_lease_line_keeps_its_name_when_a_password_is_the_same_word() -> None:
    """A source, connector and table all named ``orders`` with the password ``orders``: the
    lease lines read ``source:***`` (found by an outside tryout)."""
    from core.runtime.leases import _parts

    remember_config(WeirConfig.model_validate({"sources": [
        {"name": "orders", "kind": "postgres", "url": "postgresql://orders:orders@db/app",
         "tables": ["public.orders"]}]}))  # fmt: skip
    formatter = RedactingFormatter("%(message)s", tracebacks=False)
    for work, want in (("source:orders", "source:orders"),
                       ("connector:orders#1/3", "connector:orders#1/3")):  # fmt: skip
        record = logging.LogRecord("weir", logging.INFO, __file__, 1, "leases: %s%s%s is %s's now",
                                   (*_parts(work), "vm:1"), None)  # fmt: skip
        assert formatter.format(record) == f"leases: {want} is vm:1's now"


@pytest.mark.usefixtures("own_secrets")
def test_a_config_is_shown_masked_by_field_not_by_value() -> None:
    """A value that equals or holds a secret's letters is shown; a secret field is not."""
    remember(["secret"])
    dumped = {"name": "secretnats", "nats": {"namespace": "secret", "url": "nats://u:secret@h:1",
              "password": SECRET_MASK}, "kafka": {"librdkafka": {"sasl.password": "pw",
              "client.id": "secret"}}}  # fmt: skip
    assert shown(dumped) == {"name": "secretnats", "nats": {"namespace": "secret",
        "url": "nats://u:***@h:1", "password": SECRET_MASK}, "kafka": {"librdkafka": {
        "sasl.password": SECRET_MASK, "client.id": "secret"}}}  # fmt: skip


def test_data_in_a_config_is_shown_as_it_is_and_a_masked_list_round_trips() -> None:
    """A filter's or a step's text shaped like ``token=x`` is data (shown as it is; a URL's
    ``?token=`` is masked), and masks sent back where they were shown, inside lists too (a
    NATS cluster's URLs, found by an outside tryout), are the secrets again."""
    was = {"filters": [{"value": "token=plain"}], "webhook": {"url": "https://h/x?token=t0k"},
           "nats": {"url": ["nats://u:pw1@a:1", "nats://u:pw2@b:1"]}}  # fmt: skip
    seen = shown(was)
    assert seen == {"filters": [{"value": "token=plain"}],
                    "webhook": {"url": "https://h/x?token=***"},
                    "nats": {"url": ["nats://u:***@a:1", "nats://u:***@b:1"]}}  # fmt: skip
    assert unmasked(seen, seen, was) == was
    more = {**seen, "nats": {"url": [*seen["nats"]["url"], "nats://u:***@c:1"]}}
    assert unmasked(more, seen, was)["nats"]["url"][2] == "nats://u:***@c:1"  # never guessed
    assert masks_in(unmasked(more, seen, was)) == ("nats", "url", "2")
    urls, shown_urls = was["nats"]["url"], seen["nats"]["url"]
    assert unmasked(shown_urls[::-1], shown_urls, urls) == urls[::-1]  # moved
    assert unmasked(shown_urls[1:], shown_urls, urls) == urls[1:]  # one taken out
    assert unmasked(shown_urls[:1], shown_urls[0], urls[0]) == urls[:1]  # one made a list
    alike = ["nats://u:pw1@a:1", "nats://v:pw2@a:1"]
    assert shown(alike) == ["nats://u:***@a:1", "nats://v:***@a:1"]
    twins = ["nats://u:pw1@a:1", "nats://u:pw2@a:1"]  # shown alike: only by place
    assert unmasked(shown(twins)[::-1], shown(twins), twins) == twins


def test_a_url_password_that_starts_with_a_slash_and_holds_a_quote_is_a_secret() -> None:
    """``nats//user:/pw"@host`` (a scheme missing its colon, a password written raw): its
    password is hidden where a message quotes the value (``weir config validate`` printed it)."""
    value = 'nats//natsuser:/Ihd5Z"@127.0.0.1:4222'
    remember(secrets_of({"nats": {"url": value}}))
    said = redact(f"'{value}': expected nats://host:port; missing \"/Ihd5Z\"")
    assert "Ihd5Z" not in said, said


def test_an_http_credentials_token_is_masked_alone_too() -> None:
    """A receiver that answers 401 with the token of ``Authorization: Bearer …`` alone (found
    by an outside tryout) shows no secret; the scheme's word stays."""
    s = Secrets()
    s.remember(["Bearer BearerTok8765", "basic dXNlcjpwdw==", "X1"])
    said = s.redact('HTTP 401: {"token": "BearerTok8765", "basic": "dXNlcjpwdw=="} Bearer ok')
    assert said == 'HTTP 401: {"token": "***", "basic": "***"} Bearer ok'


def test_basic_auth_is_masked_decoded_too() -> None:
    """A receiver that decodes ``Authorization: Basic <b64>`` and answers with what it read
    (found by an outside tester): ``user:password`` and the password alone are masked."""
    s = Secrets()
    s.remember([f"Basic {base64.b64encode(b'apiuser:apiPass77').decode()}"])
    assert s.redact("bad credentials apiuser:apiPass77") == "bad credentials ***"
    assert s.redact("password apiPass77 refused") == "password *** refused"
    s.remember([f"Basic {base64.b64encode(b'u:pw').decode()}"])  # too short a piece alone
    assert s.redact("the pw of u") == "the pw of u"


def test_percent_encodings_that_keep_slashes_or_write_plus_for_spaces_are_masked() -> None:
    """``urllib.parse.quote``'s default keeps ``/``; ``quote_plus`` writes ``+`` for spaces."""
    s = Secrets()
    s.remember(["Bearer a/b+c=d e&f"])
    for echo in (
        "Bearer%20a/b%2Bc%3Dd%20e%26f",
        "Bearer+a%2Fb%2Bc%3Dd+e%26f",
        "a/b%2Bc%3Dd%20e%26f",
    ):
        assert s.redact(f"got {echo} !") == "got *** !", echo


def test_json_with_escaped_slashes_is_masked() -> None:
    """PHP's json_encode writes ``/`` as ``\\/``."""
    s = Secrets()
    s.remember(["Bearer Sl/ashTok/en99"])
    assert s.redact('{"auth": "Bearer Sl\\/ashTok\\/en99"}') == '{"auth": "***"}'


def test_a_secret_no_word_could_be_is_masked_in_any_case() -> None:
    """An echo lower- or upper-cased; a short or letters-only secret keeps its case: the
    password ``Weir`` leaves the word ``weir`` alone."""
    s = Secrets()
    s.remember(["Bearer MiXeDCaseTok99", "Weir", "Passwords"])
    assert s.redact("bearer mixedcasetok99 | MIXEDCASETOK99") == "*** | ***"
    assert s.redact("weir WEIR Weir passwords") == "weir WEIR *** passwords"
    assert masked("x mixedcasetok99", forms_of(["MiXeDCaseTok99"])) == "x ***"


def test_a_nats_urls_lone_user_info_is_a_token() -> None:
    """nats-py takes ``nats://TOKEN@host`` as a token: masked by shape, remembered as a
    secret; other schemes' lone user names are no secret."""
    url = "nats://UrlTok3nZZ9@127.0.0.1:54223"
    assert redact_urls(f"cannot reach {url}") == "cannot reach nats://***@127.0.0.1:54223"
    for scheme in ("tls", "ws", "wss"):
        assert redact_urls(f"{scheme}://tok@h:1") == f"{scheme}://***@h:1"
    assert redact_urls("postgresql://weir@h/app") == "postgresql://weir@h/app"
    assert shown({"url": [url]}) == {"url": ["nats://***@127.0.0.1:54223"]}
    assert "UrlTok3nZZ9" in " ".join(secrets_of({"nats": {"url": url}}))
    raw = {"connectors": [{"nats": {"url": url}}]}
    s = Secrets()
    s.remember(raw_secrets(raw, WeirConfig))
    assert s.redact("token UrlTok3nZZ9 refused") == "token *** refused"


def test_a_mask_left_inside_a_changed_value_is_found() -> None:
    """A URL whose masked query token is kept but whose path changed would store ``***``."""
    assert masks_in({"webhook": {"url": "http://h/y?token=***&api_key=***"}}) == (
        "webhook",
        "url",
    )
    assert masks_in({"nats": {"url": ["nats://***@h:1"]}}) == ("nats", "url", "0")
    assert masks_in({"u": "http://u:***@h/z"}) == ("u",)
    assert masks_in({"body": "*** stars", "url": "http://h/y?token=real"}) is None


def _words_config() -> None:
    """Passwords that are ordinary words and names (found by an outside tester): the NATS
    password ``weir``, the store's ``secret``; a connector named ``secret``, a source ``weir``."""
    remember_config(WeirConfig.model_validate({
        "store": {"url": "postgresql://u:secret@db/app"},
        "sources": [{"name": "weir", "kind": "postgres", "url": "postgresql://db/app",
                     "tables": ["public.t"]}],
        "connectors": [{"name": "secret", "type": "nats", "stream": "events",
                        "nats": {"url": "nats://n:weir@h:4222"}}],
    }))  # fmt: skip


@pytest.mark.usefixtures("own_secrets")
def test_weirs_own_errors_keep_their_words_and_the_names_they_carry() -> None:
    """An error Weir writes (:func:`said`) is its own words, the config's names in it (entry ids
    of them too) as they are, any other value masked by value; the CLI's and a log line's."""
    _words_config()
    e = LookupError(said("%s: no failed message %s", "secret", "weir:1"))
    assert first_line(e) == "secret: no failed message weir:1"
    e = RuntimeError(said("source %r: table %s does not exist", "weir", "public.nosuch"))
    assert first_line(e) == "source 'weir': table public.nosuch does not exist"
    e = RuntimeError(said("role %s may not make the store's schema %s (%s)", "nc", "weir",
                          "permission denied: password weir"))  # fmt: skip
    assert (
        first_line(e) == "role nc may not make the store's schema weir (permission denied: "
        "password ***)"
    )
    assert redact(said("%s", "weir")) == "weir" and redact("weir") == "***"
    record = logging.LogRecord("weir", logging.ERROR, __file__, 1, "api: cannot start: %s",
                               (_cannot("127.0.0.1", 1, OSError(98, "x")),), None)  # fmt: skip
    got = RedactingFormatter("%(message)s", tracebacks=False).format(record)
    assert "another weir run or another program may hold the port" in got, got


@pytest.mark.usefixtures("own_secrets")
def test_a_traceback_is_searched_in_its_messages_not_its_paths_or_code() -> None:
    """``-v``'s tracebacks: file paths and code lines are never secrets (``self.***.list_topics``,
    ``site-packages/confluent_kafka/***/__init__.py``); the messages in them are."""
    remember(["admin", "weir"])
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/confluent_kafka/admin/__init__.py", line 5, in weir\n'
        "    self.admin.list_topics(weir)\n"
        "    ^^^^^^^^^^^^^^^^^^^^^^\n"
        "KafkaException: admin refused weir\n"
    )
    assert redact_traceback(text) == text.replace("admin refused weir", "*** refused ***")
